"""The DataLoader's prefetch queue running dry: a loop fast enough on
average whose timed loader still makes it wait, now and then, for a batch."""

from __future__ import annotations

from gpuprof.insights.base import WARMUP_STEPS, Insight, RunContext, rule
from gpuprof.insights.loading import config_evidence, main_loader
from gpuprof.insights.steps import STALL_FRACTION, stall_fraction

#: Seed rule table: a loader wait above 30 ms is one the prefetch queue did not cover.
STARVED_WAIT_MS = 30.0
#: Seed rule table: on at least this share of the steady steps.
STARVED_SHARE = 0.20
#: A deeper queue than the default 2 batches per worker, as the fix proposes.
PREFETCH_TARGET = 4


def starved_steps(ctx: RunContext) -> list[int]:
    """Indices of the steady steps (warm-up excluded) whose loader time
    (:attr:`RunContext.loader_ms`) was above :data:`STARVED_WAIT_MS`."""
    loader = ctx.loader_ms
    return [i for i in range(WARMUP_STEPS, len(loader)) if loader[i] > STARVED_WAIT_MS]


def _fix(ctx: RunContext) -> str:
    """The settings worth changing, given the loader's own (when reported)."""
    cfg = main_loader(ctx)
    if cfg is None:
        return (
            f"Raise the DataLoader's prefetch_factor (e.g. {PREFETCH_TARGET}) and set "
            "persistent_workers=True, so batches are ready before the loop asks."
        )
    if cfg.num_workers == 0:
        return (
            "Load in worker processes (num_workers > 0): with num_workers=0 nothing is "
            "prefetched, every batch is made when the loop asks for it."
        )
    steps = []
    now = cfg.prefetch_factor or 2
    if now < PREFETCH_TARGET:
        steps.append(f"raise prefetch_factor from {now} to {PREFETCH_TARGET}")
    if not cfg.persistent_workers:
        steps.append("set persistent_workers=True (workers start again each epoch)")
    if not steps:
        steps.append(f"raise num_workers from {cfg.num_workers}: the queue is deep already")
    return "Keep the queue full: " + "; ".join(steps) + "."


@rule("prefetch_queue_starved")
def prefetch_queue_starved(ctx: RunContext) -> Insight | None:
    """Fires when a timed DataLoader (``wrap_dataloader``, or a torch
    DataLoader in auto mode) made the loop wait more than
    :data:`STARVED_WAIT_MS` on at least :data:`STARVED_SHARE` of the steady
    steps, while the loader wait as a whole stays under the stall threshold
    (:data:`gpuprof.insights.steps.STALL_FRACTION`; above it the stall
    findings speak, with these settings among their fixes). The fix fits
    the loader's reported settings."""
    if not ctx.explicit_wait:
        return None
    steady = len(ctx.loader_ms) - WARMUP_STEPS
    if steady < 2 * WARMUP_STEPS:
        return None
    frac = stall_fraction(ctx)
    if frac is not None and frac > STALL_FRACTION:
        return None
    starved = starved_steps(ctx)
    share = len(starved) / steady
    if share < STARVED_SHARE:
        return None
    waits = [ctx.loader_ms[i] for i in starved]
    mean_wait = sum(waits) / len(waits)
    return Insight(
        rule="prefetch_queue_starved",
        severity="MED",
        title=f"The loader's prefetch queue ran dry on {share:.0%} of steps "
        f"({mean_wait:.0f} ms waits)",
        detail=f"{len(starved)} of {steady} steady steps waited more than "
        f"{STARVED_WAIT_MS:.0f} ms for a batch ({mean_wait:.1f} ms on average), though the "
        f"loader keeps up overall ({(frac or 0):.0%} of the time waiting): batches arrive "
        "in bursts and the queue empties between them.",
        fix=_fix(ctx),
        evidence={
            "starved_share": round(share, 4),
            "starved_steps": len(starved),
            "steady_steps": steady,
            "mean_starved_wait_ms": round(mean_wait, 3),
            "stall_fraction": None if frac is None else round(frac, 4),
            **config_evidence(ctx),
        },
    )
