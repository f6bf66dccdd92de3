"""high_step_variance on a recorded run: a real CPU-bound loop beside three
bursts of load (``fixtures/bursts_run.json``), replayed through the context
the daemon builds. The inputs are fixed, so the verdict is whatever the
host running the tests is doing."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from gpuprof.insights import build_context
from gpuprof.insights.base import RunContext
from gpuprof.insights.steps import high_step_variance

from .titles import overlapped

FIXTURE = Path(__file__).with_name("fixtures") / "bursts_run.json"


@cache
def _recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def _context(host_pct: list[float] | None = None) -> RunContext:
    """The recorded run's context; *host_pct* replaces the host samples' CPU %."""
    rec = _recorded()
    us = 1000
    run = {
        "run_name": "bursts",
        "status": "finished",
        "start_mono_ns": 0,
        "end_mono_ns": rec["end_us"] * us,
        "cpu_count": rec["cpu_count"],
        "options": {},
    }
    steps = [
        {"t0": t0 * us, "t1": (t0 + ms) * us, "wait": wait * us, "explicit": False, "micro": 1}
        | {"phases": {"forward": ms * us}}
        for t0, ms, wait in rec["steps"]
    ]
    pcts = host_pct or [pct for _, pct in rec["host"]]
    host = [
        {"mono_ns": t * us, "cpu_pct": pct, "cpu_count": rec["cpu_count"]}
        for (t, _), pct in zip(rec["host"], pcts, strict=True)
    ]
    own = [{"mono_ns": t * us, "cores": cores} for t, cores in rec["run_cpu"]]
    return build_context(run, steps, host, run_cpu=own)


def _named_bursts(title: str) -> list[tuple[int, int]]:
    """The recorded load bursts (first, last step) that the title names."""
    return overlapped([(a, b) for a, b, _, _ in _recorded()["bursts"]], title)


def test_the_three_bursts_are_named_and_tied_to_other_processes_cpu():
    found = high_step_variance(_context())
    assert found is not None
    bursts = [(a, b) for a, b, _, _ in _recorded()["bursts"]]
    assert _named_bursts(found.title) == bursts, found.title
    assert "coincide with other processes' CPU" in found.title, found.title
    assert "every" not in found.title and "periodic" not in found.detail
    assert found.evidence["period_steps"] is None
    # the bursts lost most of the time, with others on 1.5+ cores; under 0.6 elsewhere
    assert found.evidence["other_cores_slow"] >= 1.5 > 0.6 >= found.evidence["other_cores_rest"]


def test_the_same_steps_with_others_as_busy_throughout_name_the_bursts_without_the_tie():
    # other processes on 0.9 core all run long, in the bursts as outside them:
    # the host's samples set the slow steps apart in nothing
    rec = _recorded()
    own = {t: cores for t, cores in rec["run_cpu"]}
    flat = [100.0 * (own.get(t, 1.0) + 0.9) / rec["cpu_count"] for t, _ in rec["host"]]
    ctx = _context(flat)
    others = [o for o in ctx.step_other_cores if o is not None]
    assert len(others) > 0.8 * ctx.steps and all(0.85 < o < 0.95 for o in others)
    found = high_step_variance(ctx)
    assert found is not None
    assert "coincide" not in found.title and "every" not in found.title, found.title
    # the host had cores to spare during the bursts (others 0.9, the run 0.3):
    # not contended, so the loop's own causes are worth a look
    assert found.title.split("; ")[-1].startswith("slow in bursts at steps ")
    assert "busy with other processes" not in found.title
    assert len(_named_bursts(found.title)) == 3, found.title
    # others held most of a core on the slow steps: not called quiet
    assert "held little CPU" not in found.detail
