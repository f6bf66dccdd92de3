"""A run's time series, reduced by the database: "this run's steps (its
GPUs, its host) in this window, cut into buckets of *width_ns*", answered
with one row per bucket that holds data: its first time and the minimum,
mean and maximum of each reading. Nothing is sampled, so one step or one
sample that stands out keeps its value in the bucket's minimum or maximum.

And the live reads: rows newer than a cursor, bounded.

Buckets are ``(t - lo) / width_ns`` in integer arithmetic (both engines
divide integers to an integer); the shaping of rows into chart arrays is
:mod:`gpuprofd.web.series`'s. The SQL is in the subset both engines run
(:mod:`gpuprofd.storage.dialect`).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from typing import Any

from gpuprof.comm import COMM_PHASE
from gpuprof.protocol import DATA_PHASE
from gpuprof.window import between_steps_ns
from gpuprofd.sampling import rollup
from gpuprofd.storage import schema
from gpuprofd.storage.dialect import Dialect
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import samplerows, steprows

#: The phases a step's time splits into on the charts, with ``loader_wait``
#: (the wait before the step plus the ``data`` phase) and ``between_steps``
#: (:data:`BETWEEN`) first and ``other`` (the step's unlabelled rest) last:
#: they stack to the iteration time.
PHASES = ("forward", "backward", COMM_PHASE, "optimizer")
#: The host time between the previous step's end and a step's start outside
#: its timed loader wait and evaluation (:func:`gpuprof.window.between_steps_ns`).
BETWEEN = "between_steps"

_F = "CAST({} AS DOUBLE PRECISION)"


def _avg(expr: str) -> str:
    return f"CAST(AVG({_F.format(expr)}) AS DOUBLE PRECISION)"


def _isum(expr: str) -> str:
    return f"CAST(SUM({expr}) AS BIGINT)"


def _phase(d: Dialect, key: str) -> str:
    return f"COALESCE({d.json_num('phases', key)}, 0)"


#: The end of the step before a ``steps`` row: the run's stored step with the
#: next lower index (a run's steps are recorded in order), found on the
#: ``(run_id, step)`` index; NULL: none.
_PREV_T1 = (
    "(SELECT p.t1_ns FROM steps p WHERE p.run_id = steps.run_id AND p.step < steps.step "
    "ORDER BY p.step DESC LIMIT 1)"
)
#: The same over a scan of a run's steps: the row before's (LAG, by index),
#: the first row's looked up (one index probe, not one per row).
_PREV_T1_SCAN = f"COALESCE(LAG(t1_ns) OVER (ORDER BY step), {_PREV_T1})"
#: :func:`gpuprof.window.between_steps_ns` of a row holding ``prev_t1``.
_GAP = "s.t0_ns - s.prev_t1 - COALESCE(s.wait_ns, 0) - COALESCE(s.eval_ns, 0)"
BETWEEN_SQL = (
    "CASE WHEN COALESCE(s.explicit, 0) = 0 OR s.prev_t1 IS NULL THEN 0 "
    f"WHEN {_GAP} > 0 THEN {_GAP} ELSE 0 END"
)


#: The ``steps`` columns the step series read.
SERIES_COLUMNS = (
    "run_id, step, t0_ns, t1_ns, wait_ns, explicit, eval_ns, phases, skipped, "
    "mem_allocated_bytes, mem_reserved_bytes, traced"
)
#: ... and those an iteration alone needs.
ITER_COLUMNS = "run_id, step, t0_ns, t1_ns, wait_ns, explicit, eval_ns"


def with_between(where: str, *, scan: bool = False, columns: str = SERIES_COLUMNS) -> str:
    """The ended ``steps`` rows matching *where* with their host time
    between steps as ``between_ns`` (:data:`BETWEEN_SQL`), as a table named
    ``steps`` for a FROM clause; the step before each is found whether
    *where* holds it or not. *scan*: the rows are read whole (an aggregate
    over a window of steps): the step before from the row before; else it
    is looked up per row returned (a live read of a few rows under a LIMIT).
    *columns*: those of ``steps`` it holds."""
    prev = _PREV_T1_SCAN if scan else _PREV_T1
    return (
        f"(SELECT s.*, {BETWEEN_SQL} AS between_ns FROM "
        f"(SELECT {columns}, {prev} AS prev_t1 FROM steps WHERE {where}) s "
        "WHERE s.t1_ns IS NOT NULL) AS steps"
    )


def step_exprs(d: Dialect) -> dict[str, str]:
    """Per-step SQL expressions (ns): the iteration, each chart phase, ``other``,
    over rows of :func:`with_between` (``between_ns``)."""
    step = "(t1_ns - t0_ns)"
    named = " + ".join(_phase(d, p) for p in (*PHASES, DATA_PHASE))
    return {
        "iter": f"(COALESCE(wait_ns, 0) + between_ns + {step})",
        "loader_wait": f"(COALESCE(wait_ns, 0) + {_phase(d, DATA_PHASE)})",
        BETWEEN: "between_ns",
        **{p: _phase(d, p) for p in PHASES},
        "other": f"CASE WHEN {step} > {named} THEN {step} - ({named}) ELSE 0 END",
    }


@functools.cache
def steps_bucket_sql(d: Dialect) -> str:
    """Steps of ``(lo, width_ns, run_id, lo, hi)`` bucketed by ``t0_ns``:
    ``b``, ``t0``, ``first_step``, ``n``, ``iter_min|mean|max`` and the mean of
    each phase (ns), ``eval_n``, ``skipped_n``, the maximum of torch's
    allocated / reserved bytes."""
    e = step_exprs(d)
    phases = ", ".join(f"{_avg(e[p])} AS {p}" for p in CHART_PARTS)
    where = "run_id = ? AND t0_ns >= ? AND t0_ns < ? AND step > ?"
    return (
        "SELECT (t0_ns - ?) / ? AS b, MIN(t0_ns) AS t0, MIN(step) AS first_step, "
        f"CAST(COUNT(*) AS BIGINT) AS n, MIN({e['iter']}) AS iter_min, "
        f"{_avg(e['iter'])} AS iter_mean, MAX({e['iter']}) AS iter_max, {phases}, "
        f"{_isum('CASE WHEN COALESCE(eval_ns, 0) > 0 THEN 1 ELSE 0 END')} AS eval_n, "
        f"{_isum('CASE WHEN COALESCE(skipped, 0) != 0 THEN 1 ELSE 0 END')} AS skipped_n, "
        "MAX(mem_allocated_bytes) AS mem_alloc, MAX(mem_reserved_bytes) AS mem_reserved "
        f"FROM {with_between(where, scan=True)} GROUP BY b ORDER BY b"
    )


async def step_buckets(
    db: Reader,
    run_id: int,
    lo_ns: int,
    hi_ns: int,
    width_ns: int,
    after_step: int = -(2**62),
    from_ns: int | None = None,
) -> list[dict[str, Any]]:
    """The run's steps starting in [*lo_ns*, *hi_ns*) (monotonic ns), with an
    index above *after_step*, bucketed by *width_ns* from *lo_ns*
    (:func:`steps_bucket_sql`), by bucket; *from_ns*: read only those
    starting from then (the same buckets, fewer rows scanned)."""
    start = lo_ns if from_ns is None else max(lo_ns, from_ns)
    if await steprows.packed_in(db, run_id, start, hi_ns):
        got = await steprows.rows(
            db, run_id, first_step=after_step + 1, t0_from=start, t0_before=hi_ns
        )
        prev = await prev_t1(db, run_id, got)
        return _buckets(got, lambda r: (r[1] - lo_ns) // width_ns, prev)
    params = (lo_ns, width_ns, run_id, start, hi_ns, after_step)
    return [dict(r) for r in await db.fetchall(steps_bucket_sql(db.dialect), params)]


#: The parts an iteration stacks from, as the rows name them.
CHART_PARTS = ("loader_wait", BETWEEN, *PHASES, "other")


def live_row(r: Sequence[Any], prev_t1: int | None = None) -> dict[str, Any]:
    """A :mod:`~gpuprofd.storage.reads.steprows` row as :func:`steps_after`'s
    rows (:func:`step_exprs` worked out in Python); *prev_t1*: the previous
    step's end (ns; None: none), for its time between steps."""
    ph = r[6] or {}
    wait = r[3] or 0
    step = r[2] - r[1]
    between = between_steps_ns(prev_t1, r[1], wait, r[8], bool(r[4]))
    named = sum(float(ph.get(p) or 0) for p in (*PHASES, DATA_PHASE))
    return {
        "step": r[0],
        "t0_ns": r[1],
        "iter": wait + between + step,
        "loader_wait": wait + float(ph.get(DATA_PHASE) or 0),
        BETWEEN: between,
        **{p: float(ph.get(p) or 0) for p in PHASES},
        "other": step - named if step > named else 0,
        "eval_ns": r[8],
        "skipped": r[7],
        "mem_allocated_bytes": r[10],
        "mem_reserved_bytes": r[11],
        "traced": r[13],
    }


