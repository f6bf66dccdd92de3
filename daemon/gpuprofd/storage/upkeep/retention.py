"""Retention on a team server (``gpuprofd serve --keep-days N``): runs that
ended before a cutoff are deleted with everything of theirs, a few at a time
(each pass one short transaction, so ingest never waits long), then the
node-wide rows (host samples, packed or not, GPU rollups) of those runs' boots that no
remaining run of the boot reaches (a boot's rows before its first remaining run).
"""

from __future__ import annotations

from gpuprofd.storage.writes import Store, Txn

#: Runs deleted per pass, and node-wide rows per pass.
RUNS_PER_PASS = 20
ROWS_PER_PASS = 20_000
#: Tables holding a run's rows (``run_id``), deleted with it.
RUN_TABLES = (
    "steps",
    "step_packs",
    "step_rollups",
    "step_totals",
    "host_rollups",
    "comm_steps",
    "kernel_stats",
    "kernel_windows",
    "evidence_windows",
    "insights",
    "run_cpu_samples",
    "run_cpu_packs",
    "worker_cpu",
    "stack_samples",
)
_OLD_RUNS_SQL = (
    "SELECT id, boot_id FROM runs WHERE status != 'running' AND end_wall_ns IS NOT NULL "
    "AND end_wall_ns < ? ORDER BY id LIMIT ?"
)
#: Rows of a boot from before every remaining run of that boot (none left: all of them).
_ORPHAN_SQL = (
    "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {key} = ? AND "
    "{time} < COALESCE((SELECT MIN(start_mono_ns) FROM runs WHERE boot_id = ?), "
    "9000000000000000000) LIMIT ?)"
)


#: ... and GPU rollups of a boot from before them (``gpu_seconds`` has no rowid: by its key).
_ORPHAN_GPU_SQL = (
    "DELETE FROM gpu_seconds WHERE (gpu, sec_ns) IN (SELECT s.gpu, s.sec_ns FROM gpu_seconds s "
    "JOIN gpus g ON g.id = s.gpu WHERE g.boot_id = ? AND s.sec_ns < COALESCE((SELECT "
    "MIN(start_mono_ns) FROM runs WHERE boot_id = ?), 9000000000000000000) LIMIT ?)"
)


async def delete_runs_pass(
    store: Store, before_wall_ns: int, limit: int = RUNS_PER_PASS
) -> tuple[int, set[str]]:
    """Delete up to *limit* runs that ended before *before_wall_ns* (wall ns),
    with their rows; returns how many went and their boots."""

    async def one_pass(txn: Txn) -> tuple[int, set[str]]:
        found = await txn.fetch(_OLD_RUNS_SQL, (before_wall_ns, limit))
        for run_id, _ in found:
            for table in RUN_TABLES:
                await txn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            await txn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        return len(found), {boot for _, boot in found if boot is not None}

    return await store.transaction(one_pass, "retention")


async def delete_boot_rows_pass(store: Store, boot_id: str, limit: int = ROWS_PER_PASS) -> int:
    """Delete up to *limit* host samples and GPU rollups of *boot_id* from
    before its first remaining run; returns how many rows went."""

    async def one_pass(txn: Txn) -> int:
        sql = _ORPHAN_SQL.format(table="host_samples", time="mono_ns", key="boot_id")
        n = await txn.execute(sql, (boot_id, boot_id, limit))
        sql = _ORPHAN_SQL.format(table="host_packs", time="t_max_ns", key="boot_key")
        n += await txn.execute(sql, (boot_id, boot_id, limit))  # a pack: all of it before
        return n + await txn.execute(_ORPHAN_GPU_SQL, (boot_id, boot_id, limit))

    return await store.transaction(one_pass, "retention")


async def apply_retention(store: Store, before_wall_ns: int) -> tuple[int, int]:
    """Every pass until nothing older is left: (runs deleted, node rows deleted)."""
    runs = rows = 0
    boots: set[str] = set()
    while True:
        n, seen = await delete_runs_pass(store, before_wall_ns)
        if not n:
            break
        runs += n
        boots |= seen
    for boot in sorted(boots):
        while n := await delete_boot_rows_pass(store, boot):
            rows += n
    return runs, rows
