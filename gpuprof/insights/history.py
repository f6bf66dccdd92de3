"""Comparison with earlier runs of the same name in the same database."""

from __future__ import annotations

from gpuprof.insights.base import Insight, RunContext, rule
from gpuprof.stats import median

#: Slower than the baseline by more than this is a regression. Repeated runs of
#: one job on one node differ by a few percent; 10 % is beyond that noise.
REGRESSION_FRACTION = 0.10
#: Slower by more than this is HIGH.
REGRESSION_FRACTION_HIGH = 0.50
#: Baseline: median of up to this many previous runs (seed).
HISTORY_RUNS = 3


def _previous(n: int) -> str:
    return "the previous run" if n == 1 else f"last {n} runs"


@rule("regression")
def regression(ctx: RunContext) -> Insight | None:
    """Fires when the steady median step time is > :data:`REGRESSION_FRACTION`
    slower than the median of the last :data:`HISTORY_RUNS` runs' medians."""
    history = ctx.history_median_step_ms[:HISTORY_RUNS]
    current = ctx.median_step_ms
    if not history or current is None:
        return None
    baseline = median(history)
    if baseline <= 0 or current <= baseline * (1 + REGRESSION_FRACTION):
        return None
    slower = current / baseline - 1
    return Insight(
        rule="regression",
        severity="HIGH" if slower > REGRESSION_FRACTION_HIGH else "MED",
        title=f"Regression vs {_previous(len(history))} of '{ctx.run_name}' (median): "
        f"step time {current:.1f} ms vs {baseline:.1f} ms ({slower:.0%} slower)",
        detail="Compared by steady-state median iteration time (warm-up excluded).",
        fix="Diff this run's code, data and environment against the previous ones; "
        "gpuprofctl runs shows which phase grew.",
        evidence={
            "median_step_ms": round(current, 3),
            "baseline_ms": round(baseline, 3),
            "history_ms": [round(h, 3) for h in history],
        },
    )
