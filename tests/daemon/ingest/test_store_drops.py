"""Events gpuprofd received but could not store are the run's: counted per
run while it is live, stored with it at its end, shown by ``gpuprofctl runs``.
Steps wait for the writer (the socket buffers them); a kernels window too big
for the room left in the queue is what gets dropped here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from gpuprofd.core.counters import DropCounter
from gpuprofd.ctl import main
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import schema
from gpuprofd.storage.writes import Store
from tests.daemon import helpers as h
from tests.daemon.helpers import query


def _kernels(t0: int, rows: int) -> dict:
    table = [[f"k{j}", "kernel", "compute", 1, 10, 10, 0.0] for j in range(rows)]
    return {
        "v": 1,
        "type": "kernels",
        "run_key": "k",
        "t0": t0,
        "t1": t0 + 1000,
        "source": "snapshot",
        "steps": [1],
        "rows": table,
    }


@contextlib.asynccontextmanager
async def _node(db: Path, **store_kw: int) -> AsyncIterator[tuple[Store, RunService, Ingest]]:
    """A store (writing), the run service and real ingest, frames handed in."""
    schema.prepare(db)
    store = Store(db, DropCounter(), **store_kw)
    await store.open()
    store.start()
    runs = RunService(
        store,
        RunRegistry(),
        InsightsRunner(store, str(db), None),
        [],
        pid_alive=lambda pid, _wall: True,
    )
    try:
        yield store, runs, Ingest(None, runs, store, store.drops)  # type: ignore[arg-type]
    finally:
        await runs.close_tails()
        await store.close()


async def _busy_run(db: Path) -> dict:
    """A run through real ingest into a store whose writer stalls with 20
    places in its queue: 12 steps queue, then a 30-row kernels window finds
    no room for its 31 inserts; 3 events were lost in the training process."""
    async with _node(db, queue_size=20) as (store, runs, ingest):
        drops = store.drops
        live = await runs.hello(h.hello("k", os.getpid(), run_name="busy"))
        await store.flush()
        store._task.cancel()  # a writer that cannot keep up
        store._task = None
        base = 1_000_000_000
        for i in range(12):
            await ingest.handle(orjson.dumps(h.step("k", i, base)))
        await ingest.handle(orjson.dumps(_kernels(5, 30)))
        assert live.store_dropped == 1 and drops.snapshot()["store_backpressure"] == 1
        store.start()
        return await runs.bye(h.bye("k", sent=13, dropped=3))


def test_a_full_store_queue_counts_against_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "d.db"
    summary = asyncio.run(_busy_run(db))
    assert "1 events received but not stored (daemon busy)" in summary["notes"]
    (row,) = query(db, "SELECT dropped_events, store_dropped_events FROM runs")
    assert tuple(row) == (3, 1)
    assert query(db, "SELECT COUNT(*) FROM steps")[0][0] == 12
    assert query(db, "SELECT COUNT(*) FROM kernel_windows")[0][0] == 0
    assert main(["runs", str(db), "--format", "json"]) == 0
    (run,) = orjson.loads(capsys.readouterr().out)
    assert (run["dropped_events"], run["store_dropped_events"]) == (3, 1)
    assert main(["runs", str(db)]) == 0
    header, line = capsys.readouterr().out.splitlines()[:2]
    assert header.split()[-1] == "DROPPED" and line.split()[-1] == "4"


async def _unwritable_steps(db: Path) -> dict:
    """A run whose 4 steps the database refuses (a trigger raising what a
    damaged file raises): its summary at the bye."""
    async with _node(db) as (store, runs, ingest):
        await runs.hello(h.hello("k", os.getpid(), run_name="damaged"))
        await store.flush()
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute(
                "CREATE TRIGGER broken BEFORE INSERT ON steps "
                "BEGIN SELECT RAISE(ABORT, 'database disk image is malformed'); END"
            )
            conn.commit()
        for i in range(4):
            await ingest.handle(orjson.dumps(h.step("k", i, 1_000_000_000)))
        return await runs.bye(h.bye("k", sent=4))


def test_events_the_database_refused_say_its_error_not_a_busy_daemon(tmp_path: Path) -> None:
    db = tmp_path / "damaged.db"
    summary = asyncio.run(_unwritable_steps(db))
    assert (
        f"4 events received but not stored: the database refused them (writing {db} "
        "failed: database disk image is malformed)" in summary["notes"]
    ), summary["notes"]
    assert query(db, "SELECT store_dropped_events FROM runs")[0][0] == 4


async def _late_events(db: Path, monkeypatch: pytest.MonkeyPatch, rest: bool) -> dict:
    """A bye that arrives while 5 of the run's 10 steps are still on their
    way; with *rest*, they arrive after the bye has answered."""
    from gpuprofd.ingest import runservice

    monkeypatch.setattr(runservice, "BYE_WAIT_S", 0.1)
    monkeypatch.setattr(runservice, "TAIL_IDLE_S", 0.5)
    async with _node(db) as (store, runs, ingest):
        await runs.hello(h.hello("k", os.getpid(), run_name="late"))
        base = 1_000_000_000
        for i in range(5):
            await ingest.handle(orjson.dumps(h.step("k", i, base)))
        summary = await runs.bye(h.bye("k", sent=10))
        if rest:
            for i in range(5, 10):
                await ingest.handle(orjson.dumps(h.step("k", i, base)))
        await asyncio.gather(*runs._tails)
        await ingest.handle(orjson.dumps(h.step("k", 10, base)))  # after the tail: refused
    return {"summary": summary, "drops": store.drops.snapshot()}


def test_events_late_for_the_bye_are_stored_and_the_run_judged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "late.db"
    got = asyncio.run(_late_events(db, monkeypatch, rest=True))
    assert any("5 events were still on their way" in n for n in got["summary"]["notes"])
    assert query(db, "SELECT COUNT(*) FROM steps")[0][0] == 10
    (run,) = query(db, "SELECT received_events, summary FROM runs")
    assert run[0] == 10
    stored = orjson.loads(run[1])
    assert stored["steps"] == 10 and not any("on their way" in n for n in stored["notes"])
    assert got["drops"] == {"run_ended": 1}


def test_events_that_never_come_are_said_lost_once_the_tail_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "lost.db"
    asyncio.run(_late_events(db, monkeypatch, rest=False))
    (run,) = query(db, "SELECT received_events, summary FROM runs")
    assert run[0] == 5
    assert "5 events sent but not received" in orjson.loads(run[1])["notes"]


def _stacks(source: str, func: str) -> dict:
    row = ["/work/train.py", 21, func, "sleep", 0, 7]
    return {"v": 1, "type": "stacks", "run_key": "k", "source": source, "rows": [row]}


async def _worker_stacks_after_the_end(db: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    from gpuprofd.ingest import registry

    async with _node(db) as (store, runs, ingest):
        await runs.hello(h.hello("k", os.getpid(), run_name="w"))
        await runs.bye(h.bye("k", sent=0))
        # a DataLoader worker exiting after the loop: its last counts come late
        await ingest.handle(orjson.dumps(_stacks("loader", "__getitem__")))
        await ingest.handle(orjson.dumps(_stacks("main", "train")))  # the loop's: dropped
        await ingest.handle(orjson.dumps(h.step("k", 0, 1_000_000_000)))  # dropped
        monkeypatch.setattr(registry, "LATE_LOADER_STACKS_S", 0.0)
        await ingest.handle(orjson.dumps(_stacks("loader", "too_late")))  # past the while
        await store.flush()
    return store.drops.snapshot()


def test_a_workers_last_stack_counts_after_the_runs_end_are_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "w.db"
    drops = asyncio.run(_worker_stacks_after_the_end(db, monkeypatch))
    stored = query(db, "SELECT source, func, samples FROM stack_samples")
    assert [tuple(r) for r in stored] == [("loader", "__getitem__", 7)]
    assert drops == {"run_ended": 3}
