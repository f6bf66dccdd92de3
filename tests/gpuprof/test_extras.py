"""A missing extra's hint is a command that works as written: gpuprof is
installed from its checkout (``gpuprof`` on PyPI is another project)."""

from __future__ import annotations

import shlex
from pathlib import Path

import gpuprof
from gpuprof.extras import checkout_root, install_hint

ROOT = Path(__file__).resolve().parents[2]


def make_checkout(tmp_path: Path, pyproject: str | None) -> Path:
    package = tmp_path / "my checkout" / "gpuprof"
    package.mkdir(parents=True)
    if pyproject is not None:
        (package.parent / "pyproject.toml").write_text(pyproject)
    return package


def test_the_hint_names_the_checkout_gpuprof_runs_from():
    assert Path(gpuprof.__file__).resolve().parent.parent == ROOT
    assert checkout_root() == ROOT
    argv = shlex.split(install_hint("hf"))
    assert argv == ["pip", "install", "-e", f"{ROOT}[hf]"]
    assert "gpuprof[" not in install_hint("hf")


def test_a_checkout_path_with_spaces_and_quotes_stays_one_argument(tmp_path):
    package = make_checkout(tmp_path, '[project]\nname = "gpuprof"\nversion = "0.1.0"\n')
    hint = install_hint("lightning", package)
    assert hint.startswith("pip install -e '")
    assert shlex.split(hint)[3] == f"{tmp_path}/my checkout[lightning]"


def test_without_a_gpuprof_checkout_the_hint_says_where_to_run_it(tmp_path):
    other = '[project]\nname = "gpuprof-other"\n\n[tool.x]\nname = "gpuprof"\n'
    for pyproject in (None, other, "[tool.poetry]\nname = 'gpuprof'\n"):
        package = make_checkout(tmp_path / str(hash(pyproject)), pyproject)
        assert checkout_root(package) is None
        assert install_hint("wandb", package) == (
            "pip install -e '.[wandb]' in your gpuprof checkout"
        )