def live_rows(
    got: Sequence[Sequence[Any]], prev_t1: int | None = None
) -> list[tuple[Sequence[Any], dict[str, Any]]]:
    """Each ended step of *got* (steprows rows, by ``t0``) with its
    :func:`live_row`, the time between steps from the step before it in
    *got* (the first: from *prev_t1*, ns)."""
    out = []
    for r in got:
        if r[2] is not None:
            out.append((r, live_row(r, prev_t1)))
        prev_t1 = r[2]
    return out


async def prev_t1(db: Reader, run_id: int, got: Sequence[Sequence[Any]]) -> int | None:
    """The end (ns) of the step before the first of *got* (steprows rows, by
    ``t0``), packed or not: the one with the index before (as
    :data:`_PREV_T1` finds it); None: none, or *got* is empty."""
    if not got or got[0][1] is None:
        return None
    i = got[0][0]
    before = await steprows.rows(db, run_id, first_step=i - 1, last_step=i - 1)
    return before[-1][2] if before else None


def _buckets(
    got: Sequence[Sequence[Any]],
    key: Callable[[Sequence[Any]], int],
    prev: int | None = None,
) -> list[dict[str, Any]]:
    """Ended steps (:mod:`~gpuprofd.storage.reads.steprows` rows, by ``t0``)
    bucketed by *key* as :func:`steps_bucket_sql` buckets them (and
    :func:`step_index_bucket_sql`'s columns), by bucket; *prev*: the end of
    the step before the first (ns)."""
    held: dict[int, list[tuple[Sequence[Any], dict[str, Any]]]] = {}
    for r, x in live_rows(got, prev):
        held.setdefault(key(r), []).append((r, x))
    out = []
    for b in sorted(held):
        rows = [r for r, _ in held[b]]
        live = [x for _, x in held[b]]
        its = [x["iter"] for x in live]
        allocs = [r[10] for r in rows if r[10] is not None]
        resvs = [r[11] for r in rows if r[11] is not None]
        out.append(
            {
                "b": b,
                "t0": min(r[1] for r in rows),
                "first_step": min(r[0] for r in rows),
                "n": len(rows),
                "iter_min": min(its),
                "iter_mean": _fmean(its),
                "iter_max": max(its),
                **{p: _fmean(x[p] for x in live) for p in CHART_PARTS},
                "eval_n": sum(1 for r in rows if (r[8] or 0) > 0),
                "skipped_n": sum(1 for r in rows if (r[7] or 0) != 0),
                "mem_alloc": max(allocs, default=None),
                "mem_reserved": max(resvs, default=None),
            }
        )
    return out


