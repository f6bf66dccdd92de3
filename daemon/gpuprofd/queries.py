"""Read queries shared by the daemon (aiosqlite) and gpuprofctl (sqlite3),
with the converters from rows to the shapes :func:`build_context` reads.
Pure: no connection here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gpuprofd.nvml import normalize_uuid

#: How many earlier finished runs of the same name the regression rule sees.
HISTORY_RUNS = 3

STEPS_SQL = (
    "SELECT t0_ns, t1_ns, wait_ns, explicit, micro, phases, skipped, eval_ns, optimizers, "
    "mem_allocated_bytes, mem_reserved_bytes, mem_peak_bytes FROM steps "
    "WHERE run_id = ? ORDER BY t0_ns"
)
HOST_SQL = (
    "SELECT mono_ns, cpu_pct, cpu_count, disk_read_bps, disk_read_iops, page_cache_bytes, "
    "mem_total_bytes, swap_in_bps FROM host_samples "
    "WHERE mono_ns BETWEEN ? AND ? ORDER BY mono_ns"
)
RUN_CPU_SQL = "SELECT mono_ns, cores FROM run_cpu_samples WHERE run_id = ? ORDER BY mono_ns"
#: A run's DataLoader workers: one row per worker process, ``cpu_s`` its CPU
#: seconds so far; grouped by ``loader_seq`` (one loader iterator's pool).
WORKER_CPU_SQL = (
    "SELECT loader_seq, worker_id, pid, first_mono_ns, last_mono_ns, cpu_s FROM worker_cpu "
    "WHERE run_id = ? ORDER BY loader_seq, worker_id"
)
HISTORY_SQL = (
    "SELECT median_step_ms FROM runs WHERE run_name = ? AND id < ? AND status = 'finished' "
    "AND median_step_ms IS NOT NULL ORDER BY id DESC LIMIT ?"
)
GPU_FAST_SQL = (
    "SELECT mono_ns, uuid, util_pct, mem_used_bytes, mem_total_bytes, power_mw, temp_c, "
    "sm_clock_mhz, clock_event_reasons FROM gpu_samples WHERE mono_ns BETWEEN ? AND ? "
    "ORDER BY mono_ns"
)
GPU_SLOW_SQL = (
    "SELECT mono_ns, uuid, pcie_rx_bps, pcie_tx_bps, gpm_sm_util_pct, gpm_sm_occupancy_pct, "
    "gpm_tensor_util_pct, gpm_dram_bw_util_pct FROM gpu_slow_samples "
    "WHERE mono_ns BETWEEN ? AND ? ORDER BY mono_ns"
)
INSIGHTS_SQL = (
    "SELECT rule, severity, title, detail, fix, evidence FROM insights WHERE run_id = ? "
    "ORDER BY rowid"
)


def step_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A ``steps`` row as :func:`gpuprof.insights.build_context` reads it
    (``mem`` only where the step carried torch's allocator figures)."""
    step = {
        "t0": r["t0_ns"], "t1": r["t1_ns"], "wait": r["wait_ns"],
        "explicit": bool(r["explicit"]), "micro": r["micro"],
        "phases": orjson.loads(r["phases"]) if r["phases"] else {},
        "skipped": bool(r["skipped"]), "eval": r["eval_ns"] or 0,
        "optimizers": orjson.loads(r["optimizers"]) if r["optimizers"] else [],
    }  # fmt: skip
    if r["mem_allocated_bytes"] is not None:
        step["mem"] = [r["mem_allocated_bytes"], r["mem_reserved_bytes"], r["mem_peak_bytes"]]
    return step


def steps_span(steps: Sequence[Mapping[str, Any]]) -> tuple[int, int] | None:
    """(first step's t0, last step's t1) in ns, or None with no steps: the
    window whose GPU samples the GPU rules read."""
    if not steps:
        return None
    return min(s["t0"] for s in steps), max(s["t1"] for s in steps)


def gpu_rows(
    cuda_uuid: str | None,
    fast: Sequence[Mapping[str, Any]],
    slow: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The run's GPU samples (its device, matched by UUID) in the row shape
    :func:`gpuprof.insights.gpu.gpu_stats` reads; each slow-loop sample's
    readings (PCIe bytes/s → KB/s, GPM %) join the next fast row. Empty when
    the run has no GPU."""
    want = normalize_uuid(cuda_uuid)
    if want is None:
        return []
    rows: list[dict[str, Any]] = []
    pending: dict[str, Any] = {}
    slow_iter = iter([s for s in slow if normalize_uuid(s["uuid"]) == want])
    nxt = next(slow_iter, None)
    for f in fast:
        if normalize_uuid(f["uuid"]) != want:
            continue
        while nxt is not None and nxt["mono_ns"] <= f["mono_ns"]:
            pending.update(_slow_fields(nxt))
            nxt = next(slow_iter, None)
        row = {
            "util_gpu": f["util_pct"], "mem_used": f["mem_used_bytes"],
            "mem_total": f["mem_total_bytes"], "power_mW": f["power_mw"], "temp_C": f["temp_c"],
            "sm_MHz": f["sm_clock_mhz"], "reasons": f["clock_event_reasons"],
        }  # fmt: skip
        row.update(pending)
        pending = {}
        rows.append({k: v for k, v in row.items() if v is not None})
    return rows


def _slow_fields(s: Mapping[str, Any]) -> dict[str, Any]:
    kb = 1000.0  # the trace's (and gpu_stats') PCIe unit is KB/s; stored is bytes/s
    out = {
        "pcie_rx_KBps": s["pcie_rx_bps"] / kb if s["pcie_rx_bps"] is not None else None,
        "pcie_tx_KBps": s["pcie_tx_bps"] / kb if s["pcie_tx_bps"] is not None else None,
        "gpm_sm_util": s["gpm_sm_util_pct"], "gpm_sm_occupancy": s["gpm_sm_occupancy_pct"],
        "gpm_any_tensor_util": s["gpm_tensor_util_pct"],
        "gpm_dram_bw_util": s["gpm_dram_bw_util_pct"],
    }  # fmt: skip
    return {k: v for k, v in out.items() if v is not None}


def run_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A ``runs`` row as a dict with ``options`` parsed."""
    run = dict(r)
    run["options"] = orjson.loads(run["options"]) if run.get("options") else {}
    return run


def insight_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """An ``insights`` row as ``Insight.to_dict()`` returns it."""
    d = {k: r[k] for k in ("rule", "severity", "title", "detail", "fix")}
    d["evidence"] = orjson.loads(r["evidence"]) if r["evidence"] else {}
    return d
