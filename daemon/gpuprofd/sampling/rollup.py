"""Per-second GPU rollups: the tier of GPU samples kept for a whole run.

The fast loop samples each GPU at ``sample_hz`` (100 Hz by default); raw
rows are kept only for a recent window (see ``gpuprofd.retention``). Every
sample also goes into its GPU's open :class:`~gpuprof.insights.gpu.GpuAccumulator`
for the current second; when a GPU's samples move into the next second the
finished one becomes a ``gpu_rollups`` row: min/mean/max of each reading plus
the counts the GPU rules need (idle, power-capped and thermally slowed
samples), so merging a run's rows gives the same :class:`GpuStats` as its raw
samples. Slow-loop samples (≤ 1 Hz: PCIe bytes, GPM) join the open second of
their GPU.

Pure: no I/O. The daemon stores :func:`rollup_params`; readers rebuild with
:func:`accumulator_from_row`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuprof.insights.aggregates import BYTES_PER_KB
from gpuprof.insights.gpu import GpuAccumulator, MinMeanMax
from gpuprofd.sampling.nvml import GpuDevice, GpuSample, GpuSlowSample, normalize_uuid

NS_PER_S = 1_000_000_000

#: ``gpu_rollups`` columns, in insert order (see ``schema.SCHEMA_SQL``).
ROLLUP_COLUMNS = (
    "sec_ns",
    "uuid",
    "n",
    "util_min",
    "util_mean",
    "util_max",
    "idle_n",
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
    "sm_active_max_mhz",
    "sm_limit_mhz",
    "mem_util_mean",
    "reasons_n",
    "reasons_any",
    "capped_n",
    "capped_sm_mean_mhz",
    "thermal_n",
    "thermal_sm_mean_mhz",
    "slow_n",
    "pcie_rx_max_bps",
    "pcie_tx_max_bps",
    "gpm_sm_util_mean",
    "gpm_sm_occupancy_mean",
    "gpm_tensor_util_mean",
    "gpm_dram_bw_util_mean",
    "boot_id",
)
#: Means over the ``n`` fast samples stored as their totals (``<reading>_total``):
#: an NVML reading is an integer, so is its total, which SQLite stores in a few
#: bytes where a mean takes eight. The ``gpu_rollups`` view divides again:
#: the same division the accumulator made, so the same mean. With ``n`` 0
#: (no utilization reading, e.g. a MIG instance) the column holds the mean.
TOTALS = {
    "util_mean": "util_total",
    "mem_used_mean": "mem_used_total",
    "power_mean_mw": "power_total_mw",
    "temp_mean_c": "temp_total_c",
    "sm_mean_mhz": "sm_total_mhz",
    "mem_util_mean": "mem_util_total",
}
#: ``gpu_seconds`` columns (the stored rows behind the ``gpu_rollups`` view):
#: the GPU's UUID and boot are its ``gpus`` row's.
#: Kept once per GPU and boot, in its ``gpus`` row: the GPU's max SM clock (NVML's).
_PER_GPU = ("uuid", "boot_id", "sm_limit_mhz")
SECONDS_COLUMNS = tuple(TOTALS.get(c, c) for c in ROLLUP_COLUMNS if c not in _PER_GPU)
#: A total with a minimum and maximum is left NULL when they are equal (every
#: sample read the same: the mean is the minimum), as memory and clocks are
#: within most seconds.
_LIMITS = {
    total: (mean.replace("_mean", "_min"), mean.replace("_mean", "_max"))
    for mean, total in TOTALS.items()
    if mean != "mem_util_mean"
}
_PER_ROW = "CASE WHEN {t}n > 1 THEN {t}n ELSE 1 END"  # what a row's total is divided by


def stored_total_sql(total: str, table: str = "") -> str:
    """SQL for the :data:`TOTALS` column *total* of a ``gpu_seconds`` row of
    *table*, the one left out (see ``_LIMITS``) as its minimum times n."""
    t = f"{table}." if table else ""
    if total not in _LIMITS:
        return f"{t}{total}"
    return f"COALESCE({t}{total}, {t}{_LIMITS[total][0]} * {_PER_ROW.format(t=t)})"


def view_mean_sql(mean: str, table: str = "s") -> str:
    """SQL for the mean *mean* (a :data:`TOTALS` key) of a ``gpu_seconds`` row."""
    total, t = TOTALS[mean], f"{table}."
    divided = f"{t}{total} / {_PER_ROW.format(t=t)}"
    return f"COALESCE({divided}, {t}{_LIMITS[total][0]})" if total in _LIMITS else divided


def _total(mean: float | None, n: int | None) -> float | None:
    """A mean over *n* samples as stored (:data:`TOTALS`): the integer total
    it was divided from when it is one (mean times n is off by an ulp or two)."""
    if mean is None:
        return None
    total = mean * n if n and n > 1 else mean
    near = round(total)
    return float(near) if abs(total - near) <= 4 * math.ulp(total) else total


#: The ``gpus`` row of a GPU of a boot, made once (:func:`gpu_rows`): ``(uuid,
#: boot key, max SM clock)``; a clock learnt later fills one not known.
GPU_SQL = (
    "INSERT INTO gpus (uuid, boot_id, sm_limit_mhz) VALUES (?, ?, ?) "
    "ON CONFLICT (uuid, boot_id) DO UPDATE SET sm_limit_mhz = excluded.sm_limit_mhz "
    "WHERE gpus.sm_limit_mhz IS NULL AND excluded.sm_limit_mhz IS NOT NULL"
)
#: The ``gpu_rollups`` view's columns (:data:`ROLLUP_COLUMNS`, then ``boot_key``
#: and the totals) from ``gpu_seconds s JOIN gpus g``.
VIEW_COLUMNS_SQL = ", ".join(
    [
        "g.uuid"
        if c == "uuid"
        else "g.sm_limit_mhz"
        if c == "sm_limit_mhz"
        else "NULLIF(g.boot_id, '') AS boot_id"
        if c == "boot_id"
        else f"{view_mean_sql(c)} AS {c}"
        if c in TOTALS
        else f"s.{c}"
        for c in ROLLUP_COLUMNS
    ]
    + ["g.boot_id AS boot_key"]
    + [f"{stored_total_sql(t, 's')} AS {t}" for t in TOTALS.values()]
)
#: (``boot_key``: the view's boot with '' for none, so that one ``gpus`` row
#: matches and its seconds come in key order, unsorted)
_WHERE = "WHERE uuid = ? AND boot_key = COALESCE(?, '') AND sec_ns > ? AND sec_ns < ?"
#: A run's rollups: its GPU (normalized UUID) in its boot, the seconds that
#: overlap a window [t0, t1) of monotonic ns (pass t0 - :data:`NS_PER_S` and t1).
SELECT_SQL = f"SELECT {', '.join(ROLLUP_COLUMNS)} FROM gpu_rollups {_WHERE} ORDER BY sec_ns"


def _weighted(col: str, weight: str) -> str:
    # NULLIF: Postgres raises on / 0 where SQLite gives NULL
    return (
        f"CAST(SUM({col} * {weight}) AS DOUBLE PRECISION) / "
        f"CAST(NULLIF(SUM(CASE WHEN {col} IS NOT NULL THEN {weight} END), 0) "
        "AS DOUBLE PRECISION)"
    )


def _merge_rule(col: str) -> tuple[str, str]:
    """How *col* merges over rollup rows: (key | sum | or | min | max | mean, weight column)."""
    if col in ("sec_ns", "uuid", "boot_id"):
        return "key", ""
    if col.endswith("_n") or col == "n":
        return "sum", ""
    if col == "reasons_any":
        return "or", ""
    if col.startswith("capped_sm") or col.startswith("thermal_sm"):
        return "mean", col.split("_sm")[0] + "_n"
    if col.startswith("gpm_"):
        return "mean", "slow_n"
    if "_min" in col:
        return "min", ""
    if "_max" in col or col in ("mem_total_bytes", "sm_limit_mhz"):
        return "max", ""
    if "_mean" in col:
        return "mean", "n"
    raise ValueError(f"no merge rule for gpu_rollups.{col}")


def merge_expr(col: str) -> str:
    """SQL that merges *col* over many rollup rows into one (see :data:`MERGED_SQL`)."""
    if col in TOTALS:  # the totals summed (a row's mean times n), a row of n 0 weighing nothing
        total = TOTALS[col]
        return (
            f"CAST(SUM(CASE WHEN n > 0 THEN {total} END) AS DOUBLE PRECISION) / "
            f"CAST(NULLIF(SUM(CASE WHEN {total} IS NOT NULL THEN n END), 0) AS DOUBLE PRECISION)"
        )
    kind, weight = _merge_rule(col)
    if kind == "key":
        return f"MIN({col})"
    if kind == "sum":  # an integer (Postgres sums to numeric)
        return f"CAST(SUM({col}) AS BIGINT)"
    if kind == "or":  # SQLite has no bitwise-OR aggregate: OR each bit's MAX
        return " | ".join(f"MAX({col} & {1 << b})" for b in range(32))
    if kind == "mean":
        return _weighted(col, weight)
    return f"{kind.upper()}({col})"


def pair_merge_expr(col: str, old: str, new: str) -> str:
    """SQL merging ``gpu_seconds`` column *col* of row *old* with *new* (two
    rows of one second, as :func:`merge_expr` merges many): NULL is no
    reading, the other side kept."""
    a, b = f"{old}.{col}", f"{new}.{col}"
    if col in TOTALS.values():  # totals add up; a mean (n 0) weighs nothing
        a, b = stored_total_sql(col, old), stored_total_sql(col, new)
        na, nb = f"COALESCE({old}.n, 0)", f"COALESCE({new}.n, 0)"
        both = f"CASE WHEN {a} IS NULL THEN {b} WHEN {b} IS NULL THEN {a} ELSE {a} + {b} END"
        return (
            f"CASE WHEN {na} = 0 AND {nb} = 0 THEN COALESCE({a}, {b}) WHEN {na} = 0 THEN {b} "
            f"WHEN {nb} = 0 THEN {a} ELSE {both} END"
        )
    kind, weight = _merge_rule(col)
    if kind == "sum":
        both = f"{a} + {b}"
    elif kind == "or":
        both = f"{a} | {b}"
    elif kind in ("min", "max"):
        both = f"CASE WHEN {a} {'<=' if kind == 'min' else '>='} {b} THEN {a} ELSE {b} END"
    elif kind == "mean":
        wa, wb = f"COALESCE({old}.{weight}, 0)", f"COALESCE({new}.{weight}, 0)"
        both = f"COALESCE(({a} * {wa} + {b} * {wb}) / NULLIF({wa} + {wb}, 0), {a})"
    else:
        raise ValueError(f"gpu_rollups.{col} is a key")
    return f"CASE WHEN {a} IS NULL THEN {b} WHEN {b} IS NULL THEN {a} ELSE {both} END"


#: :data:`_WHERE` with numbered parameters (``?1`` .. ``?4``), for a statement
#: that filters the same window twice.
_WHERE_NUMBERED = "WHERE uuid = ?1 AND boot_key = COALESCE(?2, '') AND sec_ns > ?3 AND sec_ns < ?4"


#: Columns :meth:`gpuprof.insights.gpu.GpuAccumulator.stats` does not read
#: (minima, the SM clock's mean and max, the memory controller's mean):
#: :data:`MERGED_SQL` leaves them NULL, a fifth less work on a day's seconds.
#: The means whose maxima it reads stay (a mean makes a reading present).
STATS_UNREAD = frozenset(
    {"util_min", "mem_used_min", "power_min_mw", "temp_min_c", "sm_min_mhz", "sm_mean_mhz",
     "sm_max_mhz", "mem_util_mean"}
)  # fmt: skip


def _merged_expr(col: str) -> str:
    """:func:`merge_expr` of *col* in :data:`MERGED_SQL`: NULL for
    :data:`STATS_UNREAD`; ``reasons_any``'s bitwise OR over the window's
    distinct masks (a handful), not over every row (32 bit tests a row: a
    third of a day's merge)."""
    if col in STATS_UNREAD:
        return "NULL"
    if col != "reasons_any":
        return merge_expr(col)
    return (
        f"(SELECT {merge_expr(col)} FROM (SELECT DISTINCT {col} FROM gpu_rollups "
        f"{_WHERE_NUMBERED}) AS masks)"
    )


#: The same window merged by the database into one rollup-shaped row (a rollup of
#: rollups) with what :class:`~gpuprof.insights.aggregates.GpuStats` is made
#: of (:data:`STATS_UNREAD` NULL): counts summed, maxima kept, means weighted
#: by their sample counts. A day of one GPU (86,400 rows) merges in ~0.15 s
#: CPU, where reading the rows into Python took seconds. Parameters as
#: :data:`SELECT_SQL`'s.
MERGED_SQL = (
    f"SELECT {', '.join(f'{_merged_expr(c)} AS {c}' for c in ROLLUP_COLUMNS)} "
    f"FROM gpu_rollups {_WHERE_NUMBERED}"
)


#: A second's row into ``gpu_seconds``, its GPU found by :func:`insert_params`'
#: ``(uuid, boot key)`` (:data:`GPU_SQL` makes that row first); a second stored
#: already (a daemon restarted within it) is merged with it.
INSERT_SQL = (
    f"INSERT INTO gpu_seconds (gpu, {', '.join(SECONDS_COLUMNS)}) VALUES ("
    "(SELECT id FROM gpus WHERE uuid = ? AND boot_id = ?), "
    f"{', '.join('?' * len(SECONDS_COLUMNS))}) ON CONFLICT (gpu, sec_ns) DO UPDATE SET "
    + ", ".join(
        f"{c} = {pair_merge_expr(c, 'gpu_seconds', 'excluded')}"
        for c in SECONDS_COLUMNS
        if c != "sec_ns"
    )
)


_LIMIT = ROLLUP_COLUMNS.index("sm_limit_mhz")


def gpu_rows(rows: Iterable[Sequence[Any]]) -> list[tuple[str, str, Any]]:
    """:data:`GPU_SQL`'s rows for rollup rows (:data:`ROLLUP_COLUMNS` order):
    each GPU of a boot once, with its max SM clock (the first given)."""
    out: dict[tuple[str, str], Any] = {}
    for r in rows:
        key = gpu_key(r)
        if out.get(key) is None:
            out[key] = r[_LIMIT]
    return [(*key, limit) for key, limit in out.items()]


def gpu_key(row: Sequence[Any]) -> tuple[str, str]:
    """A rollup row's (:data:`ROLLUP_COLUMNS` order) ``gpus`` key: (uuid, boot; '' none)."""
    return row[1] or "", row[-1] or ""


#: Where each ``gpu_seconds`` column's value is in a rollup row, and whether it is a mean.
_FROM_ROW = [(ROLLUP_COLUMNS.index(c), c in TOTALS) for c in ROLLUP_COLUMNS if c not in _PER_GPU]
_N = ROLLUP_COLUMNS.index("n")


#: Per total with limits: where its minimum and maximum are in a rollup row.
_LIMITS_AT = {
    ROLLUP_COLUMNS.index(mean): (ROLLUP_COLUMNS.index(lo), ROLLUP_COLUMNS.index(hi))
    for mean, total in TOTALS.items()
    if total in _LIMITS
    for lo, hi in [_LIMITS[total]]
}


def _stored(row: Sequence[Any], i: int) -> float | None:
    lo, hi = _LIMITS_AT.get(i, (None, None))
    if lo is not None and row[lo] is not None and row[lo] == row[hi]:
        return None  # every sample the same: the minimum says it
    return _total(row[i], row[_N])


#: :func:`insert_params`: the row's values in ``gpu_seconds`` order (one C
#: call), then each mean's place and where it is in the row (made totals).
_IN_ORDER = operator.itemgetter(*(i for i, _ in _FROM_ROW))
#: (its place in ``gpu_seconds``, in the row, and of its minimum and maximum: None without).
_MEANS_AT = [
    (j, i, *_LIMITS_AT.get(i, (None, None))) for j, (i, mean) in enumerate(_FROM_ROW) if mean
]


def insert_params(row: Sequence[Any]) -> tuple[Any, ...]:
    """A rollup row (:data:`ROLLUP_COLUMNS` order) as :data:`INSERT_SQL`'s
    parameters: its ``gpus`` key, then its ``gpu_seconds`` columns (as
    :func:`_stored` gives each total, a row at a time)."""
    values = list(_IN_ORDER(row))
    n = row[_N]
    for j, i, lo, hi in _MEANS_AT:
        mean = row[i]
        if mean is not None and (lo is None or row[lo] is None or row[lo] != row[hi]):
            values[j] = _total(mean, n)
        else:
            values[j] = None
    return (row[1] or "", row[-1] or "", *values)


def row_from_params(gpu: Sequence[Any], params: Sequence[Any]) -> dict[str, Any]:
    """A :func:`gpu_rows` row and :func:`insert_params`' parameters as the
    rollup row they came from (by column)."""
    uuid, boot_id, *values = params
    stored = dict(zip(SECONDS_COLUMNS, values, strict=True))
    n = stored["n"]
    out = {c: stored.get(c) for c in ROLLUP_COLUMNS}
    for mean, total in TOTALS.items():
        v = stored[total]
        if v is None and total in _LIMITS:
            out[mean] = stored[_LIMITS[total][0]]
        else:
            out[mean] = None if v is None else v / (n if n and n > 1 else 1)
    out.update(uuid=uuid, boot_id=boot_id or None, sm_limit_mhz=gpu[2])
    return out


def _near_int(x: str) -> str:
    """SQL for *x*, or the integer it is within float error of (as :func:`_total`)."""
    return f"CASE WHEN ABS({x} - ROUND({x})) <= 1e-12 * ABS({x}) THEN ROUND({x}) ELSE {x} END"


#: The :data:`TOTALS` columns of rollup rows that hold means only (a database
#: older than schema 22 read as it is).
TOTALS_OF_MEANS = ", ".join(
    f"{mean} * CASE WHEN n > 1 THEN n ELSE 1 END AS {total}" for mean, total in TOTALS.items()
)


def copy_sql(source: str) -> tuple[str, str]:
    """Statements storing the rollup-shaped rows of SELECT or table *source*
    (columns named as :data:`ROLLUP_COLUMNS`): their ``gpus``, then their
    seconds, a second's rows merged (an upgrade from a ``gpu_rollups`` table)."""
    gpus = (
        "INSERT INTO gpus (uuid, boot_id, sm_limit_mhz) SELECT COALESCE(uuid, ''), "
        f"COALESCE(boot_id, ''), MAX(sm_limit_mhz) FROM ({source}) o "
        "GROUP BY COALESCE(uuid, ''), COALESCE(boot_id, '') "
        "ON CONFLICT (uuid, boot_id) DO NOTHING"
    )
    merged = ", ".join(
        f"CASE WHEN COALESCE(SUM(n), 0) > 1 THEN {_near_int(f'SUM({mean} * n)')} "
        f"ELSE MAX({mean}) END"
        if mean in TOTALS
        else merge_expr(mean)  # (its TOTALS: from the means, below)
        for mean in ROLLUP_COLUMNS
        if mean not in ("sec_ns", *_PER_GPU)
    )
    seconds = (
        f"INSERT INTO gpu_seconds (gpu, {', '.join(SECONDS_COLUMNS)}) "
        f"SELECT g.id, o.sec_ns, {merged} FROM ({source}) o JOIN gpus g "
        "ON g.uuid = COALESCE(o.uuid, '') AND g.boot_id = COALESCE(o.boot_id, '') "
        "WHERE o.sec_ns IS NOT NULL GROUP BY g.id, o.sec_ns"
    )
    return gpus, seconds


def sample_row(s: GpuSample) -> dict[str, Any]:
    """A fast-loop sample in the row shape :meth:`GpuAccumulator.add` reads."""
    return {
        "util_gpu": s.util_pct,
        "util_mem": s.mem_util_pct,
        "mem_used": s.mem_used_bytes,
        "mem_total": s.mem_total_bytes,
        "power_mW": s.power_mw,
        "temp_C": s.temp_c,
        "sm_MHz": s.sm_clock_mhz,
        "reasons": s.clock_event_reasons,
    }


def slow_row(s: GpuSlowSample) -> dict[str, Any]:
    """A slow-loop sample in the row shape :meth:`GpuAccumulator.add_slow` reads
    (PCIe bytes/s → KB/s of 1000 bytes, as NVML and the fixture spell it)."""
    return {
        "pcie_rx_KBps": None
        if s.pcie_rx_bytes_per_s is None
        else s.pcie_rx_bytes_per_s / BYTES_PER_KB,
        "pcie_tx_KBps": None
        if s.pcie_tx_bytes_per_s is None
        else s.pcie_tx_bytes_per_s / BYTES_PER_KB,
        "gpm_sm_util": s.gpm_sm_util_pct,
        "gpm_sm_occupancy": s.gpm_sm_occupancy_pct,
        "gpm_any_tensor_util": s.gpm_tensor_util_pct,
        "gpm_dram_bw_util": s.gpm_dram_bw_util_pct,
    }


class _Open:
    __slots__ = ("acc", "sec_ns", "slow_n")

    def __init__(self, sec_ns: int, sm_limit_mhz: float | None) -> None:
        self.sec_ns = sec_ns
        self.acc = GpuAccumulator(sm_limit_mhz=sm_limit_mhz)
        self.slow_n = 0


class SecondRollups:
    """Folds each GPU's samples into one open accumulator per second.

    :meth:`add` and :meth:`add_slow` return the rows of the seconds they
    closed (a GPU's first sample of a later second closes its open one);
    :meth:`flush` closes everything (at shutdown). Rows are tuples in
    :data:`ROLLUP_COLUMNS` order.

    *devices* (NVML's, with their max SM clocks) give each row the clock
    reference the throttling rules measure from.
    """

    def __init__(self, devices: Iterable[GpuDevice] = (), boot_id: str | None = None) -> None:
        self.boot_id = boot_id
        """This boot's id (:func:`gpuprofd.core.boot.boot_id`), stored on every row."""
        self._open: dict[str, _Open] = {}
        self._sm_limit = {normalize_uuid(d.uuid): d.max_sm_mhz for d in devices}

    def _slot(self, uuid: str, mono_ns: int, out: list[tuple[Any, ...]]) -> _Open:
        key = normalize_uuid(uuid) or uuid
        sec_ns = mono_ns - mono_ns % NS_PER_S
        cur = self._open.get(key)
        if cur is None or sec_ns > cur.sec_ns:
            if cur is not None:
                out.append(rollup_params(cur.sec_ns, key, cur.acc, cur.slow_n, self.boot_id))
            cur = self._open[key] = _Open(sec_ns, self._sm_limit.get(key))
        return cur

    def add(self, mono_ns: int, samples: list[GpuSample]) -> list[tuple[Any, ...]]:
        """Fold one fast-loop tick (all GPUs, taken at *mono_ns*)."""
        out: list[tuple[Any, ...]] = []
        for s in samples:
            self._slot(s.uuid, mono_ns, out).acc.add(sample_row(s))
        return out

    def add_slow(self, mono_ns: int, samples: list[GpuSlowSample]) -> list[tuple[Any, ...]]:
        """Fold one slow-loop tick into each GPU's open second. A slow sample
        stamped just before a second its GPU's fast samples already opened
        joins that second (its queries take up to ~25 ms; off by < 1 s)."""
        out: list[tuple[Any, ...]] = []
        for s in samples:
            slot = self._slot(s.uuid, mono_ns, out)
            slot.acc.add_slow(slow_row(s))
            slot.slow_n += 1
        return out

    def flush(self) -> list[tuple[Any, ...]]:
        """Close every open second."""
        out = [
            rollup_params(o.sec_ns, k, o.acc, o.slow_n, self.boot_id) for k, o in self._open.items()
        ]
        self._open.clear()
        return out


def _mmm(m: MinMeanMax) -> tuple[float | None, float | None, float | None]:
    return m.lo, m.mean, m.hi


def _kb_to_bytes(kbps: float | None) -> float | None:
    return None if kbps is None else kbps * BYTES_PER_KB


def rollup_params(
    sec_ns: int, uuid: str, a: GpuAccumulator, slow_n: int, boot_id: str | None = None
) -> tuple[Any, ...]:
    """One ``gpu_rollups`` row (:data:`ROLLUP_COLUMNS` order) from an accumulator."""
    mem_lo, mem_mean, mem_hi = _mmm(a.mem_used)
    return (
        sec_ns,
        uuid,
        a.util.n,
        *_mmm(a.util),
        a.idle_n,
        None if mem_lo is None else int(mem_lo),
        mem_mean,
        None if mem_hi is None else int(mem_hi),
        a.mem_total_bytes,
        *_mmm(a.power_mw),
        *_mmm(a.temp_c),
        *_mmm(a.sm_mhz),
        a.sm_active_max_mhz,
        a.sm_limit_mhz,
        a.mem_util.mean,
        a.reasons_n,
        a.reasons_any,
        a.capped_n,
        a.capped_sm_mhz.mean,
        a.thermal_n,
        a.thermal_sm_mhz.mean,
        slow_n,
        _kb_to_bytes(a.pcie_rx_max_kbps),
        _kb_to_bytes(a.pcie_tx_max_kbps),
        a.gpm_sm_util.mean,
        a.gpm_sm_occupancy.mean,
        a.gpm_tensor_util.mean,
        a.gpm_dram_bw_util.mean,
        boot_id,
    )


def accumulator_from_row(r: Mapping[str, Any]) -> GpuAccumulator:
    """Rebuild the accumulator a ``gpu_rollups`` row was written from.

    Exact for counts, min, max and means when a reading was present on every
    sample of the second (NVML readings are supported per device, so they are).
    """
    n, slow_n = r["n"] or 0, r["slow_n"] or 0

    def mmm(prefix: str, unit: str = "") -> MinMeanMax:
        return MinMeanMax.of(
            n, r[f"{prefix}_mean{unit}"], r[f"{prefix}_min{unit}"], r[f"{prefix}_max{unit}"]
        )

    def slow_mean(col: str) -> MinMeanMax:
        return MinMeanMax.of(slow_n, r[col], None, None)

    rx, tx = r["pcie_rx_max_bps"], r["pcie_tx_max_bps"]
    return GpuAccumulator(
        util=mmm("util"),
        idle_n=r["idle_n"] or 0,
        mem_used=mmm("mem_used"),
        mem_total_bytes=r["mem_total_bytes"],
        power_mw=mmm("power", "_mw"),
        temp_c=mmm("temp", "_c"),
        sm_mhz=mmm("sm", "_mhz"),
        sm_active_max_mhz=r["sm_active_max_mhz"],
        sm_limit_mhz=r["sm_limit_mhz"],
        mem_util=MinMeanMax.of(n, r["mem_util_mean"], None, None),
        reasons_n=r["reasons_n"] or 0,
        reasons_any=r["reasons_any"] or 0,
        capped_n=r["capped_n"] or 0,
        capped_sm_mhz=MinMeanMax.of(r["capped_n"] or 0, r["capped_sm_mean_mhz"], None, None),
        thermal_n=r["thermal_n"] or 0,
        thermal_sm_mhz=MinMeanMax.of(r["thermal_n"] or 0, r["thermal_sm_mean_mhz"], None, None),
        pcie_rx_max_kbps=None if rx is None else rx / BYTES_PER_KB,
        pcie_tx_max_kbps=None if tx is None else tx / BYTES_PER_KB,
        gpm_sm_util=slow_mean("gpm_sm_util_mean"),
        gpm_sm_occupancy=slow_mean("gpm_sm_occupancy_mean"),
        gpm_tensor_util=slow_mean("gpm_tensor_util_mean"),
        gpm_dram_bw_util=slow_mean("gpm_dram_bw_util_mean"),
    )
