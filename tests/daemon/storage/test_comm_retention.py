"""Retention of per-bucket comm rows (gpuprofd.storage.upkeep.commprune): each run keeps
its last COMM_STEPS_KEPT steps' bucket rows and every Nth step's, deletes
the rest in bounded passes through the store's writer; through a real
gpuprofd too (a running run's recent rows are never deleted)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import orjson
import pytest

from gpuprofd.core.counters import DropCounter
from gpuprofd.storage import reads, schema
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.upkeep import commprune
from gpuprofd.storage.writes import Store
from tests.daemon import helpers as h
from tests.gpuprof.insights.group_fixtures import N_BUCKETS, group_steps

MS = 1_000_000


def _db(tmp_path: Path, runs: dict[int, tuple[str, int, int]], name: str = "c.db") -> Path:
    """A database with *runs*: id -> (status, steps, buckets per step); every
    step has its row and its bucket rows."""
    db = tmp_path / name
    schema.prepare(db)
    conn = sqlite3.connect(db)
    for run_id, (status, n_steps, n_buckets) in runs.items():
        conn.execute(
            "INSERT INTO runs (id, run_key, run_name, status, options) VALUES (?, ?, 'r', ?, '{}')",
            (run_id, f"k{run_id}", status),
        )
        _add_steps(conn, run_id, range(n_steps), n_buckets)
    conn.commit()
    conn.close()
    return db


def _add_steps(conn: sqlite3.Connection, run_id: int, steps: range, n_buckets: int) -> None:
    conn.executemany(
        "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases) "
        "VALUES (?, ?, ?, ?, 0, 0, 1, ?)",
        [(run_id, i, i * 10 * MS, i * 10 * MS + 9 * MS, '{"comm": 1000}') for i in steps],
    )
    h.insert_buckets(
        conn,
        [
            (run_id, i, b, i * 10 * MS + b, i * 10 * MS + b + 5, 100)
            for i in steps
            for b in range(n_buckets)
        ],
    )


def _kept(db: Path, run_id: int) -> dict[int, int]:
    """step -> its bucket rows left."""
    rows = h.query(
        db, "SELECT step, SUM(buckets) FROM comm_steps WHERE run_id = ? GROUP BY step", (run_id,)
    )
    return {r[0]: r[1] for r in rows}


def _expected(n_steps: int, kept: int, every: int, n_buckets: int) -> dict[int, int]:
    latest = n_steps - 1
    return {s: n_buckets for s in range(n_steps) if s > latest - kept or s % every == 0}


async def _store(db: Path) -> Store:
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    return store


async def test_each_run_keeps_exactly_its_recent_steps_and_every_nth(tmp_path: Path) -> None:
    db = _db(tmp_path, {1: ("finished", 500, 4), 2: ("running", 300, 3), 3: ("finished", 40, 2)})
    store = await _store(db)
    try:
        pruner = commprune.CommPruner(steps_kept=50, keep_every=10)
        assert await pruner.prune_round(store) >= 2
        assert _kept(db, 1) == _expected(500, 50, 10, 4)
        assert _kept(db, 2) == _expected(300, 50, 10, 3)
        assert _kept(db, 3) == _expected(40, 50, 10, 2)  # shorter than the window: all kept
        assert len(_kept(db, 1)) == 50 + 45  # steps 450-499, and 0, 10, ..., 440
        # the steps themselves (their exposed comm) are all kept
        assert h.query(db, "SELECT COUNT(*) FROM steps")[0][0] == 840
        assert await pruner.prune_round(store) == 0  # nothing left
        # a new daemon (no memory of the progress) finds nothing to delete either
        again = commprune.CommPruner(steps_kept=50, keep_every=10)
        await again.prune_round(store)
        assert _kept(db, 1) == _expected(500, 50, 10, 4)
    finally:
        await store.close()


async def test_a_running_run_loses_only_what_leaves_its_window(tmp_path: Path) -> None:
    db = _db(tmp_path, {1: ("running", 120, 4)})
    store = await _store(db)
    try:
        pruner = commprune.CommPruner(steps_kept=30, keep_every=25)
        await pruner.prune_round(store)
        assert _kept(db, 1) == _expected(120, 30, 25, 4)
        conn = sqlite3.connect(db)
        _add_steps(conn, 1, range(120, 200), 4)  # the run goes on
        conn.commit()
        conn.close()
        await pruner.prune_round(store)
        assert _kept(db, 1) == _expected(200, 30, 25, 4)
        assert set(range(170, 200)) <= set(_kept(db, 1))
    finally:
        await store.close()


async def test_a_huge_run_is_pruned_in_bounded_passes(tmp_path: Path) -> None:
    n_steps, n_buckets, max_rows = 3000, 20, 250  # max_rows: step rows
    db = _db(tmp_path, {1: ("finished", n_steps, n_buckets)})
    store = await _store(db)
    try:
        pruner = commprune.CommPruner(steps_kept=200, keep_every=100, max_rows=max_rows)
        total = n_steps
        prunable = total - len(_expected(n_steps, 200, 100, n_buckets))
        deleted = []
        while await pruner.prune_pass(store):
            now = h.query(db, "SELECT COUNT(*) FROM comm_steps")[0][0]
            deleted.append(total - now)
            total = now
            # the window is never touched mid-way
            assert all(_kept(db, 1).get(s) == n_buckets for s in range(2800, 3000))
        assert sum(deleted) == prunable
        assert max(deleted) <= max_rows
        assert len(deleted) - 1 <= prunable // (max_rows - 2) + 1
        assert len(deleted) >= prunable // max_rows
        assert _kept(db, 1) == _expected(n_steps, 200, 100, n_buckets)
    finally:
        await store.close()
    # a round stops after max_passes; the next takes the rest
    db2 = _db(tmp_path, {1: ("finished", n_steps, n_buckets)}, name="two.db")
    store = await _store(db2)
    try:
        pruner = commprune.CommPruner(steps_kept=200, keep_every=100, max_rows=max_rows)
        assert await pruner.prune_round(store, max_passes=3) == 3
        left = h.query(db2, "SELECT COUNT(*) FROM comm_steps")[0][0]
        assert left >= n_steps - 3 * max_rows
        assert await pruner.prune_round(store) > 0
        assert _kept(db2, 1) == _expected(n_steps, 200, 100, n_buckets)
    finally:
        await store.close()


def test_the_group_window_survives_pruning(tmp_path: Path) -> None:
    """The default window holds the group rules' GROUP_STEPS_MAX steps."""
    assert commprune.COMM_STEPS_KEPT >= reads.GROUP_STEPS_MAX


