"""The end-of-run summary block: built by gpuprofd, printed by the shim and
by ``gpuprofctl insights`` (one formatter, so both show the same thing).

A summary is a plain dict (it crosses the control socket as JSON)::

    {"run_id": 1, "run_name": "digits-mlp", "status": "finished",
     "steps": 200, "avg_step_ms": 121.3, "median_step_ms": 118.0,
     "mean_iteration_ms": 119.5, "steps_per_s": 8.368,  # steady (warm-up excluded)
     "measured_under_contention": None,  # or {"share_of_steps": 0.42,
                                         #     "other_cores": 1.2, "cpu_count": 2}
     "db": "/abs/path/gpuprof.db",
     "memory": {"torch_peak_allocated_bytes": ..., ...},  # only what is known
     "mfu": 0.312, "achieved_tflops": 304.2,   # None when unknown (see mfu_figures)
     "compute": {"flops_per_step": 3.37e12, "flops_source": "counter", ...},
     "comm": {"median_exposed_ms": 12.3, "median_share_of_step": 0.18,  # None:
              "buckets_per_step": 4, "bytes_per_step": 25100000},  # no bucket timed
              # (bytes_per_step: gradient bytes, the buckets' sizes, not wire bytes)
     "insights": [Insight.to_dict(), ...],   # ranked by gain (gain_* fields), then severity
     "gains": {"iteration_ms": 56.8, "parts_ms": {...},  # gpuprof.insights.gains.gains_block:
               "fix_all_speedup_max": 3.1, ...},        # what fixing them all is worth
     "duration_s": 2640.0,                    # the run's wall time, start to end
     "group": {"group": "job-7", "ranks": 4,  # only for a run of a group (torchrun):
               "insights": [...],             # the group rules at this rank's end,
               "lost_ranks": [{"rank": 1, "status": "lost", "last_step": 20,
                               "message": "rank 1 lost at step ~20", ...}],  # others
               "missing_ranks": [...], "runs_note": None},  # (gpuprofd.storage.reads)
     "notes": ["no NVIDIA GPU found: GPU metrics skipped", ...],
     "group_id": "job-7",                     # a run of a group: "Group report:" line
     "team_url": "https://server/runs/<uuid>"}  # a forwarding node: the run there
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof.evidence import profile_line
from gpuprof.gpus import find_gpu, normalize_dtype, peak_tflops
from gpuprof.insights.base import RunContext
from gpuprof.insights.compute import run_mfu
from gpuprof.insights.contention import measured_under_contention
from gpuprof.insights.distributed import RankStats, _steady, comm_fraction
from gpuprof.insights.gains import gains_block, ranked
from gpuprof.stats import mean, median

RULE = "─" * 60
_SEVERITY_LABEL = {"HIGH": "[HIGH]", "MED": "[MED] ", "LOW": "[LOW] "}


def memory_peaks(ctx: RunContext) -> dict[str, int]:
    """The run's peak GPU memory, bytes, only the figures known: torch's
    ``torch_peak_allocated_bytes`` / ``torch_peak_reserved_bytes`` (reported by
    the shim) and NVML's ``nvml_peak_used_bytes`` / ``nvml_total_bytes``
    (sampled by gpuprofd). Empty for a CPU run."""
    g = ctx.gpu
    figures = {
        "torch_peak_allocated_bytes": ctx.torch_peak_allocated_bytes,
        "torch_peak_reserved_bytes": ctx.torch_peak_reserved_bytes,
        "nvml_peak_used_bytes": g.mem_used_max_bytes if g is not None else None,
        "nvml_total_bytes": g.mem_total_bytes if g is not None else None,
    }
    return {k: v for k, v in figures.items() if v is not None}


def memory_line(memory: Mapping[str, int]) -> str | None:
    """One summary line from :func:`memory_peaks`' figures; None when torch
    and NVML reported nothing. NVML used > reserved > allocated is normal
    (CUDA context and other processes; the allocator's cache)."""
    gb = {k: v / 1e9 for k, v in memory.items()}
    parts = []
    if "torch_peak_allocated_bytes" in gb:
        parts.append(f"torch allocated {gb['torch_peak_allocated_bytes']:.2f} GB")
    if "torch_peak_reserved_bytes" in gb:
        parts.append(f"reserved {gb['torch_peak_reserved_bytes']:.2f} GB")
    if "nvml_peak_used_bytes" in gb:
        total = gb.get("nvml_total_bytes")
        of = f" of {total:.2f} GB" if total is not None else " GB"
        parts.append(f"NVML used {gb['nvml_peak_used_bytes']:.2f}{of}")
    return "  GPU memory at peak: " + ", ".join(parts) if parts else None


def mfu_figures(ctx: RunContext) -> dict[str, Any]:
    """The run's compute figures, each None when unknown.

    ``mfu`` (0-1) and ``achieved_tflops`` (TFLOP/s per GPU) are
    ``flops_per_step`` over the steady median step time (see
    :func:`gpuprof.insights.compute.run_mfu`) and the dtype's dense
    ``peak_tflops`` from :mod:`gpuprof.gpus`; ``achieved_tflops`` is known
    without a peak too. ``flops_source`` is ``user``, ``arch`` or ``counter``;
    ``flops_counted`` the FLOP FlopCounterMode counted in one step (shown
    beside a declared figure). ``mfu_unknown`` says why MFU is unknown (None
    when known, or on a CPU run with nothing declared).
    """
    step_ms = ctx.median_step_ms
    dtype = normalize_dtype(ctx.dtype)
    flops = ctx.flops_per_step
    achieved = flops / (step_ms / 1e3) / 1e12 / max(ctx.gpu_count, 1) if flops and step_ms else None
    m = run_mfu(ctx)
    why = None
    if m is None and (ctx.gpu_model or flops):
        if not flops:
            why = (
                "no FLOP count: pass arch=gpuprof.TransformerArch(...) with "
                "tokens_per_step=, or flops_per_step="
            )
        elif not ctx.gpu_model:
            why = "no GPU"
        elif not getattr(find_gpu(ctx.gpu_model), "peak_tflops", None):
            why = f"{ctx.gpu_model} is not in gpuprof's datasheet peak table"
        elif dtype is None:
            why = "training dtype unknown: pass dtype="
        elif peak_tflops(ctx.gpu_model, dtype) is None:
            why = f"no {dtype} peak for {ctx.gpu_model}"
        elif not step_ms:
            why = "no steady steps timed"
    return {
        "mfu": round(m.mfu, 4) if m else None,
        "achieved_tflops": round(achieved, 2) if achieved is not None else None,
        "peak_tflops": m.peak_tflops if m else peak_tflops(ctx.gpu_model, dtype),
        "dtype": dtype,
        "flops_per_step": flops,
        "flops_source": ctx.flops_source if flops else None,
        "flops_counted": ctx.flops_counted,
        "mfu_unknown": why,
    }


def mfu_line(compute: Mapping[str, Any]) -> str | None:
    """One summary line from :func:`mfu_figures`; None when there is nothing
    to say (a CPU run with no FLOPs declared or counted)."""
    flops = compute.get("flops_per_step")
    src = compute.get("flops_source")
    how = f"{flops:.3g} FLOP/step" + (f" from {src}" if src else "") if flops else ""
    counted = compute.get("flops_counted")
    if counted and flops and src != "counter":
        how += f", counted {counted:.3g} ({counted / flops - 1:+.1%})"
    achieved = compute.get("achieved_tflops")
    if compute.get("mfu") is not None:
        return (
            f"  MFU {compute['mfu']:.1%}: {achieved:.1f} TFLOP/s achieved of "
            f"{compute['peak_tflops']:g} TFLOP/s {compute['dtype']} peak ({how})"
        )
    if compute.get("mfu_unknown") is None:
        return None
    done = f"{achieved:.1f} TFLOP/s achieved ({how}); " if achieved is not None else ""
    return f"  MFU unknown: {done}{compute['mfu_unknown']}"


def comm_medians(
    step_ms: Sequence[float], comm_ms: Sequence[float]
) -> tuple[float | None, float | None]:
    """(median exposed comm ms per step, median comm share of the step 0-1)
    over the steady steps of *step_ms* / *comm_ms* (per step, in step order,
    traced steps already left out): the group rules' definition
    (:func:`gpuprof.insights.distributed.comm_fraction`, warm-up excluded as
    their ``_steady`` does), so the summary, ``gpuprofctl insights --group``
    and ``comm_dominant`` give one figure. (None, None) without comm figures."""
    if not comm_ms or len(comm_ms) != len(step_ms):
        return None, None
    steady = _steady(tuple(comm_ms))
    share = comm_fraction(RankStats(rank=0, step_ms=tuple(step_ms), comm_ms=tuple(comm_ms)))
    return (median(steady) if steady else None), share


def comm_figures(ctx: RunContext) -> dict[str, Any] | None:
    """The run's DDP gradient all-reduce figures, None when it timed no
    bucket: ``median_exposed_ms`` (the ``comm`` phase: collective time not
    hidden under backward) and ``median_share_of_step`` (0-1, comm / step
    time per step), medians over the steady steps (:func:`comm_medians`, as
    ``comm_dominant`` compares); ``buckets_per_step`` and ``bytes_per_step``
    (means over the steps with buckets; bytes are gradient bytes, the
    buckets' sizes as handed to the comm hook, not bytes on the wire: a
    compression hook sends fewer)."""
    c = ctx.comm
    if c is None or not c.steps:
        return None
    exposed, share = comm_medians(ctx.step_ms, ctx.comm_ms)
    return {
        "median_exposed_ms": round(exposed, 3) if exposed is not None else None,
        "median_share_of_step": round(share, 4) if share is not None else None,
        "buckets_per_step": round(c.buckets / c.steps, 2),
        "bytes_per_step": round(c.bytes / c.steps),
    }


def size_text(nbytes: float) -> str:
    """*nbytes* in decimal units, small sizes too: ``512 B``, ``16.6 KB``,
    ``25.1 MB``, ``1.20 GB``."""
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.2f} GB"
    if nbytes >= 1e6:
        return f"{nbytes / 1e6:.1f} MB"
    if nbytes >= 1e3:
        return f"{nbytes / 1e3:.1f} KB"
    return f"{nbytes:.0f} B"


