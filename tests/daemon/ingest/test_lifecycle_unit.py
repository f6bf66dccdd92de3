"""Lifecycle ticks in-process, with an injected pid check and clock."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.lifecycle import Lifecycle
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage.writes import Store, runsdb
from tests.daemon import helpers as h
from tests.daemon.helpers import query


async def test_tick_refreshes_live_insights_loses_dead_runs_and_exits_when_idle(
    tmp_path: Path,
) -> None:
    db, drops = tmp_path / "l.db", DropCounter()
    async with h.open_store(str(db), drops) as store:
        await _scenario(store, drops, db)


async def _scenario(store: Store, drops: DropCounter, db: Path) -> None:
    alive = {101: True}
    runs = RunService(
        store,
        RunRegistry(),
        InsightsRunner(store, str(db), None),
        [],
        pid_alive=lambda pid, _wall: alive.get(pid, False),
    )
    live = await runs.hello(h.hello("u", 101))
    base = time.monotonic_ns()
    for i in range(20):
        store.submit_nowait(runsdb.step_op(live.run_id, h.step("u", i, base)))
    await store.flush()
    drops.add("not_json")
    now = [1000.0]
    stopped: list[bool] = []
    cycle = Lifecycle(
        runs,
        drops,
        idle_exit_s=30,
        last_activity=lambda: 990.0,
        request_stop=lambda: stopped.append(True),
        live_insights_s=0,
        clock=lambda: now[0],
    )

    await cycle.tick()
    await store.flush()
    rules = [r[0] for r in query(db, "SELECT rule FROM insights WHERE run_id = ?", (live.run_id,))]
    assert "dataloader_stall" in rules or "cpu_bound_dataloader" in rules
    assert query(db, "SELECT count FROM drops WHERE reason = 'not_json'")[0][0] == 1
    assert stopped == []  # a live run keeps the daemon up

    alive[101] = False
    now[0] = 1030.0
    await cycle.tick()
    assert query(db, "SELECT status FROM runs WHERE id = ?", (live.run_id,))[0][0] == "lost"
    assert stopped == [True]  # no live runs and idle for 40 s >= 30 s


async def test_live_passes_that_take_long_come_less_often(tmp_path: Path) -> None:
    """A pass taking 3 s (a run of a million steps) is followed by the next
    only after 3 s / LIVE_INSIGHTS_MAX_SHARE = 60 s, not 10 s; quick passes
    keep the 10 s interval."""
    from gpuprofd.ingest.lifecycle import LIVE_INSIGHTS_MAX_SHARE

    db, drops = tmp_path / "slow.db", DropCounter()
    async with h.open_store(str(db), drops) as store:
        runs = RunService(
            store, RunRegistry(), InsightsRunner(store, str(db), None), [],
            pid_alive=lambda pid, _wall: True,
        )  # fmt: skip
        await runs.hello(h.hello("u", 101))
        now = [1000.0]
        pass_s = [3.0]
        passes: list[float] = []

        async def live(run_id: int) -> list:
            passes.append(now[0])
            now[0] += pass_s[0]  # the pass's own time, on the injected clock
            return []

        runs.insights.live = live  # type: ignore[method-assign]
        cycle = Lifecycle(
            runs, drops, idle_exit_s=0, last_activity=lambda: now[0],
            request_stop=lambda: None, live_insights_s=10, clock=lambda: now[0],
        )  # fmt: skip
        for _ in range(200):  # ticks every second, 200 s of them
            await cycle.tick()
            now[0] += 1.0
            if now[0] >= 1130:
                pass_s[0] = 0.1  # the run's passes got quick again
    gaps = [b - a for a, b in zip(passes, passes[1:], strict=False)]
    slow_gap = 3.0 / LIVE_INSIGHTS_MAX_SHARE
    assert passes[0] == 1010.0  # the first pass after live_insights_s
    assert gaps[:2] == [slow_gap, slow_gap]  # 60 s from each 3 s pass's start
    # from 1130 the passes take 0.1 s: every 10 s again (the first tick after)
    assert passes[2] == 1130.0
    assert gaps[2:] == pytest.approx([10.1] * (len(passes) - 3))
    assert len(passes) >= 8