def test_the_daemon_prunes_a_running_run_and_keeps_its_window(tmp_path: Path) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = h.Daemons(tmp_path)
    db = tmp_path / "d.db"
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv("GPUPROF_NVML", raising=False)
            _, client = daemons.start_ready(
                sock_dir,
                db,
                "--raw-window",
                "1",
                "--comm-steps-kept",
                "20",
                "--comm-keep-every",
                "7",
            )
            steps = group_steps(1, n_steps=130)[0]
            assert client.request(h.hello("r", os.getpid(), run_name="ddp"))["ok"]
            for s in steps[:100]:
                client.push({"v": 1, "type": "step", "run_key": "r", **s})
            (run_id,) = h.query(db, "SELECT id FROM runs WHERE run_key = 'r'")[0]
            want = _expected(100, 20, 7, N_BUCKETS)
            h.poll_db(db, "SELECT SUM(buckets) FROM comm_steps", (), sum(want.values()))
            assert _kept(db, run_id) == want
            assert h.query(db, "SELECT status FROM runs")[0][0] == "running"
            for s in steps[100:]:
                client.push({"v": 1, "type": "step", "run_key": "r", **s})
            want = _expected(130, 20, 7, N_BUCKETS)
            h.poll_db(db, "SELECT SUM(buckets) FROM comm_steps", (), sum(want.values()))
            assert _kept(db, run_id) == want
            reply = client.request(h.bye("r", sent=130))
            assert reply is not None and reply["ok"]
            comm = reply["summary"]["comm"]
            assert comm["buckets_per_step"] == N_BUCKETS  # a mean over the kept steps
            assert comm["median_exposed_ms"] > 0  # every step's, from steps.phases
            (summary,) = h.query(db, "SELECT summary FROM runs")[0]
            assert orjson.loads(summary)["steps"] == 130
    finally:
        daemons.kill_all()
        shutil.rmtree(sock_dir, ignore_errors=True)


async def test_the_group_rules_window_is_there_after_pruning(tmp_path: Path) -> None:
    """Ranks of 5,000 steps pruned with the defaults: the group context still
    has the last GROUP_STEPS_MAX common steps, bucket timings over the last
    GROUP_BUCKET_STEPS. A rank lost early is compared on the steps it has;
    the other rank kept only every Nth step's buckets there."""
    runs = {
        1: ("finished", 5000, 3),
        2: ("finished", 5000, 3),
        3: ("finished", 5000, 3),
        4: ("lost", 250, 3),
    }
    db = _db(tmp_path, runs)
    conn = sqlite3.connect(db)
    conn.executemany(
        "UPDATE runs SET group_id = ?, rank = ?, host = 'h' WHERE id = ?",
        [("long", 0, 1), ("long", 1, 2), ("short", 0, 3), ("short", 1, 4)],
    )
    conn.commit()
    conn.close()
    store = await _store(db)
    try:
        await commprune.CommPruner().prune_round(store)
    finally:
        await store.close()
    assert len(_kept(db, 1)) == commprune.COMM_STEPS_KEPT + 3000 // 100
    async with open_reader(db) as ro:
        long = await reads.group_context(ro, "long")
        short = await reads.group_context(ro, "short")
    assert [len(r.step_ms) for r in long.ranks] == [reads.GROUP_STEPS_MAX] * 2
    assert [len(r.bucket_start_ns) for r in long.ranks] == [reads.GROUP_BUCKET_STEPS] * 2
    assert [len(r.step_ms) for r in short.ranks] == [250, 250]
    # buckets of steps 150-249 on both ranks: rank 0 kept step 200's only
    assert [len(r.bucket_start_ns) for r in short.ranks] == [1, 1]