def seconds_text(seconds: float) -> str:
    """A time said in the unit that shows it: ``4 ms`` below a second (so a
    few milliseconds never read ``0.0 s``), else ``12.3 s``."""
    if seconds < 0.9995:  # what would round to 1000 ms reads 1.0 s
        return f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.1f} s"


def comm_line(comm: Mapping[str, Any] | None) -> str | None:
    """``  Comm (median of steady steps): 12.3 ms/step exposed, 18 % of step;
    4 buckets, gradient bytes 25.1 MB/step`` from :func:`comm_figures` (the
    buckets' sizes, not bytes on the wire: an fp16 compression hook sends
    half; :func:`size_text`); None without comm figures. A summary stored
    before the medians (``exposed_ms_per_step``: the mean,
    ``share_of_step``: of the summed step time) says so."""
    if not comm:
        return None
    if "median_exposed_ms" in comm or "median_share_of_step" in comm:
        exposed, share = comm.get("median_exposed_ms"), comm.get("median_share_of_step")
        label, of = "Comm (median of steady steps)", "of step"
    else:  # stored by an older gpuprofd
        exposed, share = comm.get("exposed_ms_per_step"), comm.get("share_of_step")
        label, of = "Comm (mean per step)", "of total step time"
    head = f"{exposed:.1f} ms/step exposed" if exposed is not None else "exposed time unknown"
    if share is not None:
        head += f", {100 * share:.0f} % {of}"
    n = comm["buckets_per_step"]
    return (
        f"  {label}: {head}; {n:g} bucket{'' if n == 1 else 's'}, "
        f"gradient bytes {size_text(comm['bytes_per_step'])}/step"
    )


