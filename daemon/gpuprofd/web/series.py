"""Chart series from bucketed rows (pure: no I/O).

The database reduces (:mod:`gpuprofd.storage.reads.series`: min/mean/max per
bucket, never sampling); this module picks the buckets (about two per pixel
of the chart's width), converts a run's monotonic nanoseconds to unix
seconds with the run's own anchor, and turns rows into the column arrays
the page plots (``docs/dashboard.md``). Units: ms, bytes, W, °C, MHz, %.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprofd.storage.reads.series import BETWEEN, CHART_PARTS, HOST_METRICS

#: Buckets per pixel of the requested width: two, so a one-pixel feature is
#: never split into one half-empty column (the min/max envelope stays closed).
BUCKETS_PER_PX = 2
#: The widths a client may ask for, pixels (4000: a 4K screen's chart).
MIN_WIDTH, DEFAULT_WIDTH, MAX_WIDTH = 10, 1000, 4000
NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
#: Decimals of a time on the wire (0.1 ms), and half its last digit in ns: a
#: cursor time ``t`` covers every sample whose ``t`` rounded to it.
T_DECIMALS = 4
T_HALF_ULP_NS = NS_PER_S // 10**T_DECIMALS // 2
#: The chart phases in stacking order (loader wait and the time between
#: steps first, the rest last).
CHART_PHASES = CHART_PARTS


@dataclass(frozen=True)
class RunClock:
    """A run's wall-clock anchor: the wall and monotonic time of its start
    (``runs.start_wall_ns`` / ``start_mono_ns``, one boot's clock)."""

    wall_ns: int
    mono_ns: int

    def to_s(self, mono_ns: float) -> float:
        """Monotonic ns of the run's boot → unix seconds."""
        return (self.wall_ns + (mono_ns - self.mono_ns)) / NS_PER_S

    def to_mono(self, unix_s: float) -> int:
        """Unix seconds → monotonic ns of the run's boot."""
        return int(round(unix_s * NS_PER_S)) - self.wall_ns + self.mono_ns


@dataclass(frozen=True)
class Buckets:
    """A window [*lo_ns*, *hi_ns*) of monotonic ns cut into *count* buckets
    of *width_ns* each (the last may end past *hi_ns*)."""

    lo_ns: int
    hi_ns: int
    count: int
    width_ns: int

    @classmethod
    def for_width(cls, lo_ns: int, hi_ns: int, width_px: int) -> Buckets:
        """:data:`BUCKETS_PER_PX` buckets per pixel of *width_px* over the window."""
        hi_ns = max(hi_ns, lo_ns + 1)
        count = BUCKETS_PER_PX * width_px
        return cls(lo_ns, hi_ns, count, max(1, math.ceil((hi_ns - lo_ns) / count)))

    @property
    def span_s(self) -> float:
        return (self.hi_ns - self.lo_ns) / NS_PER_S


def _t(unix_s: float) -> float:
    return round(unix_s, T_DECIMALS)


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / NS_PER_MS, 4)


def _num(v: float | None, scale: float = 1.0, nd: int = 3) -> float | None:
    return None if v is None else round(v * scale, nd)


def _mmm(rows: Sequence[Mapping[str, Any]], prefix: str, unit: str = "", **kw: Any) -> dict:
    return {
        "min": [_num(r[f"{prefix}_min{unit}"], **kw) for r in rows],
        "mean": [_num(r[f"{prefix}_mean{unit}"], **kw) for r in rows],
        "max": [_num(r[f"{prefix}_max{unit}"], **kw) for r in rows],
    }


def steps_series(rows: Sequence[Mapping[str, Any]], clock: RunClock) -> dict[str, Any]:
    """Bucketed step rows (:func:`gpuprofd.storage.reads.series.step_buckets`, or
    step rollups merged by :func:`merge_step_rollups`) as the ``steps`` object."""
    return {
        "t": [_t(clock.to_s(r["t0"])) for r in rows],
        "first_step": [r["first_step"] for r in rows],
        "n": [int(r["n"]) for r in rows],
        "step_ms": {
            "min": [_ms(r["iter_min"]) for r in rows],
            "mean": [_ms(r["iter_mean"]) for r in rows],
            "max": [_ms(r["iter_max"]) for r in rows],
        },
        "phases_ms": {p: [_ms(r[p]) for r in rows] for p in CHART_PHASES},
        "eval": [int(r["eval_n"] or 0) for r in rows],
        "skipped": [int(r["skipped_n"] or 0) for r in rows],
        "mem_allocated_bytes": [r["mem_alloc"] for r in rows],
        "mem_reserved_bytes": [r["mem_reserved"] for r in rows],
    }


def _optional(rows: Sequence[Mapping[str, Any]], col: str, nd: int = 1) -> list | None:
    """A column's values, or None when no bucket has one (not sampled)."""
    values = [_num(r.get(col), nd=nd) for r in rows]
    return values if any(v is not None for v in values) else None


