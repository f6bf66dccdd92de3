"""A torchrun job's ranks on one host: their process trees' CPU is the job's
own, not "other processes" (host_cpu_contention), read from a real database
the way ``gpuprofctl insights`` and the daemon's runner read it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuprof.insights import run_rules
from gpuprofd.core.counters import DropCounter
from gpuprofd.storage import reads, schema
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.writes import Store

T0 = 1_000_000_000_000
TICK = 500_000_000  # the host sampler's 0.5 s
N = 40
STEP_NS, WAIT_NS = 10_000_000, 8_000_000


def _db(
    tmp_path: Path,
    *,
    rank_cores: float,
    other_load_cores: float,
    cpu_count: int = 2,
    with_outsider: bool = False,
) -> Path:
    """Two ranks of group 'job' on 'node', each at *rank_cores*; the host
    busy with both plus *other_load_cores*; loader stalls in every step."""
    db = tmp_path / "g.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    end = T0 + N * TICK
    runs = [("k0", 0, "job"), ("k1", 1, "job")]
    if with_outsider:  # another job at the same time on the same host: not this job's
        runs.append(("k2", 0, "other-job"))
    for key, rank, group in runs:
        conn.execute(
            "INSERT INTO runs (run_key, run_name, status, host, pid, rank, world_size, "
            "start_mono_ns, end_mono_ns, cpu_count, boot_id, group_id) "
            "VALUES (?, 'ddp', 'finished', 'node', 1, ?, 2, ?, ?, ?, 'b', ?)",
            (key, rank, T0, end, cpu_count, group),
        )
    ids = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY id")]
    busy = 2 * rank_cores + other_load_cores
    for i in range(N):
        t = T0 + i * TICK
        pct = min(100.0, 100 * busy / cpu_count)
        conn.execute(
            "INSERT INTO host_samples (mono_ns, cpu_pct, cpu_count, boot_id) VALUES (?, ?, ?, 'b')",
            (t, pct, cpu_count),
        )
        for run_id in ids[:2]:
            conn.execute("INSERT INTO run_cpu_samples VALUES (?, ?, ?)", (run_id, t, rank_cores))
        if with_outsider:
            conn.execute(
                "INSERT INTO run_cpu_samples VALUES (?, ?, ?)", (ids[2], t, other_load_cores)
            )
    # a sample of rank 1 alone at a time rank 0 was not sampled: not summed in
    conn.execute("INSERT INTO run_cpu_samples VALUES (?, ?, ?)", (ids[1], end + 1, 5.0))
    for run_id in ids:
        for s in range(30):
            t0 = T0 + s * (STEP_NS + WAIT_NS) + WAIT_NS
            conn.execute(
                "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases) "
                "VALUES (?, ?, ?, ?, ?, 1, 1, '{}')",  # a timed DataLoader
                (run_id, s, t0, t0 + STEP_NS, WAIT_NS),
            )
    conn.commit()
    conn.close()
    return db


async def _rules(db: Path, run_id: int = 1) -> tuple[object, set[str]]:
    async with open_reader(db) as reader:
        ctx = await reads.run_context(reader, await reads.get_run(reader, run_id))
    return ctx, {i.rule for i in run_rules(ctx)}


async def test_two_ranks_using_the_host_are_the_jobs_own_cpu(tmp_path: Path) -> None:
    db = _db(tmp_path, rank_cores=0.95, other_load_cores=0.0)
    ctx, fired = await _rules(db)
    assert ctx.run_cpu_cores == 0.95
    assert (round(ctx.job_cpu_cores, 6), ctx.job_ranks) == (1.9, 2)
    assert "host_cpu_contention" not in fired
    assert "cpu_bound_dataloader" in fired  # the stalls and the job's own pegged CPU say so


async def test_a_job_sharing_the_host_with_another_load_is_still_contended(tmp_path: Path) -> None:
    db = _db(tmp_path, rank_cores=1.0, other_load_cores=13.0, cpu_count=16, with_outsider=True)
    ctx, fired = await _rules(db)
    assert (ctx.job_cpu_cores, ctx.job_ranks) == (2.0, 2)  # the other job is not summed in
    # the stall stays the finding, with the other job's CPU as its cause
    found = {i.rule: i for i in run_rules(ctx)}
    stall = found["cpu_bound_dataloader"]
    assert (stall.evidence["cause"], stall.evidence["own_cpu_cores"]) == ("contention", 2.0)
    assert "other processes hold 13.0 of 16 cores" in stall.title
    assert "host_cpu_contention" not in fired  # carried by the stall finding


async def test_the_daemons_reader_sums_the_group_too(tmp_path: Path) -> None:
    db = _db(tmp_path, rank_cores=0.95, other_load_cores=0.0)

    store = Store(db, DropCounter())
    await store.open()
    try:
        run = await reads.find_run(store, run_id=2)
        assert run is not None
        (row,) = await reads.job_cpu(store, run)
    finally:
        await store.close()
    # rank 1's 40 samples beside rank 0 (1.9 cores together), and one alone (5.0)
    assert (round(row["cores"], 6), row["ranks"]) == (round((40 * 1.9 + 5.0) / 41, 6), 2)