def micro_batches_per_step(ctx: RunContext) -> float | None:
    """Mean micro-batches (forward/backward passes per optimizer update:
    gradient accumulation) over the run's timed steps but the first, as
    ``gpuprofctl runs`` counts them; None without steps. Rounded to 0.01."""
    micro = ctx.micro_batches[1:] if len(ctx.micro_batches) > 1 else ctx.micro_batches
    return round(mean(micro), 2) if micro else None


def micro_line(summary: Mapping[str, Any]) -> str | None:
    """``  Micro-batches per step: 4 (gradient accumulation)`` when the
    summary's ``micro_batches_per_step`` is above 1, else None."""
    micro = summary.get("micro_batches_per_step")
    if micro is None or micro <= 1:
        return None
    return f"  Micro-batches per step: {micro:g} (gradient accumulation)"


def make_summary(
    run_id: int | None,
    ctx: RunContext,
    insights: Sequence[Mapping[str, Any]],
    db: str | None,
    notes: Sequence[str] = (),
    error: str | None = None,
) -> dict[str, Any]:
    """Assemble the summary dict of one run; *error* is what ended a failed
    run (``"TypeName: message"``, as the shim reports it).

    ``avg_step_ms`` is the mean iteration time (loader wait + step, ms) over
    all steps; ``median_step_ms`` the steady-state median (warm-up excluded);
    ``mean_iteration_ms`` the steady-state mean and ``steps_per_s`` its
    inverse (what throughput plans with: the mean holds when iteration times
    are bimodal, the median jumps between the modes).
    ``measured_under_contention``: None, or (when other processes held the
    host's CPU during ≥ 10 % of the steps) ``{"share_of_steps": 0-1,
    "other_cores": cores, "cpu_count": n}``
    (:func:`gpuprof.insights.contention.measured_under_contention`).
    ``micro_batches_per_step`` see :func:`micro_batches_per_step`. Each of
    ``optimizers`` has ``updates`` and ``skipped`` (``step()`` calls over
    the run), ``total_ms`` (time inside its ``step()`` over the run) and
    ``step_ms`` (that per step it stepped in, ms). ``insights`` come ranked
    by gain (:func:`gpuprof.insights.gains.ranked`); ``gains`` is
    :func:`gpuprof.insights.gains.gains_block` (the iteration's parts and
    what fixing every finding is worth); ``duration_s`` the run's wall time.
    """
    iteration = ctx.iteration_ms
    median_ms = ctx.median_step_ms
    found = [dict(i) for i in ranked(insights)]
    steady = ctx.steady_iteration_ms
    steady_mean = mean(steady) if steady else None
    compute = mfu_figures(ctx)
    return {
        "run_id": run_id,
        "run_name": ctx.run_name,
        "status": ctx.status,
        "steps": ctx.steps + ctx.traced_steps,
        "avg_step_ms": round(mean(iteration), 3) if iteration else None,
        "median_step_ms": round(median_ms, 3) if median_ms is not None else None,
        "mean_iteration_ms": round(steady_mean, 3) if steady_mean is not None else None,
        "steps_per_s": round(1e3 / steady_mean, 3) if steady_mean else None,
        "measured_under_contention": measured_under_contention(ctx),
        "skipped_updates": ctx.skipped_updates,
        "eval_s": round(ctx.eval_ms / 1e3, 3),
        "micro_batches_per_step": micro_batches_per_step(ctx),
        "optimizers": [
            {
                "name": name,
                "updates": updates,
                "skipped": skipped,
                "step_ms": round(total_ms / steps, 3) if steps else None,
                "total_ms": total_ms,
            }
            for name, updates, skipped, total_ms, steps in ctx.optimizers
        ],
        "db": db,
        "memory": memory_peaks(ctx),
        "mfu": compute["mfu"],
        "achieved_tflops": compute["achieved_tflops"],
        "compute": compute,
        "comm": comm_figures(ctx),
        "insights": found,
        "gains": gains_block(ctx, found),
        "duration_s": round(ctx.duration_s, 3),
        "notes": list(notes),
        **({"error": error} if error else {}),
    }


