"""The store's single writer: batching, back-pressure, bad rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuprof.kernels import KernelAgg
from gpuprofd.core.counters import DropCounter
from gpuprofd.storage import reads, schema
from gpuprofd.storage.writes import BATCH_MAX_OPS, Op, Store, runsdb
from gpuprofd.storage.writes import store as store_mod
from tests.daemon.helpers import query


async def _store(tmp_path: Path, queue_size: int) -> tuple[Store, DropCounter, Path]:
    db = tmp_path / "s.db"
    schema.prepare(db)
    drops = DropCounter()
    store = Store(db, drops, queue_size=queue_size)
    await store.open()
    return store, drops, db


async def test_full_queue_drops_and_counts_then_writer_batches(tmp_path: Path) -> None:
    store, drops, db = await _store(tmp_path, queue_size=1000)
    queued = [store.submit_nowait(runsdb.host_sample_op(i, 50.0, 4, None)) for i in range(1200)]
    assert queued.count(True) == 1000
    assert drops.snapshot() == {"store_backpressure": 200}
    store.start()
    await store.flush()
    assert query(db, "SELECT COUNT(*), MIN(mono_ns), MAX(mono_ns) FROM host_samples")[0][:] == (
        1000,
        0,
        999,
    )
    # 1000 queued ops in batches of BATCH_MAX_OPS, then the flush barrier
    assert store.commits == -(-1001 // BATCH_MAX_OPS)  # the flush closes the last batch
    await store.close()


async def test_one_bad_row_is_dropped_and_counted_the_rest_kept(tmp_path: Path) -> None:
    store, drops, db = await _store(tmp_path, queue_size=100)
    store.start()
    sql = "INSERT INTO runs (run_key, run_name, status) VALUES (?, ?, ?)"
    for params in [("a", "n", "running"), ("b", None, "running"), ("c", "n", "running")]:
        store.submit_nowait(Op(sql, params))
    await store.flush()
    assert [r[0] for r in query(db, "SELECT run_key FROM runs ORDER BY id")] == ["a", "c"]
    assert drops.snapshot() == {"store_error": 1}
    await store.close()


async def test_write_returns_the_row_id_after_commit(tmp_path: Path) -> None:
    store, _, db = await _store(tmp_path, queue_size=10)
    store.start()
    run_id = await runsdb.insert_run(store, {"run_key": "k", "run_name": "n", "status": "running"})
    assert query(db, "SELECT id FROM runs WHERE run_key = 'k'")[0][0] == run_id
    await store.close()


async def test_close_commits_what_is_queued(tmp_path: Path) -> None:
    store, _, db = await _store(tmp_path, queue_size=100)
    store.start()
    for i in range(10):
        store.submit_nowait(runsdb.host_sample_op(i, 1.0, 1, 2.0))
    await store.close()
    assert query(db, "SELECT COUNT(*) FROM host_samples")[0][0] == 10


async def test_writer_survives_concurrent_producers(tmp_path: Path) -> None:
    store, drops, db = await _store(tmp_path, queue_size=50)
    store.start()

    async def produce(k: int) -> None:
        for i in range(200):
            store.submit_nowait(runsdb.host_sample_op(k * 1000 + i, 1.0, 1, None))
            if i % 20 == 0:
                await asyncio.sleep(0)

    await asyncio.gather(*(produce(k) for k in range(4)))
    await store.flush()
    stored = query(db, "SELECT COUNT(*) FROM host_samples")[0][0]
    assert stored + drops.counts["store_backpressure"] == 800
    await store.close()


def _kernels_msg(t0: int, n_rows: int) -> dict:
    rows = [[f"k{i}", "kernel", "compute", 1, 1000 + i, 1000 + i, None] for i in range(n_rows)]
    return {"t0": t0, "t1": t0 + 10, "source": "continuous", "steps": [], "rows": rows}


async def test_kernel_windows_queue_all_or_none_and_rows_find_their_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window and its rows are queued together or not at all; rows land on
    their own window even when windows split across writer batches; a row
    whose window insert failed is dropped, never put on another window."""
    monkeypatch.setattr(store_mod, "BATCH_MAX_OPS", 500)
    store, drops, db = await _store(tmp_path, queue_size=600)
    # 3 windows of 200 rows: the second crosses the first batch's 500-op end
    assert all(
        store.submit_all_nowait(runsdb.kernels_ops(1, _kernels_msg(t, 199)))
        for t in (100, 200, 300)
    )
    assert not store.submit_all_nowait(runsdb.kernels_ops(1, _kernels_msg(400, 5)))  # no room
    assert drops.snapshot() == {"store_backpressure": 1}
    store.start()
    await store.flush()
    got = query(
        db,
        "SELECT w.t0_ns, COUNT(*), MIN(s.total_ns), MAX(s.total_ns) FROM kernel_windows w "
        "JOIN kernel_stats s ON s.window_id = w.id GROUP BY w.id ORDER BY w.t0_ns",
    )
    assert [tuple(r) for r in got] == [(t, 199, 1000, 1198) for t in (100, 200, 300)]
    loaded = await reads.kernel_windows(store, 1)  # what the insights runner reads
    assert [(w["t0"], w["t1"], w["source"], w["steps"], len(rows)) for w, rows in loaded] == [
        (t, t + 10, "continuous", [], 199) for t in (100, 200, 300)
    ]
    assert loaded[0][1][0] == KernelAgg("k198", "kernel", "compute", 1, 1198, 1198, None)
    # the window insert fails (a NOT NULL run_id): its rows are dropped with it
    ops = runsdb.kernels_ops(2, _kernels_msg(500, 3))
    ops[0] = Op(ops[0].sql, (None, *ops[0].params[1:]))
    assert store.submit_all_nowait(ops)
    await store.flush()
    assert query(db, "SELECT COUNT(*) FROM kernel_stats WHERE run_id = 2")[0][0] == 0
    assert query(db, "SELECT COUNT(*) FROM kernel_stats")[0][0] == 3 * 199
    assert drops.snapshot()["store_error"] >= 1
    await store.close()


async def test_ingest_can_wait_for_room_instead_of_dropping(tmp_path: Path) -> None:
    store, drops, db = await _store(tmp_path, queue_size=10)
    for i in range(10):
        assert store.submit_nowait(runsdb.host_sample_op(i, 50.0, 4, None))
    await store.wait_for_room(0)  # nothing asked: at once
    waiting = asyncio.ensure_future(store.wait_for_room(3))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # full, no writer yet
    store.start()
    await asyncio.wait_for(waiting, 5)
    await store.flush()
    assert query(db, "SELECT COUNT(*) FROM host_samples")[0][0] == 10
    assert drops.snapshot() == {}
    await store.close()