#: ``gpu_rollups`` columns a chart reads, each merged over a bucket's rows as
#: :data:`gpuprofd.sampling.rollup.MERGED_SQL` merges a window's.
GPU_CHART_COLUMNS = (
    "util_min",
    "util_mean",
    "util_max",
    "mem_used_min",
    "mem_used_mean",
    "mem_used_max",
    "mem_total_bytes",
    "power_min_mw",
    "power_mean_mw",
    "power_max_mw",
    "temp_min_c",
    "temp_mean_c",
    "temp_max_c",
    "sm_min_mhz",
    "sm_mean_mhz",
    "sm_max_mhz",
    "pcie_rx_max_bps",
    "pcie_tx_max_bps",
    "gpm_sm_occupancy_mean",
    "gpm_tensor_util_mean",
    "gpm_dram_bw_util_mean",
)
GPU_ROLLUP_BUCKET_SQL = (
    "SELECT (sec_ns - ?) / ? AS b, MIN(sec_ns) AS t, "
    + ", ".join(f"{rollup.merge_expr(c)} AS {c}" for c in GPU_CHART_COLUMNS)
    + " FROM gpu_rollups WHERE uuid = ? AND boot_key = COALESCE(?, '') "
    "AND sec_ns >= ? AND sec_ns < ? GROUP BY b ORDER BY b"
)
_NORM_UUID = schema._norm_uuid_sql("uuid")
_FAST = (
    ("util", "util_pct"),
    ("mem_used", "mem_used_bytes"),
    ("power", "power_mw"),
    ("temp", "temp_c"),
    ("sm", "sm_clock_mhz"),
)
_UNIT = {"power": "_mw", "temp": "_c", "sm": "_mhz"}


def _fast_cols(name: str, col: str) -> str:
    unit = _UNIT.get(name, "")
    return (
        f"MIN({col}) AS {name}_min{unit}, {_avg(col)} AS {name}_mean{unit}, "
        f"MAX({col}) AS {name}_max{unit}"
    )