#: Characters of a failed run's error shown in the summary block.
ERROR_LINE_CHARS = 200


def speedup_text(speedup: float) -> str:
    """``2.3×``; two decimals below 1.1× (``1.04×``), where one would say 1.0."""
    return f"{speedup:.2f}×" if speedup < 1.095 else f"{speedup:.1f}×"


def duration_text(seconds: float) -> str:
    """A run-sized duration: ``14 s`` below 90 s (``30 ms`` below one), ``25
    min`` below 90 min, else ``3.2 h``."""
    if seconds < 0.9995:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def money_text(usd: float) -> str:
    return f"${usd:.2f}" if usd < 100 else f"${usd:,.0f}"


def ms_figure(ms: float) -> str:
    """Milliseconds with two significant digits or more: ``52.1``, ``0.35``,
    ``0.028`` (a sub-millisecond step's gain is not ``0.0``)."""
    if ms >= 0.95 or ms == 0:
        return f"{ms:.1f}"
    return f"{ms:.2f}" if ms >= 0.095 else f"{ms:.3f}"


def gain_line(ins: Mapping[str, Any], details: bool = False) -> list[str]:
    """A finding's worth, from its ``gain_*`` fields: ``Worth: up to 2.3×
    faster: 32.4 of 56.8 ms per iteration (57%), ~25 min of this run``;
    ``Worth: not estimated`` (*details*: and why); *details* adds the
    method (``How: ...``). Empty for a finding that costs no time."""
    method = ins.get("gain_method")
    ms = ins.get("gain_ms_per_iteration")
    pad = "          "
    if ms is None:
        if not method:
            return []
        return [f"{pad}Worth: {method}" if details else f"{pad}Worth: not estimated"]
    speedup = ins.get("gain_speedup_max")
    head = f"up to {speedup_text(speedup)} faster" if speedup else "the whole iteration"
    base = ins.get("gain_iteration_ms")
    of = f" of {ms_figure(base)}" if base is not None else ""
    pct = ins.get("gain_pct")
    share = f" ({pct:.0f}%)" if pct is not None else ""
    text = f"{pad}Worth: {head}: {ms_figure(ms)}{of} ms per iteration{share}"
    if ins.get("gain_run_s"):
        text += f", ~{duration_text(ins['gain_run_s'])}"
        if ins.get("gain_usd") is not None:
            text += f", ~{money_text(ins['gain_usd'])}"
        text += " of this run"
    lines = [text]
    if details and method:
        lines.append(f"{pad}How: {method}")
    return lines


