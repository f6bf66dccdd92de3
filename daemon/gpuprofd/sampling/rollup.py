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

from collections.abc import Iterable, Mapping
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
INSERT_SQL = (
    f"INSERT INTO gpu_rollups ({', '.join(ROLLUP_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(ROLLUP_COLUMNS))})"
)
_WHERE = "WHERE uuid = ? AND boot_id IS NOT DISTINCT FROM ? AND sec_ns > ? AND sec_ns < ?"
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


def merge_expr(col: str) -> str:
    """SQL that merges *col* over many rollup rows into one (see :data:`MERGED_SQL`)."""
    if col in ("sec_ns", "uuid", "boot_id"):
        return f"MIN({col})"
    if col.endswith("_n") or col == "n":  # an integer (Postgres sums to numeric)
        return f"CAST(SUM({col}) AS BIGINT)"
    if col == "reasons_any":  # SQLite has no bitwise-OR aggregate: OR each bit's MAX
        return " | ".join(f"MAX({col} & {1 << b})" for b in range(32))
    if col.startswith("capped_sm") or col.startswith("thermal_sm"):
        return _weighted(col, col.split("_sm")[0] + "_n")
    if col.startswith("gpm_"):
        return _weighted(col, "slow_n")
    if "_min" in col:
        return f"MIN({col})"
    if "_max" in col or col in ("mem_total_bytes", "sm_limit_mhz"):
        return f"MAX({col})"
    if "_mean" in col:
        return _weighted(col, "n")
    raise ValueError(f"no merge rule for gpu_rollups.{col}")


#: The same window merged by the database into one rollup-shaped row (a rollup of
#: rollups): counts summed, minima and maxima kept, means weighted by their
#: sample counts. A day of one GPU (86,400 rows) merges in ~0.1 s, where
#: reading the rows into Python took seconds.
MERGED_SQL = (
    f"SELECT {', '.join(f'{merge_expr(c)} AS {c}' for c in ROLLUP_COLUMNS)} "
    f"FROM gpu_rollups {_WHERE}"
)


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
