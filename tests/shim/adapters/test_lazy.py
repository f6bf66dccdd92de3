"""The adapters are reached through ``gpuprof``'s facade, which imports them
(and their frameworks) only when one is looked up."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpuprof
from gpuprof.extras import install_hint

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"

FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate", "deepspeed", "torch")


PROBE = f"""
import sys
def seen():
    print(" ".join(m for m in {FRAMEWORKS!r} if m in sys.modules) or "-")
import gpuprof
seen()
gpuprof.wrap_deepspeed_engine
seen()
gpuprof.HFTrainerCallback
seen()
gpuprof.LightningCallback
seen()
"""


def test_frameworks_are_imported_only_with_their_adapter():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    after_import, after_ds, after_hf, after_lightning = (
        line.split() for line in out.stdout.splitlines()
    )
    assert after_import == ["-"]
    assert after_ds == ["-"]  # the wrapper uses the engine's interface, not deepspeed
    assert "transformers" in after_hf and "lightning" not in after_hf
    assert "lightning" in after_lightning


def test_facade_names():
    from gpuprof_shim.adapters.deepspeed import wrap_deepspeed_engine
    from gpuprof_shim.adapters.hf import HFTrainerCallback
    from gpuprof_shim.adapters.lightning import LightningCallback

    assert gpuprof.LightningCallback is LightningCallback
    assert gpuprof.HFTrainerCallback is HFTrainerCallback
    assert gpuprof.wrap_deepspeed_engine is wrap_deepspeed_engine
    assert {"LightningCallback", "HFTrainerCallback", "wrap_deepspeed_engine"} <= set(dir(gpuprof))
    with pytest.raises(AttributeError, match="no_such_adapter"):
        gpuprof.no_such_adapter  # noqa: B018


#: A Python with Lightning and transformers "not installed": ``import name``
#: raises ImportError for each name set to None in sys.modules.
BLOCKED = ("lightning", "pytorch_lightning", "transformers", "accelerate")

MISSING = f"""
import sys
for name in {BLOCKED!r}:
    sys.modules[name] = None
import inspect, json, pydoc
import gpuprof
from gpuprof import *
out = {{"help": pydoc.render_doc(gpuprof, renderer=pydoc.plaintext)}}
out["members"] = [name for name, _ in inspect.getmembers(gpuprof)]
for adapter in ("HFTrainerCallback", "LightningCallback"):
    cls = globals()[adapter]
    out[adapter] = {{"hasattr": hasattr(gpuprof, adapter), "doc": inspect.getdoc(cls)}}
    try:
        cls("run")
    except ImportError as exc:
        out[adapter]["error"] = str(exc)
        out[adapter]["cause"] = type(exc.__cause__).__name__
print(json.dumps(out))
"""


def test_without_the_frameworks_the_names_resolve_and_making_one_names_the_extra():
    done = subprocess.run(
        [sys.executable, "-c", MISSING], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(done.stdout)
    assert "class HFTrainerCallback" in out["help"] and "class LightningCallback" in out["help"]
    assert {"HFTrainerCallback", "LightningCallback", "Profiler"} <= set(out["members"])
    for adapter, framework, extra in (
        ("HFTrainerCallback", "Hugging Face transformers", "hf"),
        ("LightningCallback", "PyTorch Lightning", "lightning"),
    ):
        assert out[adapter] == {
            "hasattr": True,
            "doc": inspect.getdoc(getattr(gpuprof, adapter)),  # the real one, from here
            "error": f"gpuprof.{adapter} needs {framework}: {install_hint(extra)}",
            "cause": "ModuleNotFoundError",
        }
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert {"hf", "lightning"} <= set(extras)
