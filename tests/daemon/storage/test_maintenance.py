"""The periodic loop every maintenance pass runs in: a failing pass is logged
and counted, and the next one still runs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuprofd.storage.upkeep import PRUNE_INTERVAL_S, Retention, every
from gpuprofd.storage.writes import Store


async def test_a_failing_pass_is_logged_counted_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes: list[int] = []
    third = asyncio.Event()

    async def job() -> None:
        passes.append(len(passes))
        if len(passes) == 3:
            third.set()
        if len(passes) <= 2:
            raise OSError("disk hiccup")

    caplog.set_level(logging.ERROR, logger="gpuprofd.storage.upkeep.maintenance")
    loop = asyncio.create_task(every(0.001, job, "test-pass"))
    await asyncio.wait_for(third.wait(), timeout=5)
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    assert loop.cancelled()
    failures = [r.getMessage() for r in caplog.records]
    assert len(failures) == 2
    assert failures[0].startswith("test-pass failed (1 failed pass(es) so far)")
    assert failures[1].startswith("test-pass failed (2 failed pass(es) so far)")
    assert all(r.exc_info for r in caplog.records)  # with the traceback


def test_retention_runs_as_often_as_the_raw_window_if_that_is_shorter(tmp_path) -> None:
    store = Store(tmp_path / "g.db", None)  # type: ignore[arg-type] - never opened
    assert Retention(store, raw_window_s=5.0).interval_s == 5.0
    assert Retention(store, raw_window_s=3600.0).interval_s == PRUNE_INTERVAL_S