def gpu_series(
    rows: Sequence[Mapping[str, Any]], clock: RunClock, gpu: Mapping[str, Any]
) -> dict[str, Any]:
    """Bucketed GPU rows (:func:`gpuprofd.storage.reads.series.gpu_rollup_buckets`
    or ``gpu_raw_buckets``) of the GPU *gpu* (``index``, ``uuid``, ``name``,
    ``mem_total_bytes``, ``power_limit_w``) as one ``gpus`` entry."""
    totals = [r["mem_total_bytes"] for r in rows if r.get("mem_total_bytes") is not None]
    return {
        "index": gpu.get("index"),
        "uuid": gpu.get("uuid"),
        "name": gpu.get("name"),
        "t": [_t(clock.to_s(r["t"])) for r in rows],
        "util_pct": _mmm(rows, "util", nd=2),
        "mem_used_bytes": _mmm(rows, "mem_used", nd=0),
        "mem_total_bytes": max(totals) if totals else gpu.get("mem_total_bytes"),
        "power_w": _mmm(rows, "power", "_mw", scale=1e-3),
        "power_limit_w": gpu.get("power_limit_w"),
        "temp_c": _mmm(rows, "temp", "_c", nd=1),
        "sm_clock_mhz": _mmm(rows, "sm", "_mhz", nd=1),
        "pcie_rx_bps": _optional(rows, "pcie_rx_max_bps", 0),
        "pcie_tx_bps": _optional(rows, "pcie_tx_max_bps", 0),
        "gpm_sm_occupancy_pct": _optional(rows, "gpm_sm_occupancy_mean", 2),
        "gpm_tensor_util_pct": _optional(rows, "gpm_tensor_util_mean", 2),
        "gpm_dram_bw_util_pct": _optional(rows, "gpm_dram_bw_util_mean", 2),
    }


def _host_stat(rows: Sequence[Mapping[str, Any]], m: str, nd: int) -> dict[str, list[float | None]]:
    """min/mean/max of reading *m* from rows holding its min, max, sum and count."""
    return {
        "min": [_num(r[f"{m}_min"], nd=nd) for r in rows],
        "mean": [_num(r[f"{m}_sum"] / r[f"{m}_n"], nd=nd) if r[f"{m}_n"] else None for r in rows],
        "max": [_num(r[f"{m}_max"], nd=nd) for r in rows],
    }


def host_series(rows: Sequence[Mapping[str, Any]], clock: RunClock) -> dict[str, Any]:
    """Bucketed host rows (:func:`gpuprofd.storage.reads.series.host_buckets`,
    ``hostrollup.rollup_buckets``, or both merged by :func:`merge_host_buckets`)
    as the ``host`` object."""
    counts = [r["cpu_count"] for r in rows if r.get("cpu_count") is not None]
    return {
        "t": [_t(clock.to_s(r["t"])) for r in rows],
        "cpu_count": max(counts) if counts else None,
        "run_cores": _host_stat(rows, "run_cores", 3),
        "other_cores": _host_stat(rows, "other_cores", 3),
        "disk_read_bps": _host_stat(rows, "disk_read_bps", 0),
        "page_cache_bytes": _host_stat(rows, "page_cache_bytes", 0),
    }