def gain_headline(summary: Mapping[str, Any]) -> str | None:
    """``  Fixing the loader stall: up to 2.3× faster (~25 min of this 44-min
    run)`` from the top-ranked finding with a gain (and, when several have
    one and together give more, ``; fixing all 3: up to 2.5×``); None when
    no finding has a gain above 0."""
    top = next(
        (
            i
            for i in ranked(summary.get("insights") or [])
            if i.get("gain_ms_per_iteration") and i.get("gain_speedup_max")
        ),
        None,
    )
    if top is None:
        return None
    label = top.get("gain_label") or "the top finding"
    text = f"  Fixing {label}: up to {speedup_text(top['gain_speedup_max'])} faster"
    saved = []
    if top.get("gain_run_s"):
        duration = summary.get("duration_s")
        run = f" of this {duration_text(duration).replace(' ', '-')} run" if duration else ""
        saved.append(f"~{duration_text(top['gain_run_s'])}{run}")
    if top.get("gain_usd") is not None:
        saved.append(f"~{money_text(top['gain_usd'])}")
    if saved:
        text += f" ({', '.join(saved)})"
    gains = summary.get("gains") or {}
    n, everything = gains.get("findings") or 0, gains.get("fix_all_speedup_max")
    if n > 1 and everything and everything > top["gain_speedup_max"]:
        text += f"; fixing all {n}: up to {speedup_text(everything)}"
    return text


