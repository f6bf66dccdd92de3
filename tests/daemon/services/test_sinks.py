"""Samplers → store: rollup rows wait out a full store queue instead of being
dropped, and a full backlog counts what it loses."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuprofd.core.counters import DropCounter
from gpuprofd.sampling.rollup import ROLLUP_COLUMNS, SecondRollups, insert_params
from gpuprofd.services.sinks import SampleSinks
from gpuprofd.storage.writes import Store


def _sinks(tmp_path: Path, queue_size: int, backlog_rows: int = 100) -> SampleSinks:
    store = Store(tmp_path / "g.db", DropCounter(), queue_size=queue_size)  # never opened
    return SampleSinks(store, store.drops, SecondRollups(), backlog_rows=backlog_rows)


def _row(sec: int) -> tuple[object, ...]:
    """A rollup row (ROLLUP_COLUMNS order) of second *sec*."""
    rest = [None] * (len(ROLLUP_COLUMNS) - 3)
    return (sec, "GPU-0", 1, *rest)


def _queued(op: object) -> tuple[object, ...]:
    """The rollup row a queued store op inserts (its gpu_seconds part)."""
    return op.parts[1].rows[0]  # type: ignore[attr-defined]


def test_rollup_rows_wait_in_a_backlog_while_the_store_queue_is_full(tmp_path: Path):
    s = _sinks(tmp_path, queue_size=2)
    a, b, c, d = (_row(i) for i in range(4))
    s.store_rollups([a, b, c])
    assert s.store.queue.qsize() == 2 and list(s.backlog) == [c]
    assert s.drops.snapshot() == {}  # waiting, not dropped
    s.store.queue.get_nowait()
    s.store_rollups([d])  # room for one: the oldest goes first
    got = [_queued(s.store.queue.get_nowait()) for _ in range(2)]
    assert got == [insert_params(b), insert_params(c)]
    assert list(s.backlog) == [d]


def test_a_full_backlog_counts_what_it_loses(tmp_path: Path):
    s = _sinks(tmp_path, queue_size=1, backlog_rows=2)
    rows = [_row(i) for i in range(4)]
    s.store_rollups(rows)
    assert list(s.backlog) == rows[2:]
    assert _queued(s.store.queue.get_nowait()) == insert_params(rows[0])
    assert s.drops.snapshot() == {"rollup_backlog_full": 1}


async def test_drain_waits_for_room_until_the_backlog_is_stored(tmp_path: Path):
    s = _sinks(tmp_path, queue_size=1)
    rows = [_row(i) for i in range(3)]
    s.store_rollups(rows)
    got: list[object] = []

    async def writer() -> None:  # stands in for the store's writer task
        while len(got) < 3:
            got.append(_queued(await s.store.queue.get()))

    w = asyncio.create_task(writer())
    await asyncio.wait_for(s.drain(), timeout=5)
    await asyncio.wait_for(w, timeout=5)
    assert got == [insert_params(r) for r in rows] and not s.backlog
