"""Run lifecycle edge cases found by trying to break the daemon: containers,
replayed hellos, failing disks."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest import runservice
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService, UnknownRun
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import schema
from gpuprofd.storage.writes import Op, Store
from tests.daemon import helpers as h
from tests.daemon.helpers import query


@contextlib.asynccontextmanager
async def service(tmp_path: Path, alive: dict[int, bool]) -> AsyncIterator[RunService]:
    db = tmp_path / "e.db"
    schema.prepare(db)
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    runs = RunService(
        store,
        RunRegistry(),
        InsightsRunner(store, str(db), None),
        [],
        pid_alive=lambda pid, _wall: alive.get(pid, False),
    )
    try:
        yield runs
    finally:
        await store.close()


async def test_run_in_another_pid_namespace_is_not_lost_by_its_pid(tmp_path, monkeypatch):
    async with service(tmp_path, alive={}) as runs:  # no pid is alive on "this host"
        own = runs.pid_ns or "pid:[1]"
        foreign = await runs.hello(h.hello("c", 300, pid_ns="pid:[4026532999]"))
        local = await runs.hello(h.hello("l", 301, pid_ns=own))
        assert not foreign.local_pid and local.local_pid
        assert runs.registry.pids() == {local.run_id: 301}  # no CPU read of a stranger's pid
        assert await runs.check_lost() == [local.run_id]  # only the local pid is judged dead
        monkeypatch.setattr(runservice, "FOREIGN_SILENCE_S", 0.05)
        foreign.last_event_mono_ns = time.monotonic_ns() - 10**8
        assert await runs.check_lost() == [foreign.run_id]  # silent too long: lost
        assert (
            query(tmp_path / "e.db", "SELECT status FROM runs WHERE id = ?", (foreign.run_id,))[0][
                0
            ]
            == "lost"
        )


async def test_replayed_hello_cannot_revive_an_ended_run(tmp_path):
    async with service(tmp_path, alive={7: True}) as runs:
        live = await runs.hello(h.hello("k", 7))
        await runs.bye(h.bye("k", sent=0))
        with pytest.raises(UnknownRun, match="already ended"):
            await runs.hello(h.hello("k", 7))
        assert (
            query(tmp_path / "e.db", "SELECT status FROM runs WHERE id = ?", (live.run_id,))[0][0]
            == "finished"
        )


async def test_bye_that_fails_still_ends_the_live_run(tmp_path, monkeypatch):
    async with service(tmp_path, alive={7: True}) as runs:
        await runs.hello(h.hello("k", 7))

        async def broken_flush() -> None:
            raise OSError("database or disk is full")

        monkeypatch.setattr(runs.store, "flush", broken_flush)
        with pytest.raises(OSError, match="disk is full"):
            await runs.bye(h.bye("k", sent=0))
        assert runs.registry.live == {}  # not stuck "live" forever
        monkeypatch.undo()


async def test_a_run_whose_end_could_not_be_stored_ends_once_the_disk_takes_writes(
    tmp_path, monkeypatch
):
    db = tmp_path / "e.db"

    def row(run_id: int) -> tuple:
        return tuple(
            query(db, "SELECT status, summary IS NOT NULL FROM runs WHERE id = ?", (run_id,))[0]
        )

    async with service(tmp_path, alive={7: True}) as runs:
        live = await runs.hello(h.hello("k", 7))
        real_write = runs.store.write

        async def full_disk(sql, *args, **kw):
            if sql.startswith("UPDATE runs SET status"):
                raise sqlite3.OperationalError("database or disk is full")
            return await real_write(sql, *args, **kw)

        monkeypatch.setattr(runs.store, "write", full_disk)
        with pytest.raises(sqlite3.OperationalError):
            await runs.bye(h.bye("k", sent=0, status="failed"))
        assert runs.registry.live == {}  # not live: the daemon may still exit when idle
        with pytest.raises(sqlite3.OperationalError):
            await runs.retry_ends()  # the disk still full: kept for the next try
        assert row(live.run_id) == ("running", 0)
        monkeypatch.undo()
        assert await runs.retry_ends() == [live.run_id]
        assert row(live.run_id) == ("failed", 1)  # the bye's status, judged
        assert await runs.retry_ends() == []


async def test_events_the_database_refused_are_not_called_a_busy_daemon(tmp_path):
    async with service(tmp_path, alive={7: True}) as runs:
        live = await runs.hello(h.hello("k", 7))
        live.store_dropped += 2  # not queued: the daemon was busy
        refused = [Op("-- step", run_id=live.run_id) for _ in range(3)]
        runs.store._fail(
            refused, sqlite3.OperationalError("database or disk is full"), reason="store_error"
        )
        summary = await runs.bye(h.bye("k", sent=0))
    assert "2 events received but not stored (daemon busy)" in summary["notes"]
    refused_note = [n for n in summary["notes"] if n.startswith("3 events")]
    assert refused_note == [
        "3 events received but not stored: the database refused them "
        f"(writing {runs.store.where} failed: database or disk is full)"
    ]
    assert query(tmp_path / "e.db", "SELECT store_dropped_events FROM runs")[0][0] == 5


async def test_store_close_releases_connections_when_the_final_flush_fails(tmp_path):
    db = tmp_path / "c.db"
    schema.prepare(db)
    store = Store(db, DropCounter())
    await store.open()
    store.start()

    async def broken_flush() -> None:
        raise OSError("disk I/O error")

    store.flush = broken_flush  # type: ignore[method-assign]
    await store.close()  # must return, not raise or hang on aiosqlite's threads
    assert store._write is None and store._read is None and store._task is None


async def test_a_daemon_recovers_only_its_own_runs_from_a_shared_database(tmp_path):
    """Several daemons on one (Postgres) database: one starting up leaves
    another's live run alone, and still recovers runs of unknown owner."""
    db = tmp_path / "shared.db"
    schema.prepare(db)
    store = Store(db, DropCounter())
    await store.open()
    store.start()

    def service(owner: str | None) -> RunService:
        runs = InsightsRunner(store, str(db), None)
        return RunService(store, RunRegistry(), runs, [], pid_alive=lambda pid, w: False,
                          owner=owner)  # fmt: skip

    try:
        a = service("node-a:/run/gpuprof")
        live = await a.hello(h.hello("mine", 11))
        old = await service(None).hello(h.hello("legacy", 12))  # stored with no owner
        b = service("node-b:/run/gpuprof")
        await b.recover_at_startup()  # pid 11 is "gone" to b: yet not b's to judge
        rows = {r[0]: tuple(r[1:]) for r in query(db, "SELECT id, status, daemon FROM runs")}
        assert rows[live.run_id] == ("running", "node-a:/run/gpuprof")
        assert rows[old.run_id][0] == "lost"  # no owner: recovered as before
    finally:
        await store.close()
