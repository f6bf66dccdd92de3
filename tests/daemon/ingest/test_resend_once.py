"""The daemon stores each numbered shim message once, in the shim's order
(``batch``'s ``seq``): a resend after a crash is dropped as ``duplicate``, a
message that would skip one still to come waits for the shim's resend, and
a new daemon stores nothing of a run until it says hello again. On both
backends (SQLite and Postgres)."""

from __future__ import annotations

import os
from typing import Any

import orjson

from gpuprof.protocol import batch
from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import reads
from tests.daemon import helpers as h

BASE = 1_000_000_000


def _frame(seq: int, steps: range, lost: int = 0) -> bytes:
    events = [h.step("k", i, BASE) for i in steps]
    for ev in events:
        del ev["v"], ev["run_key"]
    return orjson.dumps(batch("k", events, seq, lost))


def _daemon(store: Any) -> tuple[RunService, Ingest]:
    """The run service and real ingest of one daemon on *store*."""
    runs = RunService(
        store,
        RunRegistry(),
        InsightsRunner(store, "db", None),
        [],
        pid_alive=lambda pid, _wall: True,
    )
    return runs, Ingest(None, runs, store, store.drops)  # type: ignore[arg-type]


async def _steps(store: Any) -> list[int]:
    await store.flush()
    rows = await store.fetchall("SELECT step FROM steps ORDER BY step")
    return [r[0] for r in rows]


async def test_each_message_is_stored_once_and_in_order(storage_url: str) -> None:
    drops = DropCounter()
    async with h.open_store(storage_url, drops) as store:
        runs, ingest = _daemon(store)
        live = await runs.hello(h.hello("k", os.getpid()))
        await ingest.handle(_frame(1, range(0, 3)))
        await ingest.handle(_frame(2, range(3, 5)))
        await ingest.handle(_frame(1, range(0, 3)))  # a resend of stored messages
        await ingest.handle(_frame(2, range(3, 5)))
        assert await _steps(store) == [0, 1, 2, 3, 4]
        assert drops.snapshot()["duplicate"] == 2
        assert await reads.stored_seq(store, live.run_id) == 2
        assert live.received == 5  # duplicates are not counted as received

        await ingest.handle(_frame(4, range(7, 9)))  # 3 still to come: not yet
        assert drops.snapshot()["resend_expected"] == 1
        assert await _steps(store) == [0, 1, 2, 3, 4]
        await ingest.handle(_frame(4, range(7, 9), lost=3))  # 3 given up by the shim
        assert await _steps(store) == [0, 1, 2, 3, 4, 7, 8]
        assert await reads.stored_seq(store, live.run_id) == 4


async def test_a_new_daemon_resumes_the_run_after_hello_and_stores_the_rest_once(
    storage_url: str,
) -> None:
    drops = DropCounter()
    async with h.open_store(storage_url, drops) as store:
        runs, ingest = _daemon(store)
        first = await runs.hello(h.hello("k", os.getpid()))
        await ingest.handle(_frame(1, range(0, 3)))
        await ingest.handle(_frame(2, range(3, 5)))
        await store.flush()
        # the daemon dies (kill -9): a new one on the same database
        runs, ingest = _daemon(store)
        await ingest.handle(_frame(3, range(5, 7)))  # before the run's hello: left to the resend
        assert drops.snapshot()["resend_expected"] == 1
        assert await _steps(store) == [0, 1, 2, 3, 4]
        live = await runs.hello(h.hello("k", os.getpid()))
        assert live.run_id == first.run_id  # the same run, no new row
        assert await reads.stored_seq(store, live.run_id) == 2  # the hello reply's ``acked``
        for seq, steps in ((2, range(3, 5)), (3, range(5, 7)), (4, range(7, 8))):
            await ingest.handle(_frame(seq, steps))
        assert await _steps(store) == list(range(8))
        assert live.received == 8  # the stored count resumed, the resend not counted twice
        await runs.bye(h.bye("k", sent=8))
        await store.flush()
        rows = await store.fetchall("SELECT COUNT(*), MIN(status) FROM runs")
        assert tuple(rows[0]) == (1, "finished")
