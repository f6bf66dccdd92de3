"""A run as the API shows it: its headline (``/runs/{id}``'s ``run``), its
GPUs, its window on the node's clock. Figures come from
:mod:`gpuprofd.views.runs` (the runs row, the summary), never computed here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuprofd.sampling.nvml import normalize_uuid
from gpuprofd.storage import reads
from gpuprofd.storage.reads import series
from gpuprofd.views.runs import describe, load_summary
from gpuprofd.web.series import NS_PER_S, RunClock
from gpuprofd.web.state import WebState


def clock_of(run: dict[str, Any]) -> RunClock:
    """The run's anchor (a run without one: its monotonic ns read as wall ns)."""
    mono = run.get("start_mono_ns") or 0
    return RunClock(run.get("start_wall_ns") or mono, mono)


#: The shortest window a run has, ns (a run that ended as it started).
MIN_SPAN_NS = 1_000_000


async def window_of(state: WebState, run: dict[str, Any]) -> tuple[int, int]:
    """The run's span in its boot's monotonic ns: start to end; a running
    run on this node to now, elsewhere to its last step's end (a second
    after its start when it has none)."""
    lo = run.get("start_mono_ns") or 0
    hi = run.get("end_mono_ns")
    if hi is None:
        same_boot = state.boot_id is not None and run.get("boot_id") == state.boot_id
        if run["status"] == "running" and same_boot and state.now_mono_ns is not None:
            hi = state.now_mono_ns()
        else:
            hi = await reads.last_step_end(state.reader, run["id"])
    # a window the page can ask for again in unix seconds (a double holds
    # 0.24 µs at today's epoch): a run with no step yet spans a second
    return lo, max(hi or lo, lo + (MIN_SPAN_NS if hi else NS_PER_S))


@dataclass(frozen=True)
class RunGpu:
    """One GPU of a run: *key* its normalized UUID (what rows are stored under)."""

    key: str
    info: dict[str, Any]


async def gpus_of(state: WebState, run: dict[str, Any], lo: int, hi: int) -> list[RunGpu]:
    """The run's GPU (the CUDA device it reported), or every GPU the node
    sampled in [*lo*, *hi*] when it reported none; each labelled from this
    node's devices where known (index, ``GPU-…`` UUID, name), else (a team
    server, which has only what was ingested) from the run: its device's
    UUID as reported and its model, the index unknown (None)."""
    devices: dict[str, Any] = {}
    for d in state.devices:
        for u in (d.uuid, *d.mig_uuids):
            devices[normalize_uuid(u) or u] = d
    reported = (run.get("cuda_uuid") or "").strip()
    want = normalize_uuid(reported or None)
    if want is not None:
        found = [{"uuid": want, "mem_total_bytes": await series.gpu_mem_total(state.reader, want)}]
    else:
        found = await series.sampled_gpus(state.reader, run.get("boot_id"), lo - NS_PER_S, hi)
    out = []
    for row in found:
        key = row["uuid"]
        dev = devices.get(key)
        name = dev.name if dev is not None else (run.get("gpu_model") if want else None)
        out.append(
            RunGpu(
                key,
                {
                    "index": dev.index if dev is not None else None,
                    "uuid": dev.uuid if dev is not None else (reported if key == want else key),
                    "name": name,
                    "mem_total_bytes": row.get("mem_total_bytes"),
                    "power_limit_w": (
                        dev.power_limit_mw / 1e3
                        if dev is not None and dev.power_limit_mw is not None
                        else None
                    ),
                },
            )
        )
    return sorted(out, key=lambda g: (g.info["index"] is None, g.info["index"] or 0, g.key))


def _s(ns: int | None) -> float | None:
    return None if ns is None else round(ns / NS_PER_S, 3)


async def run_view(state: WebState, run_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``/runs/{id}``'s ``run``, the run's summary).

    Raises:
        UnknownRunError: no such run.
    """
    db = state.reader
    run = await reads.run_overview(db, run_id)
    summary = await load_summary(db, run_id, state.live_summary(run_id))
    median = run.get("median_step_ms")
    row = describe(run, median if median is not None else summary.get("median_step_ms"), summary)
    lo, hi = await window_of(state, run)
    # the summary block's headline figures (steady state), not a second mean
    mean = summary.get("mean_iteration_ms")
    if mean is None:  # too few steps for a steady state
        mean = summary.get("avg_step_ms")
    view = {
        "id": run["id"],
        "name": run["run_name"],
        "status": run["status"],
        "live": run["id"] in state.live_run_ids(),
        "host": run.get("host"),
        "user": run.get("user_name"),
        "rank": run.get("rank"),
        "local_rank": run.get("local_rank"),
        "world_size": run.get("world_size"),
        "group": run.get("group_id"),
        "start_s": _s(run.get("start_wall_ns")),
        "end_s": _s(run.get("end_wall_ns")),
        "steps": row["steps"],
        "median_step_ms": row["median_step_ms"],
        "mean_step_ms": mean,
        "steps_per_s": summary.get("steps_per_s") or (round(1000.0 / mean, 3) if mean else None),
        "micro_batches": (run["agg"] or {}).get("micro_max"),
        "mfu": row["mfu"],
        "achieved_tflops": row["achieved_tflops"],
        "pct_of_iteration": row["pct_of_iteration"],
        "gpus": [g.info for g in await gpus_of(state, run, lo, hi)],
        "dropped_events": row["dropped_events"],
        "store_dropped_events": row["store_dropped_events"],
        "error": run.get("error"),
    }
    return view, summary


async def live_view(state: WebState, run_id: int) -> dict[str, Any]:
    """The part of :func:`run_view` that changes while a run goes on, cheap to
    read every few seconds (no step aggregates)."""
    run = await reads.get_run(state.reader, run_id)
    # the count first: steps stored after it have indices past last_step
    steps = await reads.count_steps(state.reader, run_id)
    return {
        "id": run["id"],
        "name": run["run_name"],
        "status": run["status"],
        "live": run["id"] in state.live_run_ids(),
        "steps": steps,
        "last_step": await reads.max_step(state.reader, run_id),
        "end_s": _s(run.get("end_wall_ns")),
        "dropped_events": run.get("dropped_events") or 0,
        "error": run.get("error"),
    }


def with_times(row: dict[str, Any]) -> dict[str, Any]:
    """A runs-list row (:func:`gpuprofd.views.runs.describe`) with ``name``,
    ``start_s`` and ``end_s``."""
    return {
        **row,
        "name": row["run_name"],
        "start_s": _s(row.get("start_wall_ns")),
        "end_s": _s(row.get("end_wall_ns")),
    }
