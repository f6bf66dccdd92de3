"""Samplers → store: rollup rows wait out a full store queue instead of being
dropped, and a full backlog counts what it loses."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuprofd.core.counters import DropCounter
from gpuprofd.sampling.rollup import SecondRollups
from gpuprofd.services.sinks import SampleSinks
from gpuprofd.storage.writes import Store


def _sinks(tmp_path: Path, queue_size: int, backlog_rows: int = 100) -> SampleSinks:
    store = Store(tmp_path / "g.db", DropCounter(), queue_size=queue_size)  # never opened
    return SampleSinks(store, store.drops, SecondRollups(), backlog_rows=backlog_rows)


def test_rollup_rows_wait_in_a_backlog_while_the_store_queue_is_full(tmp_path: Path):
    s = _sinks(tmp_path, queue_size=2)
    s.store_rollups([("a",), ("b",), ("c",)])
    assert s.store.queue.qsize() == 2 and list(s.backlog) == [("c",)]
    assert s.drops.snapshot() == {}  # waiting, not dropped
    s.store.queue.get_nowait()
    s.store_rollups([("d",)])  # room for one: the oldest goes first
    assert [s.store.queue.get_nowait().params for _ in range(2)] == [("b",), ("c",)]
    assert list(s.backlog) == [("d",)]


def test_a_full_backlog_counts_what_it_loses(tmp_path: Path):
    s = _sinks(tmp_path, queue_size=1, backlog_rows=2)
    s.store_rollups([(1,), (2,), (3,), (4,)])
    assert list(s.backlog) == [(3,), (4,)]
    assert s.store.queue.get_nowait().params == (1,)
    assert s.drops.snapshot() == {"rollup_backlog_full": 1}


async def test_drain_waits_for_room_until_the_backlog_is_stored(tmp_path: Path):
    s = _sinks(tmp_path, queue_size=1)
    s.store_rollups([(1,), (2,), (3,)])
    got: list[object] = []

    async def writer() -> None:  # stands in for the store's writer task
        while len(got) < 3:
            got.append((await s.store.queue.get()).params)

    w = asyncio.create_task(writer())
    await asyncio.wait_for(s.drain(), timeout=5)
    await asyncio.wait_for(w, timeout=5)
    assert got == [(1,), (2,), (3,)] and not s.backlog
