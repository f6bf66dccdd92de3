"""Which steps ran while other processes held the host's CPU, and how much.

Reads the per-step figures of :mod:`gpuprof.insights.hostcpu` from a
:class:`RunContext`. A step is *contended* when, while it ran, the host
had no idle core to spare (≥ :data:`CONTENDED_HOST_PCT` busy) and other
processes held at least :data:`CONTENDED_OTHER_CORES` of it: the run
could not get the CPU it asked for, so its timings are slower than on an
idle host. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuprof.insights.base import RunContext
from gpuprof.stats import mean

#: Host CPU (all cores, %) at which no core is idle enough to take the
#: run's next runnable thread: the seed rule table's "CPU pegged" line.
CONTENDED_HOST_PCT = 80.0
#: Cores other processes must hold during a step for it to be contended:
#: half a core is a competitor taking every other time slice of one core
#: (the issue's busy 2-core box: 0.76-0.90 cores during the slow steps
#: against 0.04-0.27 in the rest); less is background noise (sshd, the daemon).
CONTENDED_OTHER_CORES = 0.5
#: Share of the steps contended above which the run is reported as
#: measured under contention (summary and timing findings' evidence).
MEASURED_UNDER_CONTENTION_SHARE = 0.10


def contended(ctx: RunContext) -> tuple[bool | None, ...]:
    """Per step: True contended, False not, None no host sample covers it;
    empty when the host (or the run's own CPU) was not sampled."""
    return tuple(
        None
        if pct is None or other is None
        else pct >= CONTENDED_HOST_PCT and other >= CONTENDED_OTHER_CORES
        for pct, other in zip(ctx.step_host_pct, ctx.step_other_cores, strict=True)
    )


def contended_share(ctx: RunContext, first: int = 0) -> float | None:
    """Share (0-1) of the steps from index *first* on, among those sampled,
    that were contended; None when none was sampled."""
    flags = [f for f in contended(ctx)[first:] if f is not None]
    return sum(flags) / len(flags) if flags else None


def others_on(
    ctx: RunContext, steps: list[int], weights: Sequence[float] | None = None
) -> float | None:
    """Mean cores other processes used during the steps at indices *steps*
    (those sampled), weighted by *weights* (one per step, e.g. the ms each
    lost) when given; None when none was sampled (or all weights are 0)."""
    ws = [1.0] * len(steps) if weights is None else [float(w) for w in weights]
    cores = ctx.step_other_cores
    known = [
        (v, w)
        for i, w in zip(steps, ws, strict=True)
        if i < len(cores) and (v := cores[i]) is not None
    ]
    if weights is None:
        return mean([v for v, _ in known]) if known else None
    total = sum(w for _, w in known)
    return sum(v * w for v, w in known) / total if total > 0 else None


def measured_under_contention(ctx: RunContext) -> dict[str, Any] | None:
    """``{"share_of_steps", "other_cores", "cpu_count"}`` when at least
    :data:`MEASURED_UNDER_CONTENTION_SHARE` of the sampled steps were
    contended: the share (0-1), the mean cores other processes held during
    those steps, the host's cores. None otherwise (or unsampled)."""
    share = contended_share(ctx)
    if share is None or share < MEASURED_UNDER_CONTENTION_SHARE:
        return None
    hit = [i for i, f in enumerate(contended(ctx)) if f]
    others = others_on(ctx, hit)
    return {
        "share_of_steps": round(share, 3),
        "other_cores": None if others is None else round(others, 2),
        "cpu_count": ctx.cpu_count,
    }
