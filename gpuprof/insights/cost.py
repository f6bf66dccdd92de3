"""What the run cost, from GPU-hours and a reference price."""

from __future__ import annotations

from gpuprof.config import ENV_GPU_RATE
from gpuprof.gpus import find_gpu
from gpuprof.insights.base import Insight, RunContext, rule
from gpuprof.insights.compute import run_mfu


def _not_estimated(why: str, fix: str) -> Insight:
    return Insight(
        rule="estimated_cost",
        severity="LOW",
        title=f"Estimated cost: not estimated ({why})",
        detail="",
        fix=fix,
        evidence={},
    )


def gpu_rate(ctx: RunContext) -> float | None:
    """USD per GPU-hour of the run's GPU: ``GPUPROF_GPU_RATE`` when set, else
    the price table's (:mod:`gpuprof.gpus`); None on a CPU run or a GPU
    without a price. The cost line and the findings' gains use this one rate."""
    if ctx.gpu_count < 1 or not ctx.gpu_model:
        return None
    spec = find_gpu(ctx.gpu_model)
    return ctx.gpu_rate_usd_per_hour or (spec.usd_per_hour if spec else None)


@rule("estimated_cost")
def estimated_cost(ctx: RunContext) -> Insight | None:
    """Always reports: GPU-hours × USD/h (``GPUPROF_GPU_RATE`` or the price
    table), the idle share when MFU is known; or says why it is not estimated."""
    if ctx.gpu_count < 1 or not ctx.gpu_model:
        return _not_estimated("no NVIDIA GPU in this run", "Nothing to do: CPU time is not priced.")
    rate = gpu_rate(ctx)
    if rate is None:
        return _not_estimated(
            f"no reference price for {ctx.gpu_model}", f"Set {ENV_GPU_RATE}=<USD per GPU-hour>."
        )
    gpu_hours = ctx.duration_s / 3600 * ctx.gpu_count
    usd = gpu_hours * rate
    title = (
        f"Estimated cost: ${usd:.2f} ({ctx.duration_s / 60:.0f} min · "
        f"{ctx.gpu_count}× GPU @ ${rate:.2f}/h)"
    )
    m = run_mfu(ctx)
    if m is not None:
        title += f"; ~${usd * (1 - m.mfu):.2f} of that is idle capacity (MFU {m.mfu:.1%})"
    source = f"{ENV_GPU_RATE}" if ctx.gpu_rate_usd_per_hour else "the AWS on-demand list"
    return Insight(
        rule="estimated_cost",
        severity="LOW",
        title=title,
        detail=f"{gpu_hours:.3f} GPU-hours at ${rate:.2f}/GPU-hour from {source}.",
        fix=f"Set {ENV_GPU_RATE} to your fleet's price per GPU-hour.",
        evidence={"usd": round(usd, 4), "gpu_hours": round(gpu_hours, 5), "usd_per_hour": rate},
    )
