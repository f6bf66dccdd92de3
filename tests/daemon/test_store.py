"""The store's single writer: batching, back-pressure, bad rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuprofd import runsdb, schema
from gpuprofd.counters import DropCounter
from gpuprofd.store import BATCH_MAX_OPS, Op, Store
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
        1000, 0, 999,
    )  # fmt: skip
    # 1000 queued ops in batches of 500, then the flush barrier: 3 transactions
    assert BATCH_MAX_OPS == 500
    assert store.commits == 3
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
