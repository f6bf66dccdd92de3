"""Insight rules: pure functions from a run's aggregates to findings.

One family per module; importing this package registers them all.
The same engine runs live in gpuprofd, at run end for the summary, and
offline in ``gpuprofctl insights``.
"""

from __future__ import annotations

from gpuprof.insights import compute, cost, gpu, history, host, kernels, steps  # noqa: F401  (registers)
from gpuprof.insights.base import (
    SEVERITIES,
    Insight,
    RunContext,
    drop_superseded,
    registered_rules,
)
from gpuprof.insights.context import build_context

__all__ = ["Insight", "RunContext", "SEVERITIES", "build_context", "registered_rules", "run_rules"]


def run_rules(ctx: RunContext) -> list[Insight]:
    """Run every registered rule on *ctx*; return the findings, most severe first.

    A rule that raises is a bug in gpuprof, not in the user's run: it is
    skipped so the other findings still reach the user.
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
    return sorted(drop_superseded(found), key=lambda i: SEVERITIES.index(i.severity))
