"""The host rollup tier: one ``host_rollups`` row per run per block of
:data:`HOST_BLOCK_NS` of the node's host samples (2 a second) joined with the
run's own CPU, so a whole-run chart of a day reads ~8,600 rows instead of
172,800 samples.

Each row holds, per reading a chart shows (the run's cores, the other cores
busy, disk read bytes/s, page cache bytes), the block's minimum and maximum
(one sample that stands out keeps its value at any zoom) and the sum and
count of the samples that had it (means are sums / counts, exactly).

Blocks are whole spans of the boot's monotonic clock (``mono_ns //
HOST_BLOCK_NS``) inside the run: a block is written once it is complete,
that is when a later host sample of the boot is stored (samples are stored
in the order taken) and, for an ended run, when it ends before the run's
end. The part of a window outside the rolled blocks (the run's first and
last seconds, a live run's newest) is read from the samples themselves
(:func:`gpuprofd.storage.reads.series.host_buckets`). A block whose samples
are packed already (:mod:`gpuprofd.storage.upkeep.samplepack` waits for the
rollups, but a run a team server receives late may start in a packed span)
is rolled from the samples read packed. Written by a maintenance
pass (:func:`roll_pass`, every :data:`ROLL_INTERVAL_S`), at most
:data:`MAX_BLOCKS_PER_PASS` blocks per run at a time, so a database from
before the tier gets its runs rolled the same way. Samples stored for a
block already written are left out of the tier (they stay in
``host_samples``).
"""

from __future__ import annotations

from typing import Any

from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import series
from gpuprofd.storage.writes import Store
from gpuprofd.storage.writes.ops import Txn

#: The span of one block, ns: 20 samples at the daemon's 2 Hz; a day is 8,640
#: blocks, so a 1,400 px chart (2,800 buckets of 31 s) reads each once.
HOST_BLOCK_NS = 10_000_000_000
#: Seconds between passes: a live chart reads at most about this much of the
#: newest samples raw.
ROLL_INTERVAL_S = 10.0
#: Blocks one pass writes per run (about 7 h of samples): bounded work per pass.
MAX_BLOCKS_PER_PASS = 2_500

_STATS = tuple(f"{m}_{s}" for m in series.HOST_METRICS for s in ("min", "max", "sum", "n"))
_COLUMNS = "run_id, block, t0_ns, t1_ns, n, cpu_count, " + ", ".join(_STATS)


#: Rolls ``(run_id, run_id, boot_id, start_ns, end_ns)``: the run's host
#: samples in [start, end) (whole blocks) into ``host_rollups``.
ROLL_SQL = (
    f"INSERT INTO host_rollups ({_COLUMNS}) "
    f"SELECT CAST(? AS BIGINT), mono_ns / {HOST_BLOCK_NS}, MIN(mono_ns), MAX(mono_ns), "
    "CAST(COUNT(*) AS BIGINT), MAX(cpu_count), "
    + ", ".join(series.host_stats_sql(m) for m in series.HOST_METRICS)
    + f" FROM ({series.HOST_ROW_SQL}) AS hs GROUP BY mono_ns / {HOST_BLOCK_NS} "
    "ON CONFLICT (run_id, block) DO NOTHING"
)


#: ... and one block's row, where the samples are read through
#: :mod:`gpuprofd.storage.reads.samplerows` (:func:`_roll_read`).
INSERT_SQL = (
    f"INSERT INTO host_rollups ({_COLUMNS}) VALUES ({', '.join('?' * (6 + len(_STATS)))}) "
    "ON CONFLICT (run_id, block) DO NOTHING"
)


#: Each run's window and boot, and its last rolled block.
PENDING_SQL = (
    "SELECT r.id AS id, r.status AS status, r.boot_id AS boot_id, "
    "r.start_mono_ns AS start_ns, r.end_mono_ns AS end_ns, "
    "(SELECT MAX(block) FROM host_rollups WHERE run_id = r.id) AS rolled "
    "FROM runs r ORDER BY r.id"
)
#: The newest host sample of a boot (monotonic ns).
NEWEST_SQL = "SELECT MAX(mono_ns) AS t FROM host_samples WHERE boot_id IS NOT DISTINCT FROM ?"


