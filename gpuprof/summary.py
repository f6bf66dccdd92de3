"""The end-of-run summary block: built by gpuprofd, printed by the shim and
by ``gpuprofctl insights`` (one formatter, so both show the same thing).

A summary is a plain dict (it crosses the control socket as JSON)::

    {"run_id": 1, "run_name": "digits-mlp", "status": "finished",
     "steps": 200, "avg_step_ms": 121.3, "median_step_ms": 118.0,
     "db": "/abs/path/gpuprof.db",
     "memory": {"torch_peak_allocated_bytes": ..., ...},  # only what is known
     "insights": [Insight.to_dict(), ...],   # most severe first
     "notes": ["no NVIDIA GPU found: GPU metrics skipped", ...]}
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof.insights.base import RunContext
from gpuprof.stats import mean

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


def make_summary(
    run_id: int | None,
    ctx: RunContext,
    insights: Sequence[Mapping[str, Any]],
    db: str | None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Assemble the summary dict of one run.

    ``avg_step_ms`` is the mean iteration time (loader wait + step, ms) over
    all steps; ``median_step_ms`` the steady-state median (warm-up excluded).
    """
    iteration = ctx.iteration_ms
    median_ms = ctx.median_step_ms
    return {
        "run_id": run_id,
        "run_name": ctx.run_name,
        "status": ctx.status,
        "steps": ctx.steps,
        "avg_step_ms": round(mean(iteration), 3) if iteration else None,
        "median_step_ms": round(median_ms, 3) if median_ms is not None else None,
        "skipped_updates": ctx.skipped_updates,
        "eval_s": round(ctx.eval_ms / 1e3, 3),
        "optimizers": [
            {"name": n, "updates": u, "skipped": k, "step_ms": ms} for n, u, k, ms in ctx.optimizers
        ],
        "db": db,
        "memory": memory_peaks(ctx),
        "insights": [dict(i) for i in insights],
        "notes": list(notes),
    }


def format_summary(summary: Mapping[str, Any], details: bool = False) -> str:
    """Render *summary* as the boxed text block; ``details`` adds each
    insight's detail and fix lines (``gpuprofctl insights`` does)."""
    steps = summary.get("steps", 0)
    avg = summary.get("avg_step_ms")
    head = f"gpuprof · {summary['run_name']}  ({steps} steps"
    head += f", avg {avg:.1f} ms)" if avg is not None else ")"
    status = summary.get("status")
    if status and status not in ("finished", "running"):
        head += f"  [{status.upper()}]"
    lines = [RULE, head]
    extra = []
    if summary.get("skipped_updates"):
        extra.append(f"{summary['skipped_updates']} skipped updates (inf/NaN gradients)")
    if summary.get("eval_s"):
        extra.append(f"{summary['eval_s']:.1f} s in evaluation, outside steps")
    if extra:
        lines.append("  " + "; ".join(extra))
    optimizers = summary.get("optimizers") or []
    if len(optimizers) > 1:  # one optimizer says nothing the step count does not
        parts = [f"{o['name']} {o['updates']} updates, {o['step_ms'] / 1e3:.2f} s in step()"
                 for o in optimizers]  # fmt: skip
        lines.append("  Optimizers: " + "; ".join(parts))
    memory = memory_line(summary.get("memory") or {})
    if memory:
        lines.append(memory)
    insights = summary.get("insights") or []
    lines.append(f"  Insights ({len(insights)}):")
    for ins in insights:
        lines.append(f"  {_SEVERITY_LABEL.get(ins['severity'], ins['severity'])} {ins['title']}")
        if details:
            if ins.get("detail"):
                lines.append(f"          {ins['detail']}")
            if ins.get("fix"):
                lines.append(f"          Fix: {ins['fix']}")
    for note in summary.get("notes") or []:
        lines.append(f"  Note: {note}")
    if summary.get("run_id") is not None and summary.get("db"):
        lines.append(
            f"  Full report: gpuprofctl insights {shlex.quote(str(summary['db']))} "
            f"{summary['run_id']}"
        )
    lines.append(RULE)
    return "\n".join(lines)