def insight_lines(insights: Sequence[Mapping[str, Any]], details: bool = False) -> list[str]:
    """One line per insight dict (severity, title) and its worth
    (:func:`gain_line`), ranked by gain; *details* adds its detail, fix and
    gain method lines. The summary block's look, shared with the group report."""
    lines = []
    for ins in ranked(insights):
        lines.append(f"  {_SEVERITY_LABEL.get(ins['severity'], ins['severity'])} {ins['title']}")
        lines.extend(gain_line(ins, details))
        if details:
            if ins.get("detail"):
                lines.append(f"          {ins['detail']}")
            if ins.get("fix"):
                lines.append(f"          Fix: {ins['fix']}")
            seen = profile_line((ins.get("evidence") or {}).get("profile"))
            if seen:
                lines.append(f"          {seen}")
    return lines


def group_lines(group: Mapping[str, Any] | None, details: bool = False) -> list[str]:
    """The summary's group block: ``  Group NAME (N ranks):``, the other
    ranks lost or failed by the time it was built (``rank 1 lost at step
    ~20``, from their stored statuses), the ranks that never reported, a
    reused group's note, then the group's findings (:func:`insight_lines`);
    nothing when the run has no group and none of these is there."""
    if not group:
        return []
    others = [*(group.get("lost_ranks") or []), *(group.get("missing_ranks") or [])]
    said = [m["message"] for m in others]
    if group.get("runs_note"):
        said.append(group["runs_note"])
    found = group.get("insights") or []
    if not found and not said:
        return []
    n = group.get("ranks")
    ranks = f" ({n} rank{'' if n == 1 else 's'})" if n is not None else ""
    return [
        f"  Group {group.get('group')}{ranks}:",
        *(f"  {m}" for m in said),
        *insight_lines(found, details),
    ]


#: Mean and median iteration differing by more than this share of the mean
#: are both shown: bimodal steps (workers delivering batches in pairs) put the
#: median on either mode from one run to the next.
MEDIAN_SHOWN_BEYOND = 0.10


def headline(summary: Mapping[str, Any]) -> str:
    """``30 steps, 130.2 ms/iteration (median 98.8), 7.7 steps/s``: the
    steady mean iteration time, its median beside it when it differs by >
    :data:`MEDIAN_SHOWN_BEYOND`, and the throughput; a summary stored before
    the mean shows its median (or the all-steps mean)."""
    steps = summary.get("steps", 0)
    mean_ms, median_ms = summary.get("mean_iteration_ms"), summary.get("median_step_ms")
    text = f"{steps} step{'' if steps == 1 else 's'}"
    if mean_ms:
        text += f", {mean_ms:.1f} ms/iteration"
        if median_ms is not None and abs(median_ms - mean_ms) > MEDIAN_SHOWN_BEYOND * mean_ms:
            text += f" (median {median_ms:.1f})"
        text += f", {1e3 / mean_ms:.1f} steps/s"
    elif median_ms is not None:
        text += f", median {median_ms:.1f} ms"
    elif summary.get("avg_step_ms") is not None:
        text += f", avg {summary['avg_step_ms']:.1f} ms"
    return text


