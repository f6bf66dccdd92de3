"""The adapters are reached through ``gpuprof``'s facade, which imports them
(and their frameworks) only when one is looked up."""

from __future__ import annotations

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


MISSING = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` now raises ImportError, as when not installed
import gpuprof
try:
    getattr(gpuprof, {adapter!r})
except ImportError as exc:
    print(exc)
else:
    print("imported")
"""


@pytest.mark.parametrize(
    ("adapter", "blocked", "extra"),
    [
        ("HFTrainerCallback", ("transformers",), "hf"),
        ("LightningCallback", ("lightning", "pytorch_lightning"), "lightning"),
    ],
)
def test_adapter_without_its_framework_names_the_extra(adapter, blocked, extra):
    script = MISSING.format(blocked=blocked, adapter=adapter)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().endswith(": " + install_hint(extra)), out.stdout
    assert out.stdout.startswith(f"gpuprof.{adapter} needs ")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert extra in extras
