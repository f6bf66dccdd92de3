"""The end-of-run summary block: built by gpuprofd, printed by the shim and
by ``gpuprofctl insights`` (one formatter, so both show the same thing).

A summary is a plain dict (it crosses the control socket as JSON)::

    {"run_id": 1, "run_name": "digits-mlp", "status": "finished",
     "steps": 200, "avg_step_ms": 121.3, "median_step_ms": 118.0,
     "db": "/abs/path/gpuprof.db",
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