def held_text(contended: Mapping[str, Any]) -> str:
    """``1.2 of 2 cores`` (``CPU`` when unknown): what other processes held,
    from a ``measured_under_contention`` dict."""
    others, n = contended.get("other_cores"), contended.get("cpu_count")
    if others is None:
        return "CPU"
    return f"{others:.1f}" + (f" of {n}" if n else "") + " cores"


def contention_line(contended: Mapping[str, Any] | None) -> str | None:
    """``  Measured under contention: other processes held 1.2 of 2 cores
    during 42% of the steps; ...`` from the summary's
    ``measured_under_contention``; None when it is None."""
    if not contended:
        return None
    return (
        f"  Measured under contention: other processes held {held_text(contended)} during "
        f"{contended['share_of_steps']:.0%} of the steps; its timings are slower "
        "than on an idle host."
    )


def format_summary(summary: Mapping[str, Any], details: bool = False) -> str:
    """Render *summary* as the boxed text block; ``details`` adds each
    insight's detail and fix lines (``gpuprofctl insights`` does)."""
    head = f"gpuprof · {summary['run_name']}  ({headline(summary)})"
    status = summary.get("status")
    if status and status not in ("finished", "running"):
        head += f"  [{status.upper()}]"
    lines = [RULE, head]
    contended = contention_line(summary.get("measured_under_contention"))
    if contended:
        lines.append(contended)
    if summary.get("error"):  # what ended it, first line (a message may span several)
        first = str(summary["error"]).splitlines()[0] if str(summary["error"]).strip() else ""
        lines.append(f"  Ended by: {first[:ERROR_LINE_CHARS]}")
    extra = []
    if summary.get("skipped_updates"):
        extra.append(f"{summary['skipped_updates']} skipped updates (inf/NaN gradients)")
    if summary.get("eval_s"):
        extra.append(f"{seconds_text(summary['eval_s'])} in evaluation, outside steps")
    if extra:
        lines.append("  " + "; ".join(extra))
    micro = micro_line(summary)
    if micro:
        lines.append(micro)
    optimizers = summary.get("optimizers") or []
    if len(optimizers) > 1:  # one optimizer says nothing the step count does not
        parts = [  # a summary stored before total_ms had the total as step_ms
            f"{o['name']} {o['updates']} updates, "
            f"{o.get('total_ms', o['step_ms']) / 1e3:.2f} s in step()"
            for o in optimizers
        ]
        lines.append("  Optimizers: " + "; ".join(parts))
    memory = memory_line(summary.get("memory") or {})
    if memory:
        lines.append(memory)
    mfu = mfu_line(summary.get("compute") or {})
    if mfu:
        lines.append(mfu)
    comm = comm_line(summary.get("comm"))
    if comm:
        lines.append(comm)
    insights = summary.get("insights") or []
    top = gain_headline(summary)
    if top:
        lines.append(top)
    by = ", by what fixing each is worth" if any(i.get("gain_method") for i in insights) else ""
    lines.append(f"  Insights ({len(insights)}{by}):")
    lines.extend(insight_lines(insights, details))
    lines.extend(group_lines(summary.get("group"), details))
    for note in summary.get("notes") or []:
        lines.append(f"  Note: {note}")
    if summary.get("run_id") is not None and summary.get("db"):
        db = shlex.quote(str(summary["db"]))
        if "://" in str(summary["db"]):  # a database URL (Postgres), not a file
            db = f"--storage-url {db}"
        lines.append(f"  Full report: gpuprofctl insights {db} {summary['run_id']}")
        group = summary.get("group_id") or (summary.get("group") or {}).get("group")
        if group:
            lines.append(
                f"  Group report: gpuprofctl insights {db} --group {shlex.quote(str(group))}"
            )
    if summary.get("team_url"):
        lines.append(f"  Team server: {summary['team_url']}")
    lines.append(RULE)
    return "\n".join(lines)
