"""A run's step aggregates (what ``gpuprofctl runs``, the runs list and a
run's headline show: steps, the counted steps' phase sums, skipped updates,
evaluation, torch's memory peaks), and their tier: one ``step_totals`` row
per block of :data:`STEP_BLOCK` steps, so a
day-long run's figures add up ~1,700 rows instead of reading 172,800 steps
(and their JSON phases) each time.

The definition is the one :func:`aggregates_sql` gives, whatever the rows:
``steps`` counts every step; every other sum skips the run's first step (by
``t0``, then insertion order), whose wait covers start-up, and the traced
steps (a profiler snapshot or FLOP count slowed them), ``counted_steps``
saying how many the sums cover; ``skipped_updates`` and ``eval_ns`` cover
every step; the memory figures and ``micro_max`` (the most micro-batches a
step had) are maxima over every step. Sums are DOUBLE PRECISION
(Postgres sums integers as numeric), the counts integers.

A run's figures are its blocks' rows added up (:data:`SUM_SQL`) plus the
steps outside them (:func:`tail_sql`: a live run's newest, a short run's
all), read raw. The blocks are written by the step rollup pass
(:func:`gpuprofd.storage.upkeep.steprollup.roll_pass`): a running run's complete
blocks, and an ended run's last partial one once its summary is stored (the
events that came after its end are in by then), so a block's row holds
every step of it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpuprofd.storage.dialect import Dialect

#: Steps per block, by index (``block = step / STEP_BLOCK``), of this tier and of
#: the step chart's (:mod:`gpuprofd.storage.upkeep.steprollup`): a day of 500 ms steps
#: is 1,728 blocks; a chart of 1,000 px (2,000 buckets) then holds about one
#: block per bucket.
STEP_BLOCK = 100
#: The aggregates, in the order every statement here lists them.
COLUMNS = (
    "steps",
    "skipped_updates",
    "eval_ns",
    "counted_steps",
    "wait_ns",
    "step_ns",
    "micro",
    "forward_ns",
    "backward_ns",
    "optimizer_ns",
    "data_ns",
    "comm_ns",
    "comm_steps",
    "mem_peak_bytes",
    "mem_reserved_max_bytes",
    "micro_max",
)
#: Those that are maxima (the rest add up), and those that are integers.
MAXED = ("mem_peak_bytes", "mem_reserved_max_bytes", "micro_max")
INTEGERS = ("steps", "counted_steps")
#: A step's columns the aggregates read.
_STEP_COLUMNS = (
    "run_id, step, t0_ns, t1_ns, wait_ns, micro, phases, skipped, eval_ns, mem_peak_bytes, "
    "mem_reserved_bytes"
)


@functools.cache
def aggregates_sql(d: Dialect) -> str:
    """The select list of :data:`COLUMNS` over steps carrying ``c`` (1: a
    counted step, 0: the run's first or a traced one)."""

    def total(expr: str) -> str:
        return f"CAST(COALESCE(SUM({expr}), 0) AS DOUBLE PRECISION)"

    def phase(key: str) -> str:
        return total(f"c * COALESCE({d.json_num('phases', key)}, 0)")

    comm_steps = f"CASE WHEN {d.json_num('phases', 'comm')} IS NOT NULL THEN c ELSE 0 END"
    exprs = {
        "steps": "CAST(COUNT(*) AS BIGINT)",
        "skipped_updates": total("skipped"),
        "eval_ns": total("eval_ns"),
        "counted_steps": "CAST(SUM(c) AS BIGINT)",
        "wait_ns": total("c * wait_ns"),
        "step_ns": total("c * (t1_ns - t0_ns)"),
        "micro": total("c * COALESCE(micro, 1)"),
        "forward_ns": phase("forward"),
        "backward_ns": phase("backward"),
        "optimizer_ns": phase("optimizer"),
        "data_ns": phase("data"),
        "comm_ns": phase("comm"),
        "comm_steps": total(comm_steps),
        "mem_peak_bytes": "MAX(mem_peak_bytes)",
        "mem_reserved_max_bytes": "MAX(mem_reserved_bytes)",
        "micro_max": "MAX(micro)",
    }
    return ", ".join(f"{exprs[c]} AS {c}" for c in COLUMNS)


def numbered_sql(where: str) -> str:
    """Whole runs' steps (those *where* picks) with ``c``, the run's first
    step found by a window over each run."""
    return (
        f"SELECT {_STEP_COLUMNS}, CASE WHEN ROW_NUMBER() OVER (PARTITION BY run_id "
        "ORDER BY t0_ns, rowid) > 1 AND COALESCE(traced, 0) = 0 THEN 1 ELSE 0 END AS c "
        f"FROM steps {where}"
    )


def _known_first_sql(where: str) -> str:
    """Some of one run's steps with ``c``, its first step's ``rowid`` the
    first parameter (:data:`FIRST_SQL`), then *where*'s."""
    return (
        f"SELECT {_STEP_COLUMNS}, CASE WHEN rowid != ? AND COALESCE(traced, 0) = 0 "
        f"THEN 1 ELSE 0 END AS c FROM steps {where}"
    )


#: A run's first step (by ``t0``, then insertion order): its ``rowid``; -1
#: where the run has packed steps (:mod:`gpuprofd.storage.reads.steprows`: its
#: oldest block, packed first, holds it, and its block's totals are written).
FIRST_SQL = (
    "SELECT COALESCE((SELECT -1 FROM step_packs WHERE run_id = ?1 LIMIT 1), "
    "(SELECT rowid FROM steps WHERE run_id = ?1 ORDER BY t0_ns, rowid LIMIT 1)) AS r"
)


@functools.cache
def roll_sql(d: Dialect) -> str:
    """Writes the blocks of ``(first step's rowid, run_id, first index, end
    index)`` (whole blocks ``[first, end)``) into ``step_totals``."""
    rows = _known_first_sql("WHERE run_id = ? AND step >= ? AND step < ?")
    return (
        f"INSERT INTO step_totals (run_id, block, {', '.join(COLUMNS)}) "
        f"SELECT run_id, step / {STEP_BLOCK}, {aggregates_sql(d)} FROM ({rows}) AS numbered "
        f"GROUP BY run_id, step / {STEP_BLOCK} ON CONFLICT (run_id, block) DO NOTHING"
    )


@functools.cache
def tail_sql(d: Dialect) -> str:
    """The aggregates of ``(first step's rowid, run_id, end index)``: the
    run's steps after its blocks (index ``>= end``; indices are never
    negative, :mod:`gpuprof.protocol` has them from 0)."""
    rows = _known_first_sql("WHERE run_id = ? AND step >= ?")
    return f"SELECT run_id, {aggregates_sql(d)} FROM ({rows}) AS numbered GROUP BY run_id"


def sum_sql(where: str = "") -> str:
    """Per run (those *where* picks), its ``step_totals`` rows added up, and
    ``last_block``: its highest block."""
    exprs = ", ".join(
        f"MAX({c}) AS {c}"
        if c in MAXED
        else f"CAST(SUM({c}) AS {'BIGINT' if c in INTEGERS else 'DOUBLE PRECISION'}) AS {c}"
        for c in COLUMNS
    )
    return (
        f"SELECT run_id, {exprs}, MAX(block) AS last_block FROM step_totals {where} GROUP BY run_id"
    )


def combine(blocks: Mapping[str, Any], tail: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's aggregates: its blocks' (:func:`sum_sql`) and its tail's
    (:func:`tail_sql`; None: no steps outside the blocks) together."""
    out: dict[str, Any] = {"run_id": blocks["run_id"]}
    for c in COLUMNS:
        a, b = blocks[c], None if tail is None else tail[c]
        if c in MAXED:
            out[c] = a if b is None else b if a is None else max(a, b)
        else:
            total = (a or 0) + (b or 0)
            out[c] = int(total) if c in INTEGERS else float(total)
    return out