GPU_RAW_BUCKET_SQL = (
    "SELECT (mono_ns - ?) / ? AS b, MIN(mono_ns) AS t, "
    + ", ".join(_fast_cols(n, c) for n, c in _FAST)
    + ", MAX(mem_total_bytes) AS mem_total_bytes FROM gpu_samples "
    f"WHERE {_NORM_UUID} = ? AND mono_ns >= ? AND mono_ns < ? "
    "GROUP BY b ORDER BY b"
)
GPU_SLOW_BUCKET_SQL = (
    "SELECT (mono_ns - ?) / ? AS b, MAX(pcie_rx_bps) AS pcie_rx_max_bps, "
    "MAX(pcie_tx_bps) AS pcie_tx_max_bps, "
    f"{_avg('gpm_sm_occupancy_pct')} AS gpm_sm_occupancy_mean, "
    f"{_avg('gpm_tensor_util_pct')} AS gpm_tensor_util_mean, "
    f"{_avg('gpm_dram_bw_util_pct')} AS gpm_dram_bw_util_mean FROM gpu_slow_samples "
    f"WHERE {_NORM_UUID} = ? AND mono_ns >= ? AND mono_ns < ? "
    "GROUP BY b ORDER BY b"
)
#: The oldest raw fast-loop row of a GPU (raw rows are kept for a recent window).
GPU_RAW_START_SQL = f"SELECT MIN(mono_ns) AS t FROM gpu_samples WHERE {_NORM_UUID} = ?"


async def gpu_rollup_buckets(
    db: Reader, uuid: str, boot_id: str | None, lo_ns: int, hi_ns: int, width_ns: int
) -> list[dict[str, Any]]:
    """GPU *uuid*'s (normalized) per-second rollups of boot *boot_id* in
    [*lo_ns*, *hi_ns*) merged per bucket (:data:`GPU_ROLLUP_BUCKET_SQL`)."""
    params = (lo_ns, width_ns, uuid, boot_id, lo_ns, hi_ns)
    return [dict(r) for r in await db.fetchall(GPU_ROLLUP_BUCKET_SQL, params)]


async def gpu_raw_start(db: Reader, uuid: str) -> int | None:
    """The oldest raw fast-loop sample of GPU *uuid* still stored (monotonic ns)."""
    row = await db.fetchone(GPU_RAW_START_SQL, (uuid,))
    return None if row is None or row["t"] is None else int(row["t"])


async def gpu_raw_buckets(
    db: Reader, uuid: str, lo_ns: int, hi_ns: int, width_ns: int
) -> list[dict[str, Any]]:
    """GPU *uuid*'s raw fast and slow samples in [*lo_ns*, *hi_ns*) per
    bucket, in the column names of :data:`GPU_ROLLUP_BUCKET_SQL`: each slow
    loop reading (≤ 1 Hz) sits in the fast bucket nearest it
    (:func:`join_slow_buckets`); None where a bucket has none."""
    params = (lo_ns, width_ns, uuid, lo_ns, hi_ns)
    fast = [dict(r) for r in await db.fetchall(GPU_RAW_BUCKET_SQL, params)]
    slow = [dict(r) for r in await db.fetchall(GPU_SLOW_BUCKET_SQL, params)]
    return join_slow_buckets(fast, slow)


def _fmean(values: Any) -> float:
    """``statistics.fmean(values)``, imported on first use: ``gpuprofctl
    insights`` imports this module but draws no chart (statistics brings
    decimal and fractions, ~6 ms of a cold start)."""
    import statistics

    return statistics.fmean(values)


#: The slow loop's columns of a chart row, and how two readings landing in
#: one fast bucket merge: a PCIe peak stays a peak, a GPM ratio averages.
SLOW_MERGE = {
    "pcie_rx_max_bps": max,
    "pcie_tx_max_bps": max,
    "gpm_sm_occupancy_mean": _fmean,
    "gpm_tensor_util_mean": _fmean,
    "gpm_dram_bw_util_mean": _fmean,
}


