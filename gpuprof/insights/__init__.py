"""Insight rules: pure functions from a run's aggregates to findings.

One family per module; importing this package registers them all.
The same engine runs live in gpuprofd, at run end for the summary, and
offline in ``gpuprofctl insights``.
"""

from __future__ import annotations

import dataclasses

from gpuprof.insights import (  # noqa: F401  (registers)
    compute,
    cost,
    gpu,
    history,
    host,
    kernels,
    prefetch,
    steps,
)
from gpuprof.insights.base import (
    SEVERITIES,
    Insight,
    RunContext,
    drop_superseded,
    registered_rules,
)
from gpuprof.insights.contention import measured_under_contention
from gpuprof.insights.context import build_context
from gpuprof.insights.gains import attach, rank_insights

#: Findings derived from the run's timings: measured under contention, their
#: figures are the contended host's, and their evidence says so.
TIMING_RULES = frozenset(
    {
        "dataloader_stall",
        "host_work_between_steps",
        "cpu_bound_dataloader",
        "io_bound_dataloader",
        "prefetch_queue_starved",
        "compilation_warmup",
        "first_step_outlier",
        "high_step_variance",
        "regression",
        "low_mfu",
        "small_batch",
        "kernel_launch_overhead",
    }
)

__all__ = ["Insight", "RunContext", "SEVERITIES", "build_context", "registered_rules", "run_rules"]


def run_rules(ctx: RunContext) -> list[Insight]:
    """Run every registered rule on *ctx*; return the findings with their
    gains (:mod:`gpuprof.insights.gains`), ranked by gain (most ms per
    iteration first; those without one after, most severe first).

    A rule that raises is a bug in gpuprof, not in the user's run: it is
    skipped so the other findings still reach the user. When the run was
    measured under contention (:func:`measured_under_contention`), each
    finding of :data:`TIMING_RULES` carries that dict in its evidence
    (``measured_under_contention``).
    """
    found: list[Insight] = []
    for name, fn in registered_rules().items():
        try:
            insight = fn(ctx)
        except Exception:  # noqa: BLE001 - one broken rule must not hide the rest
            import logging

            logging.getLogger("gpuprof.insights").exception("rule %s failed", name)
            continue
        if insight is not None:
            found.append(insight)
    contended = measured_under_contention(ctx)
    if contended is not None:
        found = [
            dataclasses.replace(i, evidence={**i.evidence, "measured_under_contention": contended})
            if i.rule in TIMING_RULES
            else i
            for i in found
        ]
    kept = sorted(drop_superseded(found), key=lambda i: SEVERITIES.index(i.severity))
    return rank_insights(attach(ctx, kept))
