"""Comparison with earlier runs of the same name in the same database."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuprof.insights.base import (
    DeclaredWork,
    Insight,
    RunContext,
    common_unit,
    mean_micro,
    positive_count,
    rule,
    same_shape,
)
from gpuprof.insights.contention import measured_under_contention
from gpuprof.stats import MIN_STEPS, median, speed_ratio

#: Slower than the baseline by more than this is a regression: repeated runs
#: of one job on one node differ by a few percent from launch to launch (the
#: noise test below sees only the noise between steps), 10 % is beyond that.
REGRESSION_FRACTION = 0.10
#: Slower by more than this is HIGH.
REGRESSION_FRACTION_HIGH = 0.50
#: Baseline: up to this many previous runs (seed).
HISTORY_RUNS = 3
#: Steady iterations read of each previous run (its last ones): the noise
#: test's cost does not grow with a long history run.
HISTORY_STEPS = 1000

_FIX = (
    "Diff this run's code, data and environment against the previous ones; "
    "gpuprofctl compare shows which phase grew."
)


#: Said when the runs were compared per iteration: a larger batch is slower
#: an iteration and no regression, but only declared work tells gpuprof so.
_DECLARE = (
    " If this run does more work an iteration (a larger batch, longer sequences), "
    "declare it (gpuprof.profile(..., samples_per_step=...) or tokens_per_step=..., "
    "the same in every run of the name): runs are then compared per sample or token."
)


def _fix(ctx: RunContext) -> str:
    """The fix; on a run measured under contention, the host first: the
    slowdown may be the other processes', not the code's; compared per
    iteration, how to say that the run does more work an iteration."""
    fix = _FIX + (_DECLARE if ctx.history_unit == "iteration" else "")
    busy = measured_under_contention(ctx)
    if busy is None:
        return fix
    return (
        f"This run was measured on a busy host (other processes during "
        f"{busy['share_of_steps']:.0%} of its steps): run it again on an idle host "
        "before looking in the code. " + fix
    )


def work_scale(
    now_options: Mapping[str, Any] | None,
    now_world: int,
    then_options: Mapping[str, Any] | None,
    then_world: int,
    now_micro: float = 1.0,
    then_micro: float = 1.0,
) -> tuple[float, str]:
    """(factor, unit): an earlier run's iteration times (ms) times *factor*
    are its time for this run's work of an iteration, as ``gpuprofctl
    compare`` counts it (:func:`gpuprof.compare.compare_basis`): when both
    runs declared ``tokens_per_step`` (else ``samples_per_step``) and an
    iteration's work (that times the world size,
    :func:`~gpuprof.insights.base.common_unit`) differs, *unit* is ``token``
    or ``sample``; else, when the world size or the mean micro-batches per
    step (*now_micro*, *then_micro*) differ, ``micro-batch`` (on all ranks:
    a run accumulating 4 micro-batches an update does 4 times the work of an
    iteration); else (1.0, ``iteration``)."""

    def work(options: Mapping[str, Any] | None, world: int) -> DeclaredWork:
        got = options or {}
        count = positive_count
        return DeclaredWork(
            count(got.get("tokens_per_step")), count(got.get("samples_per_step")), world
        )

    shared = common_unit(work(now_options, now_world), work(then_options, then_world))
    if shared is not None:
        unit, now_units, then_units = shared
        return (1.0, "iteration") if now_units == then_units else (now_units / then_units, unit)
    if same_shape(now_world, now_micro, then_world, then_micro):
        return 1.0, "iteration"
    return (now_micro * now_world) / (then_micro * then_world), "micro-batch"


def _previous(n: int) -> str:
    return "the previous run" if n == 1 else f"last {n} runs"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


@rule("regression")
def regression(ctx: RunContext) -> Insight | None:
    """Fires when this run is more than :data:`REGRESSION_FRACTION` slower than
    its last :data:`HISTORY_RUNS` runs of the same name and the difference is
    beyond the noise of their step times: the compare's own test
    (:func:`gpuprof.stats.speed_ratio` of the steady iterations, the previous
    runs' pooled; ``gpuprofctl compare``'s figures). When those runs' steps
    are gone (retention keeps their medians longer), by the median of their
    stored medians, without a noise test. Silent on a run of fewer than
    :data:`~gpuprof.stats.MIN_STEPS` steady steps (a smoke run's few steps
    are its warm-up: no noise test can tell them from a regression)."""
    history = ctx.history_median_step_ms[:HISTORY_RUNS]
    current = ctx.steady_iteration_ms
    if not history or len(current) < MIN_STEPS:
        return None
    samples = ctx.history_iteration_ms[:HISTORY_RUNS]
    pooled = [ms for run in samples for ms in run]
    if len(samples) == len(history) and all(samples) and len(pooled) >= MIN_STEPS:
        return _by_steps(ctx, pooled, len(history))
    return _by_medians(ctx, history)


def _units(ctx: RunContext) -> float:
    """This run's work of an iteration in :attr:`RunContext.history_unit`s (all ranks)."""
    if ctx.history_unit == "micro-batch":
        return mean_micro(ctx.micro_batches) * ctx.world_size
    declared = ctx.tokens_per_step if ctx.history_unit == "token" else ctx.samples_per_step
    return (declared or 1) * ctx.world_size


