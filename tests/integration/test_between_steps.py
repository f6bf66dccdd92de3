"""Host work between the steps of a DataLoader-fed loop, end to end: a real
torch loop sleeping every N steps → auto-started gpuprofd → the stored
summary's iteration holds the sleeps, ``host_work_between_steps`` names the
sleeping line, and the dashboard's step series and live rows say the same."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuprof.insights.base import steady
from gpuprof.protocol import OWN_TIME_PHASE
from gpuprof.window import between_steps_ns
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.reads import series
from gpuprofd.web.series import CHART_PHASES, RunClock, live_step

from .conftest import Node
from .scripts import BETWEEN_STEPS

STEPS, EVERY, SLEEP_S = 100, 5, 0.06


def test_a_loop_sleeping_every_n_steps_counts_the_sleeps_everywhere(node: Node):
    out = node.run_script(BETWEEN_STEPS, str(STEPS), str(EVERY), str(SLEEP_S))
    assert out.returncode == 0, out.stderr
    assert f"TRAINED {STEPS}" in out.stdout
    (run,) = node.query("SELECT id, summary FROM runs")
    steps = node.query("SELECT * FROM steps WHERE run_id = ? ORDER BY step", run["id"])
    assert len(steps) == STEPS and all(s["explicit"] for s in steps)  # a timed DataLoader

    # the iteration from the steps' own clocks: wait + step + the time between steps
    gaps, prev = [], None
    for s in steps:
        gaps.append(between_steps_ns(prev, s["t0_ns"], s["wait_ns"], s["eval_ns"], True))
        prev = s["t1_ns"]
    iters = [
        (s["t1_ns"] - s["t0_ns"] + s["wait_ns"] + g) / 1e6 for s, g in zip(steps, gaps, strict=True)
    ]
    # the summary leaves out profiled steps and gpuprof's own time in a step
    timed = [
        it - json.loads(s["phases"]).get(OWN_TIME_PHASE, 0) / 1e6
        for it, s in zip(iters, steps, strict=True)
        if not s["traced"]
    ]
    slept = [g for i, g in enumerate(gaps) if i % EVERY == 0 and i > 0]
    assert min(slept) >= SLEEP_S * 1e9  # each sleep sits in the gap after its step
    summary = json.loads(run["summary"])
    want = sum(steady(timed)) / len(steady(timed))
    assert summary["mean_iteration_ms"] == pytest.approx(want, abs=2e-3)
    gaps_ms = [g / 1e6 for g, s in zip(gaps, steps, strict=True) if not s["traced"]]
    assert sum(steady(gaps_ms)) / len(steady(gaps_ms)) >= SLEEP_S * 1e3 / EVERY * 0.9

    (found,) = [i for i in summary["insights"] if i["rule"] == "host_work_between_steps"]
    line = BETWEEN_STEPS[: BETWEEN_STEPS.index("# BETWEEN")].count("\n") + 1
    top = found["evidence"]["frames"][0]
    assert (top["line"], top["call"]) == (line, "time.sleep"), found
    assert f":{line}" in found["title"] and found["evidence"]["every_steps"] == EVERY

    live, by_step = asyncio.run(_dashboard_rows(node, run["id"]))
    clock = RunClock(wall_ns=0, mono_ns=0)
    for s, it, g, row, b in zip(steps, iters, gaps, live, by_step, strict=True):
        shown = live_step(row, clock)
        assert shown["step"] == s["step"]
        assert shown["step_ms"] == pytest.approx(it, abs=1e-4)  # as the wire rounds it
        assert shown["phases_ms"]["between_steps"] == pytest.approx(g / 1e6, abs=1e-4)
        assert sum(shown["phases_ms"][p] for p in CHART_PHASES) == pytest.approx(it, abs=1e-3)
        assert b["iter_mean"] / 1e6 == pytest.approx(it, abs=1e-6)


async def _dashboard_rows(node: Node, run_id: int) -> tuple[list, list]:
    async with open_reader(node.db) as db:
        live = await series.steps_after(db, run_id, -1, STEPS + 10)
        by_step = await series.step_index_buckets(db, run_id, 1)
    return live, by_step
