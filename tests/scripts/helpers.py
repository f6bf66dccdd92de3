"""What the tests of the prepared real-GPU checks (``scripts/gpu_check*.py``)
share: running a check as CI does, reading its report, importing it, and its
live mode's refusal on a machine without the GPU it needs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def run_script(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python scripts/NAME.py ARGS`` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def run_report(
    name: str, out: Path, *args: str, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    """Run the check with ``--out OUT``: its process, its report.json (which
    must be there) and *out*."""
    proc = run_script(name, *args, "--out", str(out), timeout=timeout)
    assert (out / "report.json").exists(), proc.stderr[-3000:]
    return proc, json.loads((out / "report.json").read_text()), out


def load_script(name: str) -> ModuleType:
    """Import ``scripts/NAME.py`` as module *name*, ``scripts/`` on ``sys.path``
    as when it runs (it imports its sibling ``gpu_check_common``)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def skip_with_cuda() -> None:
    """Skip unless torch is there and sees no CUDA (live mode would run)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: live mode would run")


def refused_live(name: str, tmp_path: Path, starts: str) -> str:
    """Live mode without its GPU: exit 2, one line on stderr starting with
    *starts*, no traceback, no output, no report; that line."""
    proc = run_script(name, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(starts)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "out").exists()
    return lines[0]