def _figures(ctx: RunContext, now_ms: float, base_ms: float) -> str:
    """``iteration 234.1 ms vs 196.5 ms``; per unit when the earlier runs did
    other work an iteration: ``0.914 ms vs 3.07 ms a sample``."""
    if ctx.history_unit == "iteration":
        return f"iteration {now_ms:.1f} ms vs {base_ms:.1f} ms"
    n = _units(ctx)
    return f"{now_ms / n:.3g} ms vs {base_ms / n:.3g} ms a {ctx.history_unit}"


def _per_unit_note(ctx: RunContext) -> str:
    if ctx.history_unit == "iteration":
        return ""
    if ctx.history_unit == "micro-batch":
        return (
            " The earlier runs ran other micro-batches per step or ranks: compared per "
            "micro-batch, assuming micro-batches of one size (declare samples_per_step= "
            "or tokens_per_step= to compare per sample or token)."
        )
    return (
        f" The earlier runs did other work an iteration (their declared "
        f"{ctx.history_unit}s_per_step): compared per {ctx.history_unit}."
    )


def _by_steps(ctx: RunContext, baseline: list[float], runs: int) -> Insight | None:
    """The regression by :func:`speed_ratio` of the pooled *baseline*
    iterations (ms) against this run's."""
    current = ctx.steady_iteration_ms
    base_mean, mean_now = sum(baseline) / len(baseline), sum(current) / len(current)
    if mean_now <= base_mean * (1 + REGRESSION_FRACTION):
        return None  # not slow enough to matter: no bootstrap spent on it
    r = speed_ratio(baseline, current)
    if r.within_noise:  # within the steps' noise: not a regression
        return None
    slower = 1 / r.speedup - 1
    if r.low is None or r.high is None:
        interval = f"too few steady steps for an interval: {r.steps_a} and {r.steps_b}"
    else:
        interval = f"95 % CI {_pct(1 / r.high - 1)}–{_pct(1 / r.low - 1)}"
    return Insight(
        rule="regression",
        severity="HIGH" if slower > REGRESSION_FRACTION_HIGH else "MED",
        title=f"Regression vs {_previous(runs)} of '{ctx.run_name}': "
        f"{_figures(ctx, mean_now, base_mean)} ({_pct(slower)} slower, {interval})",
        detail="Compared by steady-state mean iteration time (warm-up excluded), as "
        "gpuprofctl compare does; the interval is a bootstrap over both runs' steps."
        + _per_unit_note(ctx),
        fix=_fix(ctx),
        evidence={
            "mean_iteration_ms": round(mean_now, 3),
            "baseline_ms": round(base_mean, 3),
            "statistic": "mean",
            "speedup": round(r.speedup, 4),
            "ci_low": None if r.low is None else round(r.low, 4),
            "ci_high": None if r.high is None else round(r.high, 4),
            "history_ms": [round(h, 3) for h in ctx.history_median_step_ms[:runs]],
        },
    )


def _by_medians(ctx: RunContext, history: tuple[float, ...]) -> Insight | None:
    """The regression by the stored medians alone (no steps to test noise with)."""
    current = ctx.median_step_ms
    baseline = median(history)
    if current is None or baseline <= 0 or current <= baseline * (1 + REGRESSION_FRACTION):
        return None
    slower = current / baseline - 1
    return Insight(
        rule="regression",
        severity="HIGH" if slower > REGRESSION_FRACTION_HIGH else "MED",
        title=f"Regression vs {_previous(len(history))} of '{ctx.run_name}' (median): "
        f"{_figures(ctx, current, baseline)} ({slower:.0%} slower)",
        detail="Compared by steady-state median iteration time (warm-up excluded); the "
        "earlier runs' steps are no longer stored, so without a noise test." + _per_unit_note(ctx),
        fix=_fix(ctx),
        evidence={
            "median_step_ms": round(current, 3),
            "baseline_ms": round(baseline, 3),
            "statistic": "median",
            "history_ms": [round(h, 3) for h in history],
        },
    )
