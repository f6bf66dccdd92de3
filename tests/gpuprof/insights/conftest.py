from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprof.insights import RunContext

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "h200"


def make_ctx(step_ms, wait_ms=None, **kw) -> RunContext:
    """A context with the given per-step times (ms); everything else defaults."""
    step_ms = tuple(float(s) for s in step_ms)
    wait_ms = tuple(float(w) for w in (wait_ms if wait_ms is not None else [0.0] * len(step_ms)))
    kw.setdefault("run_name", "t")
    kw.setdefault("status", "finished")
    return RunContext(step_ms=step_ms, wait_ms=wait_ms, **kw)


@pytest.fixture(scope="session")
def h200_steps() -> dict:
    path = H200 / "steps.json"
    if not path.exists():
        pytest.fail(f"H200 fixture missing at {path}: tests/fixtures/ is part of the repository")
    return json.loads(path.read_text())