def join_slow_buckets(
    fast: Sequence[dict[str, Any]], slow: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Fast-loop bucket rows (sorted by ``b``) with each slow-loop bucket row
    merged into the fast bucket nearest its ``b`` (:data:`SLOW_MERGE`).

    The fast loop is stored at 10 Hz and the slow one samples at 1 Hz, so at
    a fine bucket width a slow reading rarely shares its exact bucket with a
    fast one: joining on equal ``b`` left the PCIe chart empty while the PCIe
    finding read the same rows. A slow reading with no fast bucket within the
    window is dropped (no fast row to carry it)."""
    out = [{**dict.fromkeys(SLOW_MERGE), **f} for f in fast]
    if not out:
        return out
    keys = [f["b"] for f in out]
    held: dict[int, dict[str, list[float]]] = {}
    for s in slow:
        i = bisect.bisect_left(keys, s["b"])
        if i == len(keys) or (i > 0 and s["b"] - keys[i - 1] <= keys[i] - s["b"]):
            i -= 1
        cols = held.setdefault(i, {})
        for col in SLOW_MERGE:
            if s.get(col) is not None:
                cols.setdefault(col, []).append(s[col])
    for i, cols in held.items():
        out[i].update({col: SLOW_MERGE[col](vs) for col, vs in cols.items()})
    return out


#: Host samples of a boot with the run's own CPU at the same tick (the host
#: sampler samples each live run at its ``mono_ns``): ``run_cores``, and
#: ``other_cores`` (the machine's busy cores less the run's). Params: the run,
#: the boot, the window's start and end (monotonic ns, end excluded).
HOST_ROW_SQL = (
    "SELECT h.mono_ns AS mono_ns, h.cpu_count AS cpu_count, COALESCE(r.cores, 0) AS run_cores, "
    "CAST(h.cpu_pct AS DOUBLE PRECISION) * h.cpu_count / 100.0 - COALESCE(r.cores, 0) "
    "AS other_cores, "
    "h.disk_read_bps AS disk_read_bps, h.page_cache_bytes AS page_cache_bytes "
    "FROM host_samples h LEFT JOIN run_cpu_samples r ON r.mono_ns = h.mono_ns AND r.run_id = ? "
    "WHERE h.boot_id IS NOT DISTINCT FROM ? AND h.mono_ns >= ? AND h.mono_ns < ?"
)
#: The host readings a chart shows (:data:`HOST_ROW_SQL`'s names).
HOST_METRICS = ("run_cores", "other_cores", "disk_read_bps", "page_cache_bytes")


def host_stats_sql(col: str) -> str:
    """``{col}_min``, ``_max``, ``_sum`` and ``_n`` (the samples that had it) of
    *col* over a group of rows: what buckets and blocks of host samples keep
    (a mean is sum / n, so blocks merge exactly)."""
    return (
        f"MIN({col}) AS {col}_min, MAX({col}) AS {col}_max, "
        f"CAST(SUM({_F.format(col)}) AS DOUBLE PRECISION) AS {col}_sum, "
        f"CAST(COUNT({col}) AS BIGINT) AS {col}_n"
    )


HOST_BUCKET_SQL = (
    "SELECT (mono_ns - ?) / ? AS b, MIN(mono_ns) AS t, MAX(cpu_count) AS cpu_count, "
    "CAST(COUNT(*) AS BIGINT) AS n, "
    + ", ".join(host_stats_sql(c) for c in HOST_METRICS)
    + f" FROM ({HOST_ROW_SQL}) AS hs GROUP BY b ORDER BY b"
)


async def host_buckets(
    db: Reader,
    run_id: int,
    boot_id: str | None,
    lo_ns: int,
    width_ns: int,
    start_ns: int,
    end_ns: int,
) -> list[dict[str, Any]]:
    """The host's samples of boot *boot_id* in [*start_ns*, *end_ns*), with
    run *run_id*'s CPU, in buckets of *width_ns* from *lo_ns*: per reading
    its min, max, sum and count (:data:`HOST_BUCKET_SQL`; where a packed
    block of samples lies in the window, the samples read through
    :mod:`~gpuprofd.storage.reads.samplerows` and bucketed the same way)."""
    if await host_packed(db, run_id, boot_id, start_ns, end_ns - 1):
        rows = await host_rows(db, run_id, boot_id, start_ns, end_ns - 1)
        return host_bucketed(rows, lo_ns, width_ns)
    params = (lo_ns, width_ns, run_id, boot_id, start_ns, end_ns)
    return [dict(r) for r in await db.fetchall(HOST_BUCKET_SQL, params)]


async def host_packed(db: Reader, run_id: int, boot_id: str | None, lo: int, hi: int) -> bool:
    """Whether the host or run CPU samples in [*lo*, *hi*] are packed in part."""
    return await samplerows.packed_in(
        db, samplerows.HOST, boot_id, lo, hi
    ) or await samplerows.packed_in(db, samplerows.RUN_CPU, run_id, lo, hi)


async def host_rows(
    db: Reader, run_id: int, boot_id: str | None, lo: int, hi: int
) -> list[dict[str, Any]]:
    """:data:`HOST_ROW_SQL`'s rows of [*lo*, *hi*] (ns, both included), by
    time, from the samples packed or not: the run's cores at each host
    sample's time (0: not sampled then; a number as SQLite's ``COALESCE``
    gives it) and the other cores busy."""
    host = await samplerows.read(db, samplerows.HOST, boot_id, lo, hi)
    cpu = await samplerows.read(db, samplerows.RUN_CPU, run_id, lo, hi)
    zero: float = 0 if db.dialect.name == "sqlite" else 0.0
    cores = dict(zip(cpu.column("mono_ns"), cpu.column("cores"), strict=True))
    out = []
    cols = (host.column(c) for c in ("mono_ns", "cpu_count", "cpu_pct", "disk_read_bps"))
    for t, count, pct, disk, cache in zip(*cols, host.column("page_cache_bytes"), strict=True):
        own = cores.get(t)
        own = zero if own is None else own
        other = None if pct is None or count is None else float(pct) * count / 100.0 - own
        out.append(
            {
                "mono_ns": t,
                "cpu_count": count,
                "run_cores": own,
                "other_cores": other,
                "disk_read_bps": disk,
                "page_cache_bytes": cache,
            }
        )
    return out


def host_bucketed(
    rows: Sequence[dict[str, Any]], lo_ns: int, width_ns: int
) -> list[dict[str, Any]]:
    """:func:`host_rows` rows in :data:`HOST_BUCKET_SQL`'s buckets and columns."""
    held: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        d = r["mono_ns"] - lo_ns  # SQL divides integers toward zero
        held.setdefault(d // width_ns if d >= 0 else -(-d // width_ns), []).append(r)
    out = []
    for b in sorted(held):
        its = held[b]
        counts = [r["cpu_count"] for r in its if r["cpu_count"] is not None]
        row: dict[str, Any] = {
            "b": b,
            "t": min(r["mono_ns"] for r in its),
            "cpu_count": max(counts) if counts else None,
            "n": len(its),
        }
        for m in HOST_METRICS:
            vals = [r[m] for r in its if r[m] is not None]
            row[f"{m}_min"] = min(vals) if vals else None
            row[f"{m}_max"] = max(vals) if vals else None
            row[f"{m}_sum"] = samplerows.sum_in_order(vals) if vals else None
            row[f"{m}_n"] = len(vals)
        out.append(row)
    return out


# --- a run's GPUs ---------------------------------------------------------------

#: The GPUs (normalized UUIDs) with rollups of a boot in [lo, hi]: each GPU
#: of the boot (``gpus``), then whether it has a row in the window (a range
#: of ``gpu_seconds``' key), so the work grows with the GPUs, not with a day
#: of their rows.
RUN_GPUS_SQL = (
    "SELECT g.uuid FROM gpus g WHERE EXISTS (SELECT 1 FROM gpu_seconds r "
    "WHERE r.gpu = g.id AND r.sec_ns >= ? AND r.sec_ns <= ?) "
    "AND g.boot_id = COALESCE(?, '') ORDER BY g.uuid"
)
#: A GPU's memory size as its latest rollup (of its latest boot with one) says
#: it (the key finds it: a maximum over a day's rollups reads 86,400 rows).
GPU_TOTAL_SQL = (
    "SELECT m FROM (SELECT g.id, (SELECT s.mem_total_bytes FROM gpu_seconds s WHERE "
    "s.gpu = g.id AND s.mem_total_bytes IS NOT NULL ORDER BY s.sec_ns DESC LIMIT 1) AS m "
    "FROM gpus g WHERE g.uuid = ?) x WHERE m IS NOT NULL ORDER BY id DESC LIMIT 1"
)


async def sampled_gpus(
    db: Reader, boot_id: str | None, lo_ns: int, hi_ns: int
) -> list[dict[str, Any]]:
    """The GPUs (normalized ``uuid``, ``mem_total_bytes``) with rollups of
    boot *boot_id* in [*lo_ns*, *hi_ns*], by UUID."""
    rows = await db.fetchall(RUN_GPUS_SQL, (lo_ns, hi_ns, boot_id))
    return [
        {"uuid": r["uuid"], "mem_total_bytes": await gpu_mem_total(db, r["uuid"])} for r in rows
    ]


async def gpu_mem_total(db: Reader, uuid: str) -> int | None:
    """GPU *uuid*'s memory size (bytes) as its latest rollup recorded it."""
    row = await db.fetchone(GPU_TOTAL_SQL, (uuid,))
    return None if row is None or row["m"] is None else int(row["m"])


# --- compare: step time by step index --------------------------------------------


@functools.cache
def step_index_bucket_sql(d: Dialect) -> str:
    """Steps of ``(k, run_id)`` bucketed by ``step / k``: first step, the
    iteration's mean, min and max (ns)."""
    it = step_exprs(d)["iter"]
    where = "run_id = ? AND step >= 0"
    return (
        f"SELECT step / ? AS b, MIN(step) AS step, {_avg(it)} AS iter_mean, "
        f"MIN({it}) AS iter_min, MAX({it}) AS iter_max "
        f"FROM {with_between(where, scan=True, columns=ITER_COLUMNS)} "
        "GROUP BY b ORDER BY b"
    )


async def step_index_buckets(db: Reader, run_id: int, per_bucket: int) -> list[dict[str, Any]]:
    """The run's iteration times in buckets of *per_bucket* step indices."""
    if await steprows.packed_in(db, run_id):
        got = await steprows.rows(db, run_id, first_step=0)
        cols = ("b", "iter_mean", "iter_min", "iter_max")
        return [
            {"step": b["first_step"], **{c: b[c] for c in cols}}
            for b in _buckets(got, lambda r: r[0] // per_bucket)
        ]
    sql = step_index_bucket_sql(db.dialect)
    return [dict(r) for r in await db.fetchall(sql, (per_bucket, run_id))]


# --- live: rows newer than a cursor ---------------------------------------------


def _live_step_cols(d: Dialect) -> str:
    """A live step row's columns: index, start, iteration and each chart phase
    (ns), evaluation before it, skipped update, torch's memory, traced."""
    e = step_exprs(d)
    cols = ", ".join(f"{e[p]} AS {p}" for p in CHART_PARTS)
    return (
        f"step, t0_ns, {e['iter']} AS iter, {cols}, eval_ns, skipped, "
        "mem_allocated_bytes, mem_reserved_bytes, traced"
    )


@functools.cache
def steps_after_sql(d: Dialect) -> str:
    return (
        f"SELECT {_live_step_cols(d)} FROM "
        f"{with_between('run_id = ? AND step > ?')} ORDER BY step LIMIT ?"
    )


async def steps_after(db: Reader, run_id: int, step: int, limit: int) -> list[dict[str, Any]]:
    """The run's steps with index > *step*, by index, at most *limit*."""
    end = await steprows.packed_end(db, run_id)
    if end is not None and step + 1 < end:  # from packed blocks on: a stretch of indices
        top = await steprows.max_step(db, run_id) or step
        span = max(limit, 1)
        while True:  # at a time, wider while gaps in the indices leave it short
            # from the cursor's own step: the first new step's time between steps
            raw = await steprows.rows(db, run_id, first_step=step, last_step=step + span)
            got = [(r, x) for r, x in live_rows(raw) if r[0] > step]
            if len(got) >= limit or step + span >= top:
                break
            span *= 4
        got.sort(key=lambda rx: rx[0][0])
        return [x for _, x in got[:limit]]
    sql = steps_after_sql(db.dialect)
    return [dict(r) for r in await db.fetchall(sql, (run_id, step, limit))]


@functools.cache
def steps_last_sql(d: Dialect) -> str:
    return (
        f"SELECT {_live_step_cols(d)} FROM {with_between('run_id = ?')} ORDER BY step DESC LIMIT ?"
    )


async def steps_last(db: Reader, run_id: int, limit: int) -> list[dict[str, Any]]:
    """The run's last *limit* ended steps (as :func:`steps_after`'s rows), by
    index: the ``(run_id, step)`` index read backwards."""
    if await steprows.packed_end(db, run_id) is not None:
        got = await steprows.last_rows(db, run_id, limit * 2 + 1, by_step=True)
        return [x for _, x in live_rows(got)][-limit:]
    rows = await db.fetchall(steps_last_sql(db.dialect), (run_id, limit))
    return [dict(r) for r in reversed(rows)]


#: How many steps a run stored with an index above a cursor, and the highest:
#: a range of the ``(run_id, step)`` index, so a live count costs the new steps only.
STEPS_SINCE_SQL = (
    "SELECT CAST(COUNT(*) AS BIGINT) AS n, MAX(step) AS top FROM steps "
    "WHERE run_id = ? AND step > ?"
)


async def steps_since(db: Reader, run_id: int, step: int) -> tuple[int, int | None]:
    """(steps of the run with index > *step*, the highest index; None: none)."""
    if await steprows.packed_end(db, run_id) is not None:
        return await steprows.count_after(db, run_id, step)
    row = await db.fetchone(STEPS_SINCE_SQL, (run_id, step))
    if row is None or not row["n"]:
        return 0, None
    return int(row["n"]), int(row["top"])


def _in(n: int) -> str:
    return ", ".join("?" * n)


async def gpu_samples_after(
    db: Reader, uuids: Sequence[str], mono_ns: int, limit: int, until_ns: int | None = None
) -> list[dict[str, Any]]:
    """Raw fast-loop samples of the GPUs *uuids* (normalized) newer than
    *mono_ns* (and not after *until_ns*: an ended run's end), by time, at most *limit*."""
    if not uuids:
        return []
    sql = (
        f"SELECT mono_ns, {_NORM_UUID} AS uuid, util_pct, mem_used_bytes, power_mw, temp_c, "
        f"sm_clock_mhz FROM gpu_samples WHERE mono_ns > ? AND mono_ns <= ? "
        f"AND {_NORM_UUID} IN ({_in(len(uuids))}) ORDER BY mono_ns LIMIT ?"
    )
    params = (mono_ns, until_ns or 2**62, *uuids, limit)
    return [dict(r) for r in await db.fetchall(sql, params)]


async def host_samples_after(
    db: Reader,
    run_id: int,
    boot_id: str | None,
    mono_ns: int,
    limit: int,
    until_ns: int | None = None,
) -> list[dict[str, Any]]:
    """Host samples of boot *boot_id* newer than *mono_ns* (not after
    *until_ns*) with run *run_id*'s CPU (:data:`HOST_ROW_SQL`), by time, at most *limit*."""
    hi = until_ns or 2**62
    if await host_packed(db, run_id, boot_id, mono_ns + 1, hi):
        return (await host_rows(db, run_id, boot_id, mono_ns + 1, hi))[:limit]
    sql = f"{HOST_ROW_SQL} ORDER BY h.mono_ns LIMIT ?"
    params = (run_id, boot_id, mono_ns + 1, hi + 1, limit)
    return [dict(r) for r in await db.fetchall(sql, params)]


# --- live: the latest readings of a node (``gpuprofctl top``) ---------------------

#: A boot's latest host sample in a window (the ``mono_ns`` index read backwards).
LATEST_HOST_SQL = (
    "SELECT mono_ns, cpu_pct, cpu_count FROM host_samples "
    "WHERE boot_id IS NOT DISTINCT FROM ? AND mono_ns >= ? AND mono_ns <= ? "
    "ORDER BY mono_ns DESC LIMIT 1"
)


async def latest_host(
    db: Reader, boot_id: str | None, lo_ns: int, hi_ns: int
) -> dict[str, Any] | None:
    """Boot *boot_id*'s latest host sample in [*lo_ns*, *hi_ns*] (monotonic
    ns): ``mono_ns``, ``cpu_pct`` (0-100 of every core), ``cpu_count``; None:
    none. A boot's newest samples are rows: packed ones are read only where
    the window ends before them."""
    row = await db.fetchone(LATEST_HOST_SQL, (boot_id, lo_ns, hi_ns))
    if row is not None and not await samplerows.packed_in(
        db, samplerows.HOST, boot_id, int(row["mono_ns"]) + 1, hi_ns
    ):
        return dict(row)
    got = await samplerows.read(db, samplerows.HOST, boot_id, lo_ns, hi_ns)
    if not got.n:
        return None
    return {c: got.column(c)[-1] for c in ("mono_ns", "cpu_pct", "cpu_count")}


async def run_cores_at(db: Reader, run_ids: Sequence[int], mono_ns: int) -> dict[int, float]:
    """Each of *run_ids*' CPU (cores busy: its process tree's) at the host
    sample of *mono_ns*, packed or not; a run not sampled then is left out."""
    out = {}
    for rid in run_ids:
        got = await samplerows.read(db, samplerows.RUN_CPU, rid, mono_ns, mono_ns)
        cores = [c for c in got.column("cores") if c is not None]
        if cores:
            out[rid] = float(cores[-1])
    return out


#: A GPU's latest per-second rollup of a boot from a time on (the ``(uuid,
#: sec_ns)`` index read backwards).
LATEST_GPU_SQL = (
    "SELECT sec_ns, util_mean, mem_used_max, mem_total_bytes, power_mean_mw, temp_max_c, "
    "sm_mean_mhz, sm_limit_mhz FROM gpu_rollups WHERE uuid = ? "
    "AND boot_key = COALESCE(?, '') AND sec_ns >= ? ORDER BY sec_ns DESC LIMIT 1"
)


async def latest_gpu(
    db: Reader, uuid: str, boot_id: str | None, lo_ns: int
) -> dict[str, Any] | None:
    """GPU *uuid*'s (normalized) latest per-second rollup of boot *boot_id*
    from *lo_ns* (monotonic ns) on: the second's start ``sec_ns``, mean
    utilization (%), most memory used (bytes), its memory, mean power (mW),
    hottest reading (°C), mean and maximum SM clock (MHz); None: none since."""
    row = await db.fetchone(LATEST_GPU_SQL, (uuid, boot_id, lo_ns))
    return None if row is None else dict(row)
