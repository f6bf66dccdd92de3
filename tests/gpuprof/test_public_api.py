"""``gpuprof.profile``'s public signature: every option a typed keyword
with a default, documented, the same as the profiler's own; a misspelled
option names the closest valid one; ``import gpuprof`` stays light."""

from __future__ import annotations

import inspect
import pickle
import pydoc
import re
import subprocess
import sys

import pytest

import gpuprof
from gpuprof_shim.session import Profiler


def params(func: object) -> list[tuple[str, object, object, object]]:
    return [
        (p.name, p.kind, p.annotation, p.default)
        for p in inspect.signature(func).parameters.values()
    ]


def test_every_option_is_a_typed_keyword_with_a_default():
    first, *options = inspect.signature(gpuprof.profile).parameters.values()
    assert (first.name, first.kind, first.annotation) == (
        "run_name",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        "str",
    )
    assert len(options) >= 20
    for p in options:
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name
        assert p.annotation is not inspect.Parameter.empty, p.name
        assert p.default is not inspect.Parameter.empty, p.name
    named = {p.name: (p.annotation, p.default) for p in options}
    assert named["dashboard"] == ("bool", False)
    assert named["wandb"] == ("bool", False)
    assert named["webhook"] == ("str | None", None)
    assert named["webhook_format"] == ("Literal['slack', 'json']", "slack")
    assert named["step_source"] == ("Literal['optimizer', 'external']", "optimizer")
    assert named["dtype"] == ("torch.dtype | str | None", None)
    assert named["server"] == ("str | None", None)
    assert inspect.signature(gpuprof.profile).return_annotation == "Profiler"


def test_the_facade_and_the_profiler_take_the_same_options():
    assert params(gpuprof.Profiler) == params(gpuprof.profile)
    text = str(inspect.signature(gpuprof.Profiler))
    assert "clock" not in text and "<built-in" not in text


def test_dir_lists_the_public_names_only():
    public = [
        "HFTrainerCallback",
        "LightningCallback",
        "Profiler",
        "TransformerArch",
        "__version__",
        "profile",
        "wrap_deepspeed_engine",
    ]
    assert sorted(gpuprof.__all__) == public
    gpuprof.Profiler  # noqa: B018 - a lazy name, once looked up, is in globals() too
    assert dir(gpuprof) == public
    assert all(hasattr(gpuprof, name) for name in dir(gpuprof))


def test_the_docstring_lists_every_option_and_help_shows_them():
    doc = inspect.getdoc(gpuprof.profile) or ""
    args = doc.split("Args:\n", 1)[1].split("\n\nReturns:", 1)[0]
    documented = [line.split(":")[0].strip() for line in args.splitlines() if line[4:5] != " "]
    assert documented == list(inspect.signature(gpuprof.profile).parameters)
    text = pydoc.render_doc(gpuprof.profile, renderer=pydoc.plaintext)
    assert "trace_every_n_steps: 'int | None' = None" in text
    assert """webhook_format: "Literal['slack', 'json']" = 'slack'""" in text
    assert "gpuprof_shim" not in text


def option_paragraphs() -> dict[str, str]:
    """Each option's paragraph under ``Args:`` in ``help(gpuprof.profile)``."""
    doc = inspect.getdoc(gpuprof.profile) or ""
    args = doc.split("Args:\n", 1)[1].split("\n\nReturns:", 1)[0]
    out: dict[str, str] = {}
    for line in args.splitlines():
        if line[4:5] != " ":
            name, _, line = line.strip().partition(":")
            out[name] = ""
        out[name] += " " + line.strip()
    return out


#: How a paragraph states what an option costs: the word, a time, a slowdown.
_COST = re.compile(r"\bcosts?\b|\d ?(µs|ms|s|seconds)\b|\bwaits\b|\d×", re.I)


def test_every_option_says_its_default_and_its_cost():
    paragraphs = option_paragraphs()
    assert list(paragraphs) == list(inspect.signature(gpuprof.profile).parameters)
    del paragraphs["run_name"]  # the run's name, not an option
    no_default = [n for n, text in paragraphs.items() if "default" not in text.lower()]
    no_cost = [n for n, text in paragraphs.items() if not _COST.search(text)]
    assert (no_default, no_cost) == ([], [])


def test_profiler_is_public_with_its_own_docstring(tmp_path):
    assert gpuprof.Profiler is Profiler
    assert "Profiler" in gpuprof.__all__ and "Profiler" in dir(gpuprof)
    doc = inspect.getdoc(gpuprof.Profiler) or ""
    assert doc.startswith("One profiled run: what :func:`gpuprof.profile` returns")
    prof = gpuprof.profile("r", auto=False, autostart=False, socket_dir=tmp_path)
    assert isinstance(prof, gpuprof.Profiler) and prof.run_name == "r"


def test_profiler_presents_itself_as_gpuprof_profiler(tmp_path):
    assert gpuprof.Profiler.__module__ == "gpuprof"
    text = pydoc.render_doc(gpuprof.Profiler, renderer=pydoc.plaintext)
    assert text.splitlines()[0] == "Python Library Documentation: class Profiler in module gpuprof"
    assert "gpuprof_shim" not in text
    prof = gpuprof.profile("r", auto=False, autostart=False, socket_dir=tmp_path)
    assert repr(prof).startswith("<gpuprof.Profiler object at ")
    assert pickle.loads(pickle.dumps(gpuprof.Profiler)) is Profiler  # by its public name


@pytest.mark.parametrize("make", [gpuprof.profile, Profiler], ids=["profile", "Profiler"])
def test_a_misspelled_option_names_the_closest(make):
    with pytest.raises(TypeError) as err:
        make("r", trace_evry_n_steps=50)
    name = "gpuprof.profile" if make is gpuprof.profile else "gpuprof.Profiler"
    assert str(err.value) == (
        f"{name}() got an unexpected keyword argument 'trace_evry_n_steps'; "
        "did you mean 'trace_every_n_steps'?"
    )
    with pytest.raises(TypeError, match="'webhok'; did you mean 'webhook'"):
        make("r", webhok="http://x")
    with pytest.raises(TypeError, match=r"'zzz'; its options are auto, flops_per_step, dtype"):
        make("r", zzz=1)


def test_a_bad_server_fails_before_the_run_and_a_bad_environment_one_is_ignored(
    monkeypatch, caplog
):
    with pytest.raises(ValueError, match="server must be the team server's http"):
        gpuprof.profile("r", server="gpuprof.example:8000")
    monkeypatch.setenv("GPUPROF_SERVER", "ftp://nowhere")
    with caplog.at_level("WARNING", logger="gpuprof.shim"):
        prof = gpuprof.profile("r")
    assert prof.server is None and "GPUPROF_SERVER ignored" in caplog.text
    monkeypatch.setenv("GPUPROF_SERVER", "https://team.example:8000/")
    assert gpuprof.profile("r").server == "https://team.example:8000"
    assert gpuprof.profile("r", server="http://other:1").server == "http://other:1"


def test_bad_webhook_values_fail_before_the_run():
    with pytest.raises(ValueError, match="webhook_format must be 'slack' or 'json'"):
        gpuprof.profile("r", webhook="http://127.0.0.1:9/x", webhook_format="teams")
    with pytest.raises(ValueError, match="webhook must be an http:// or https:// URL"):
        gpuprof.profile("r", webhook="ftp://example.org/hook")


def test_import_and_signature_do_not_import_the_profiler():
    probe = (
        "import inspect, sys, gpuprof; inspect.signature(gpuprof.profile); "
        "print('gpuprof_shim' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "False"]