def merge_host_buckets(*parts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Bucketed host rows from several reads of one window's buckets (the
    rollup tier's and the samples' around it) merged by bucket ``b``, by
    bucket: first time, sample count, minima, maxima, sums and counts combined."""
    out: dict[int, dict[str, Any]] = {}
    for rows in parts:
        for r in rows:
            cur = out.get(r["b"])
            if cur is None:
                out[r["b"]] = dict(r)
                continue
            cur["t"] = min(cur["t"], r["t"])
            cur["n"] = (cur["n"] or 0) + (r["n"] or 0)
            cur["cpu_count"] = _pick(max, cur["cpu_count"], r["cpu_count"])
            for m in HOST_METRICS:
                cur[f"{m}_min"] = _pick(min, cur[f"{m}_min"], r[f"{m}_min"])
                cur[f"{m}_max"] = _pick(max, cur[f"{m}_max"], r[f"{m}_max"])
                cur[f"{m}_sum"] = (cur[f"{m}_sum"] or 0) + (r[f"{m}_sum"] or 0)
                cur[f"{m}_n"] = (cur[f"{m}_n"] or 0) + (r[f"{m}_n"] or 0)
    return [out[b] for b in sorted(out)]


def merge_step_rollups(rows: Iterable[Mapping[str, Any]], buckets: Buckets) -> list[dict[str, Any]]:
    """Step rollup rows (``step_rollups``: one per block of steps, sums and
    extremes) merged into *buckets* by their first step's ``t0_ns``, in the
    row shape :func:`steps_series` reads: counts and sums added, minima and
    maxima kept, means weighted by step counts."""
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        b = (r["t0_ns"] - buckets.lo_ns) // buckets.width_ns
        cur = out.get(b)
        n = int(r["n"])
        if cur is None:
            cur = out[b] = {
                "b": b,
                "t0": r["t0_ns"],
                "first_step": r["first_step"],
                "n": 0,
                "iter_min": r["iter_min_ns"],
                "iter_max": r["iter_max_ns"],
                "_iter": 0.0,
                **{f"_{p}": 0.0 for p in CHART_PHASES},
                "eval_n": 0,
                "skipped_n": 0,
                "mem_alloc": None,
                "mem_reserved": None,
            }
        cur["n"] += n
        cur["first_step"] = min(cur["first_step"], r["first_step"])
        cur["iter_min"] = _pick(min, cur["iter_min"], r["iter_min_ns"])
        cur["iter_max"] = _pick(max, cur["iter_max"], r["iter_max_ns"])
        cur["_iter"] += r["iter_sum_ns"] or 0
        for p in CHART_PHASES:
            cur[f"_{p}"] += _part_sum(r, p)
        cur["eval_n"] += int(r["eval_n"] or 0)
        cur["skipped_n"] += int(r["skipped_n"] or 0)
        cur["mem_alloc"] = _pick(max, cur["mem_alloc"], r["mem_alloc_max"])
        cur["mem_reserved"] = _pick(max, cur["mem_reserved"], r["mem_reserved_max"])
    merged = []
    for b in sorted(out):
        cur = out[b]
        n = cur["n"] or 1
        cur["iter_mean"] = cur.pop("_iter") / n
        for p in CHART_PHASES:
            cur[p] = cur.pop(f"_{p}") / n
        merged.append(cur)
    return merged


def _part_sum(r: Mapping[str, Any], part: str) -> float:
    """A rollup row's sum of *part* (ns). ``step_rollups`` holds no column for
    the time between steps: it is what its iteration sum holds beyond the
    other parts (which stack to wait + step), 0 in a block rolled before the
    iteration counted it."""
    if part != BETWEEN or f"{part}_sum_ns" in r:
        return float(r.get(f"{part}_sum_ns") or 0)
    rest = sum(float(r.get(f"{p}_sum_ns") or 0) for p in CHART_PHASES if p != BETWEEN)
    return max(float(r.get("iter_sum_ns") or 0) - rest, 0.0)


def bucket_as_rollup(r: Mapping[str, Any]) -> dict[str, Any]:
    """A bucketed raw-steps row (:func:`gpuprofd.storage.reads.series.step_buckets`)
    as a ``step_rollups`` row (means back to sums), to merge with rollup rows
    (the steps after the last rolled block)."""
    n = int(r["n"])
    return {
        "t0_ns": r["t0"],
        "first_step": r["first_step"],
        "n": n,
        "iter_min_ns": r["iter_min"],
        "iter_max_ns": r["iter_max"],
        "iter_sum_ns": (r["iter_mean"] or 0) * n,
        **{f"{p}_sum_ns": (r[p] or 0) * n for p in CHART_PHASES},
        "eval_n": r["eval_n"],
        "skipped_n": r["skipped_n"],
        "mem_alloc_max": r["mem_alloc"],
        "mem_reserved_max": r["mem_reserved"],
    }


def _pick(f: Any, a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else f(a, b)


# --- live rows --------------------------------------------------------------------


def live_step(r: Mapping[str, Any], clock: RunClock) -> dict[str, Any]:
    """One row of :func:`gpuprofd.storage.reads.series.steps_after` as a live ``steps`` row."""
    return {
        "step": r["step"],
        "t": _t(clock.to_s(r["t0_ns"])),
        "step_ms": _ms(r["iter"]),
        "phases_ms": {p: _ms(r[p]) for p in CHART_PHASES},
        "eval": bool(r["eval_ns"]),
        "skipped": bool(r["skipped"]),
        "traced": bool(r.get("traced")),
        "mem_allocated_bytes": r["mem_allocated_bytes"],
        "mem_reserved_bytes": r["mem_reserved_bytes"],
    }


def live_gpu(r: Mapping[str, Any], clock: RunClock, uuid: str) -> dict[str, Any]:
    """One raw GPU sample (:func:`gpuprofd.storage.reads.series.gpu_samples_after`)
    as a live ``gpus`` sample, under the GPU's UUID as the page knows it."""
    return {
        "uuid": uuid,
        "t": _t(clock.to_s(r["mono_ns"])),
        "util_pct": _num(r["util_pct"], nd=2),
        "mem_used_bytes": r["mem_used_bytes"],
        "power_w": _num(r["power_mw"], scale=1e-3),
        "temp_c": _num(r["temp_c"], nd=1),
        "sm_clock_mhz": _num(r["sm_clock_mhz"], nd=1),
    }


def live_host(r: Mapping[str, Any], clock: RunClock) -> dict[str, Any]:
    """One host sample (:func:`gpuprofd.storage.reads.series.host_samples_after`)
    as a live sample."""
    return {
        "t": _t(clock.to_s(r["mono_ns"])),
        "cpu_count": r.get("cpu_count"),
        "run_cores": _num(r["run_cores"]),
        "other_cores": _num(r["other_cores"]),
        "disk_read_bps": _num(r["disk_read_bps"], nd=0),
        "page_cache_bytes": r["page_cache_bytes"],
    }
