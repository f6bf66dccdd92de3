"""The step rollup tier: one ``step_rollups`` row per block of
:data:`STEP_BLOCK` steps of a run (by index), so a whole-run chart of a day
of 500 ms steps reads ~1,700 rows instead of 172,800 steps; and, block by
block, the run's figures (:mod:`gpuprofd.storage.reads.steptotals`).

Each row holds the block's count, the minimum and maximum iteration time
(so one slow step keeps its value at any zoom), the sums of the iteration
and of each chart phase (means are sums / counts, exactly), the
evaluation and skipped-update counts and torch's memory maxima.

Written by a maintenance pass (:func:`roll_pass`, every
:data:`ROLL_INTERVAL_S`): a running run's complete blocks, an ended run's
last partial one; a block is written once (steps arriving for a block
already written, after the run's end, are left out of the tier but stay in
``steps``). A database from before the tier gets its runs rolled by the
same pass, :data:`MAX_BLOCKS_PER_PASS` blocks per run at a time.
"""

from __future__ import annotations

import functools
from typing import Any

from gpuprofd.storage.dialect import Dialect
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import series, steptotals
from gpuprofd.storage.reads.steptotals import STEP_BLOCK
from gpuprofd.storage.writes import Store

#: Seconds between passes: a live chart's tier lags by at most this (the raw
#: steps after the last block fill the rest).
ROLL_INTERVAL_S = 10.0
#: Blocks one pass writes per run (50,000 steps): bounded work per pass.
MAX_BLOCKS_PER_PASS = 500

_COLUMNS = (
    "run_id, block, first_step, last_step, t0_ns, t1_ns, n, iter_min_ns, iter_max_ns, "
    "iter_sum_ns, loader_wait_sum_ns, forward_sum_ns, backward_sum_ns, comm_sum_ns, "
    "optimizer_sum_ns, other_sum_ns, eval_n, skipped_n, mem_alloc_max, mem_reserved_max"
)


@functools.cache
def roll_sql(d: Dialect) -> str:
    """Rolls the blocks of steps ``(run_id, first step, end step)`` (the
    indices ``[first, end)``, whole blocks) into ``step_rollups``."""
    e = series.step_exprs(d)
    sums = ", ".join(
        f"CAST(SUM({e[p]}) AS DOUBLE PRECISION)"
        for p in ("iter", "loader_wait", *series.PHASES, "other")
    )
    return (
        f"INSERT INTO step_rollups ({_COLUMNS}) "
        f"SELECT run_id, step / {STEP_BLOCK}, MIN(step), MAX(step), MIN(t0_ns), MAX(t1_ns), "
        f"COUNT(*), MIN({e['iter']}), MAX({e['iter']}), {sums}, "
        "SUM(CASE WHEN COALESCE(eval_ns, 0) > 0 THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN COALESCE(skipped, 0) != 0 THEN 1 ELSE 0 END), "
        "MAX(mem_allocated_bytes), MAX(mem_reserved_bytes) FROM "
        f"{series.with_between('run_id = ? AND step >= ? AND step < ?', scan=True)} "
        f"GROUP BY run_id, step / {STEP_BLOCK} "
        "ON CONFLICT (run_id, block) DO NOTHING"
    )


#: Each run's status, whether its summary is stored, its last rolled block
#: of each tier and its highest step index.
PENDING_SQL = (
    "SELECT r.id AS id, r.status AS status, "
    "CASE WHEN r.summary IS NULL THEN 0 ELSE 1 END AS summarized, "
    "(SELECT MAX(block) FROM step_rollups WHERE run_id = r.id) AS rolled, "
    "(SELECT MAX(block) FROM step_totals WHERE run_id = r.id) AS totalled, "
    "(SELECT MAX(step) FROM steps WHERE run_id = r.id) AS top FROM runs r ORDER BY r.id"
)


def blocks_to_roll(status: str, rolled: int | None, top: int | None) -> tuple[int, int] | None:
    """The blocks ``[first, end)`` a pass rolls for a run with *status*, its
    last rolled block *rolled* and its highest step index *top*: the complete
    blocks after *rolled* (an ended run's last partial one too), at most
    :data:`MAX_BLOCKS_PER_PASS`; None: nothing to do."""
    if top is None or top < 0:
        return None
    first = 0 if rolled is None else rolled + 1
    end = top // STEP_BLOCK + (0 if status == "running" else 1)
    end = min(end, first + MAX_BLOCKS_PER_PASS)
    return (first, end) if end > first else None


async def roll_pass(store: Store) -> int:
    """Roll what each run has pending (:func:`blocks_to_roll`) into the step
    rollups, and into the step totals (:mod:`gpuprofd.storage.reads.steptotals`;
    an ended run's last partial block once its summary is stored, so every
    late event is in); the step rollup blocks written."""
    written = 0
    for r in await store.fetchall(PENDING_SQL):
        span = blocks_to_roll(r["status"], r["rolled"], r["top"])
        if span is not None:
            first, end = span
            params = (r["id"], first * STEP_BLOCK, end * STEP_BLOCK)
            await store.write(roll_sql(store.dialect), params)
            written += end - first
        settled = "running" if not r["summarized"] else r["status"]
        span = blocks_to_roll(settled, r["totalled"], r["top"])
        if span is not None:
            first, end = span
            head = await store.fetchone(steptotals.FIRST_SQL, (r["id"],))
            totals = (head["r"], r["id"], first * STEP_BLOCK, end * STEP_BLOCK)
            await store.write(steptotals.roll_sql(store.dialect), totals)
    return written


ROWS_SQL = (
    f"SELECT {_COLUMNS} FROM step_rollups WHERE run_id = ? AND t0_ns >= ? AND t0_ns < ? "
    "ORDER BY t0_ns"
)


async def rollup_rows(db: Reader, run_id: int, lo_ns: int, hi_ns: int) -> list[dict[str, Any]]:
    """The run's rollup rows whose block starts in [*lo_ns*, *hi_ns*), by start."""
    return [dict(r) for r in await db.fetchall(ROWS_SQL, (run_id, lo_ns, hi_ns))]