def blocks_to_roll(
    status: str,
    start_ns: int | None,
    end_ns: int | None,
    newest_ns: int | None,
    rolled: int | None,
) -> tuple[int, int] | None:
    """The blocks ``[first, end)`` a pass rolls for a run with *status*, its
    start and end (monotonic ns; end None while it runs), the newest host
    sample of its boot *newest_ns* and its last rolled block *rolled*: the
    complete blocks after *rolled* that lie inside the run (a block is
    complete once a sample after it is stored), at most
    :data:`MAX_BLOCKS_PER_PASS`; None: nothing to do."""
    if start_ns is None or newest_ns is None:
        return None
    first = -(-start_ns // HOST_BLOCK_NS) if rolled is None else rolled + 1
    limit = newest_ns if status == "running" or end_ns is None else min(end_ns, newest_ns)
    end = min(limit // HOST_BLOCK_NS, first + MAX_BLOCKS_PER_PASS)
    return (first, end) if end > first else None


async def roll_pass(store: Store) -> int:
    """Roll what each run has pending (:func:`blocks_to_roll`); the blocks
    rolled (empty ones, with no samples, count too: they write no row)."""
    newest: dict[str | None, int | None] = {}
    done = 0
    for r in await store.fetchall(PENDING_SQL):
        boot = r["boot_id"]
        if boot not in newest:
            row = await store.fetchone(NEWEST_SQL, (boot,))
            newest[boot] = None if row is None or row["t"] is None else int(row["t"])
        span = blocks_to_roll(r["status"], r["start_ns"], r["end_ns"], newest[boot], r["rolled"])
        if span is None:
            continue
        first, end = span
        lo, hi = first * HOST_BLOCK_NS, end * HOST_BLOCK_NS
        if await series.host_packed(store, r["id"], boot, lo, hi - 1):
            await _roll_read(store, r["id"], boot, lo, hi)
        else:
            await store.write(ROLL_SQL, (r["id"], r["id"], boot, lo, hi))
        done += end - first
    return done


async def _roll_read(store: Store, run_id: int, boot: str | None, lo: int, hi: int) -> None:
    """:data:`ROLL_SQL`'s rows for the samples in [*lo*, *hi*) read packed or
    not (a run whose span was packed before it was rolled: a run a team
    server receives late), the same figures worked out in Python."""
    rows = await series.host_rows(store, run_id, boot, lo, hi - 1)
    last = {r["mono_ns"] // HOST_BLOCK_NS: r["mono_ns"] for r in rows}  # rows by time
    values = [
        (run_id, b["b"], b["t"], last[b["b"]], b["n"], b["cpu_count"], *(b[c] for c in _STATS))
        for b in series.host_bucketed(rows, 0, HOST_BLOCK_NS)
    ]

    async def write(txn: Txn) -> None:
        for v in values:
            await txn.execute(INSERT_SQL, v)

    await store.transaction(write, "roll-host")


#: A run's rollup rows of blocks ``[first, end)`` merged in buckets of
#: ``(lo, width)`` by each block's first sample: per bucket its first time,
#: first and last block, sample count and each reading's min, max, sum, count.
BUCKET_SQL = (
    "SELECT (t0_ns - ?) / ? AS b, MIN(t0_ns) AS t, MIN(block) AS first_block, "
    "MAX(block) AS last_block, MAX(cpu_count) AS cpu_count, CAST(SUM(n) AS BIGINT) AS n, "
    + ", ".join(
        f"MIN({m}_min) AS {m}_min, MAX({m}_max) AS {m}_max, "
        f"CAST(SUM({m}_sum) AS DOUBLE PRECISION) AS {m}_sum, CAST(SUM({m}_n) AS BIGINT) AS {m}_n"
        for m in series.HOST_METRICS
    )
    + " FROM host_rollups WHERE run_id = ? AND block >= ? AND block < ? GROUP BY b ORDER BY b"
)


async def rollup_buckets(
    db: Reader, run_id: int, lo_ns: int, hi_ns: int, width_ns: int
) -> list[dict[str, Any]]:
    """The run's rollup rows of the blocks that lie whole in [*lo_ns*,
    *hi_ns*), in buckets of *width_ns* from *lo_ns* (:data:`BUCKET_SQL`)."""
    first = -(-lo_ns // HOST_BLOCK_NS)
    end = hi_ns // HOST_BLOCK_NS
    if end <= first:
        return []
    params = (lo_ns, width_ns, run_id, first, end)
    return [dict(r) for r in await db.fetchall(BUCKET_SQL, params)]
