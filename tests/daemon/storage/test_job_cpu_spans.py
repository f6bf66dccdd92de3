"""A job's CPU on its node (how many of its runs were sampled together, the
cores they used at the run's own sample times) and the host readings, read
as the context reads them, on each backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuprofd.storage.reads.queries import most_at_once
from gpuprofd.storage.writes import runsdb
from tests.daemon.helpers import open_store


def test_ranks_running_together_are_counted_together():
    assert most_at_once([(0, 100), (0, 100), (50, 200)]) == 3
    # spans that only touch at one sample time were sampled together then
    assert most_at_once([(0, 100), (100, 200)]) == 2


def test_a_rank_restarted_after_its_first_run_ended_is_one_rank():
    assert most_at_once([(0, 100), (101, 200), (150, 300)]) == 2
    assert most_at_once([(0, 100)]) == 1
    assert most_at_once([]) == 0


# --- the job's CPU and the host readings as the context reads them, each backend ---

T0, TICK, TICKS = 10**15, 500_000_000, 70  # 35 s: 3 whole 10 s blocks, then part of one
#: The job's CPU as it was summed before: every group run's samples at each of
#: the run's own sample times (one pass with an IN list): the reference.
OLD_JOB_CPU_SQL = (
    "SELECT CAST(SUM(s.cores) AS DOUBLE PRECISION) AS total "
    "FROM run_cpu_samples s JOIN runs r ON r.id = s.run_id "
    "WHERE r.group_id = ? AND r.host IS NOT DISTINCT FROM ? "
    "AND r.boot_id IS NOT DISTINCT FROM ? AND s.cores IS NOT NULL "
    "AND s.mono_ns IN (SELECT mono_ns FROM run_cpu_samples WHERE run_id = ? "
    "AND cores IS NOT NULL)"
)


def _run_row(key: str, group: str) -> dict[str, Any]:
    return {
        "run_key": key,
        "run_name": "job",
        "status": "running",
        "host": "node",
        "pid": 1,
        "start_mono_ns": T0 - TICK,
        "group_id": group,
        "boot_id": "b",
        "cpu_count": 8,
    }


async def _varied_job(store: Any) -> tuple[int, dict[int, dict[int, float | None]], list[dict]]:
    """Rank 0 (the run read), rank 1 and another job's run on one host:
    rank 0 lacks two host times (its tree unreadable: rank 1 has them) and
    has one without cores; rank 1 starts 3 ticks late and has a sample
    after rank 0's last. Returns (rank 0's id, each run's cores by time,
    the host rows)."""
    ids = [
        await runsdb.insert_run(store, _run_row(k, g))
        for k, g in (("r0", "job"), ("r1", "job"), ("x", "other"))
    ]
    cores: dict[int, dict[int, float | None]] = {i: {} for i in ids}
    host = []
    for k in range(TICKS):
        t = T0 + k * TICK
        row = {
            "mono_ns": t,
            "cpu_pct": 20.0 + k * 1.7,
            "cpu_count": 8,
            "disk_read_bps": None if k % 4 == 0 else 1e6 * k + 0.3,
            "disk_read_iops": 100.0 + k / 3,
            "page_cache_bytes": None if k == 5 else 2**33 + k * 12345,
            "mem_total_bytes": 2**36,
            "swap_in_bps": None if k % 2 else 4096.0 * k,
        }
        host.append(row)
        store.submit_nowait(runsdb.host_sample_op(**row, boot_id="b"))
        if k not in (7, 19, 64):
            cores[ids[0]][t] = None if k in (11, 45) else 1.0 + k / 7
        if k >= 3:
            cores[ids[1]][t] = 0.5 + k / 11
        cores[ids[2]][t] = 3.25
    cores[ids[1]][T0 + TICKS * TICK + 1] = 9.0  # after rank 0's last sample
    for run_id, by_time in cores.items():
        for t, c in by_time.items():
            store.submit_nowait(runsdb.run_cpu_op(run_id, t, c))  # type: ignore[arg-type]
    await store.flush()
    return ids[0], cores, host


async def test_the_jobs_cpu_is_the_mean_over_the_runs_own_times(storage_url: str) -> None:
    from gpuprofd.storage import reads
    from gpuprofd.storage.upkeep import hostrollup

    async with open_store(storage_url) as store:
        run_id, cores, _ = await _varied_job(store)
        run = await reads.find_run(store, run_id=run_id)
        (raw,) = await reads.job_cpu(store, run)  # from the samples alone
        # the daemon's host rollup pass: whole 10 s blocks of each run
        assert await hostrollup.roll_pass(store) >= 6
        rolled = await store.fetchall("SELECT run_id, block FROM host_rollups")
        (row,) = await reads.job_cpu(store, run)  # from the rollups where they hold it
        old = await store.fetchone(OLD_JOB_CPU_SQL, (run["group_id"], "node", "b", run_id))
    assert {r["run_id"] for r in rolled} == {run_id, run_id + 1, run_id + 2}
    own = [t for t, c in cores[run_id].items() if c is not None]
    # summed here: the group's two runs at rank 0's own sample times only
    # (not at its lacked times nor those without cores, nor after its last),
    # the other job's run left out
    total = sum(c for rid in (run_id, run_id + 1) for t, c in cores[rid].items() if t in own)
    # the same from the rollups and from the samples, and what the IN-list
    # query gave, up to the order of a float sum (~1e-16 relative; the
    # rules round it to 0.01 core)
    for got in (raw, row):
        assert got["cores"] == pytest.approx(total / len(own), rel=1e-12)
        assert got["cores"] == pytest.approx(old["total"] / len(own), rel=1e-12)
        assert got["ranks"] == 2


async def test_host_readings_read_as_columns_give_the_rows_figures(storage_url: str) -> None:
    from gpuprof.insights import hostcpu
    from gpuprofd.storage import reads

    async with open_store(storage_url) as store:
        _, _, host = await _varied_job(store)
        cols = await reads.host_columns(store, T0, T0 + TICKS * TICK, "b")
        none = await reads.host_columns(store, T0, T0 + TICKS * TICK, "another boot")
    rows = hostcpu.host_columns(host)  # the figures from every row, in Python
    assert cols.mono_ns.tolist() == [h["mono_ns"] for h in host]
    for name in ("cpu_pct", "cpu_count", "disk_read_bps"):  # NaN where a sample had none
        np.testing.assert_array_equal(getattr(cols, name), getattr(rows, name), err_msg=name)
    assert np.isnan(cols.disk_read_bps).sum() == TICKS // 4 + 1
    # the means the database averaged: the rows' means up to a float sum's
    # order (the host rules round them to 3 significant digits)
    for name, value in rows.means.items():
        assert value is not None
        assert cols.means[name] == pytest.approx(value, rel=1e-12), name
    assert len(none) == 0 and set(none.means.values()) == {None}
