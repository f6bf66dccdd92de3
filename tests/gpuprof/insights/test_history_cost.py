from __future__ import annotations

import random
import re

import pytest

from gpuprof.insights.cost import estimated_cost
from gpuprof.insights.history import regression
from gpuprof.stats import median

from .conftest import make_ctx


def test_regression_fires_41_percent_slower():
    ctx = make_ctx([152.0] * 13, history_median_step_ms=(100.0, 108.0, 120.0, 10.0))
    ins = regression(ctx)
    assert ins is not None and ins.severity == "MED"
    assert ins.evidence["baseline_ms"] == pytest.approx(108.0)  # 4th run ignored
    assert "152.0 ms vs 108.0 ms (41% slower)" in ins.title


def test_a_regression_measured_on_a_busy_host_sends_the_user_to_the_host_first():
    idle = regression(make_ctx([130.0] * 13, history_median_step_ms=(100.0,)))
    assert idle.fix.startswith("Diff this run's code")
    pegged = {"step_host_pct": (100.0,) * 13, "step_other_cores": (0.9,) * 13, "cpu_count": 2}
    busy = regression(make_ctx([130.0] * 13, history_median_step_ms=(100.0,), **pegged))
    assert busy is not None  # still slower: the finding stays
    assert busy.fix.startswith(
        "This run was measured on a busy host (other processes during 100% of its steps)"
    )


def test_a_regression_by_iteration_says_how_to_declare_more_work():
    # a batch of 256 after runs of 32, nothing declared: slower an iteration,
    # and only declared work lets the rule compare per sample
    by_iteration = regression(make_ctx([130.0] * 30, history_median_step_ms=(100.0,)))
    assert "declare it (gpuprof.profile(..., samples_per_step=...)" in by_iteration.fix
    per_sample = regression(
        make_ctx(
            [130.0] * 30,
            history_median_step_ms=(100.0,),
            history_unit="sample",
            samples_per_step=32,
        )
    )
    assert per_sample is not None and "samples_per_step" not in per_sample.fix


def test_regression_against_one_previous_run_wording():
    ins = regression(make_ctx([130.0] * 13, history_median_step_ms=(100.0,)))
    assert ins.title.startswith("Regression vs the previous run of 't' (median)")


def test_regression_silent_within_noise_or_faster_or_no_history():
    assert regression(make_ctx([105.0] * 13, history_median_step_ms=(100.0,))) is None
    assert regression(make_ctx([50.0] * 13, history_median_step_ms=(100.0,))) is None
    assert regression(make_ctx([500.0] * 13)) is None


def test_a_smoke_run_of_a_few_steps_is_no_regression():
    # 1 or 3 steps are all warm-up (steady = every step under 7): a smoke run
    # twice as slow as its name's long runs is not a regression (no noise test
    # can speak), by the steps or by the medians; 10 steady steps (13, the
    # first 3 left out) are judged
    long_runs = (_uniform(100, 5, 200, 1),)
    for steps in ((200.0,), (200.0, 190.0, 180.0)):
        assert regression(make_ctx(steps, history_median_step_ms=(100.0,))) is None
        by_steps = make_ctx(steps, history_median_step_ms=(100.0,), history_iteration_ms=long_runs)
        assert regression(by_steps) is None
    ten = make_ctx([200.0] * 13, history_median_step_ms=(100.0,), history_iteration_ms=long_runs)
    assert regression(ten).severity == "HIGH"


def test_a_history_of_smoke_runs_is_judged_by_its_medians():
    # the earlier runs' 2 steps each (4 pooled) are too few for the noise
    # test: their medians say it, without an interval
    smoke = ((100.0,) * 2,) * 2
    ctx = make_ctx([130.0] * 20, history_median_step_ms=(100.0, 100.0), history_iteration_ms=smoke)
    ins = regression(ctx)
    assert ins.evidence["statistic"] == "median"
    assert "(median): iteration 130.0 ms vs 100.0 ms (30% slower)" in ins.title


def _uniform(mean_ms: float, spread_ms: float, n: int, seed: int) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(mean_ms + rng.uniform(-spread_ms, spread_ms) for _ in range(n))


def test_regression_by_the_compares_test_fires_with_its_interval():
    # two earlier runs of 100 and 104 ms (their steps stored), this one 130 ms
    history = (_uniform(100, 5, 40, 1), _uniform(104, 5, 40, 2))
    ctx = make_ctx(
        _uniform(130, 6, 43, 3),
        history_median_step_ms=(100.0, 104.0),
        history_iteration_ms=history,
    )
    ins = regression(ctx)
    assert ins is not None and ins.severity == "MED"
    base = sum(history[0] + history[1]) / 80
    assert ins.evidence["baseline_ms"] == pytest.approx(base, abs=1e-3)
    assert ins.evidence["statistic"] == "mean"
    assert ins.evidence["ci_low"] < ins.evidence["speedup"] < ins.evidence["ci_high"] < 1
    assert re.fullmatch(
        r"Regression vs last 2 runs of 't': iteration 1\d\d\.\d ms vs 10\d\.\d ms "
        r"\(2\d% slower, 95 % CI 2\d%–\d\d%\)",
        ins.title,
    ), ins.title


def test_a_slower_run_within_noise_is_not_a_regression():
    # steps of 20 or 180 ms (mean 100); this run 15 % slower on average, but
    # with 30 steps of that spread the difference is within their noise
    base = (20.0, 180.0) * 15
    slower = (50.0,) * 3 + (23.0, 207.0) * 15  # 3 warm-up steps, then mean 115 ms
    ctx = make_ctx(slower, history_median_step_ms=(100.0,), history_iteration_ms=(base,))
    assert regression(ctx) is None
    # by the medians alone (the steps gone) the same run fires: the noise test is what holds it
    gone = make_ctx(slower, history_median_step_ms=(median(base),))
    assert "(15% slower)" in regression(gone).title


def test_regression_falls_back_to_medians_when_a_history_runs_steps_are_gone():
    ctx = make_ctx(
        [130.0] * 20,
        history_median_step_ms=(100.0, 100.0),
        history_iteration_ms=((100.0,) * 20, ()),  # the older run's steps deleted
    )
    ins = regression(ctx)
    assert ins.evidence["statistic"] == "median"
    assert "(median): iteration 130.0 ms vs 100.0 ms (30% slower)" in ins.title


def test_regression_uses_iteration_time_so_loader_slowdowns_count():
    ctx = make_ctx([100.0] * 13, [100.0] * 13, history_median_step_ms=(100.0,))
    assert regression(ctx).severity == "HIGH"  # 200 vs 100 ms


def test_cost_not_estimated_on_cpu_run():
    ins = estimated_cost(make_ctx([10.0] * 5, duration_s=3600))
    assert ins.title == "Estimated cost: not estimated (no NVIDIA GPU in this run)"
    assert ins.evidence == {}


def test_cost_from_price_table_with_idle_share():
    ctx = make_ctx(
        [100.0] * 10,
        duration_s=2 * 3600,
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_count=1,
        flops_per_step=0.35 * 989.4e12 * 0.1,
        dtype="bf16",
    )
    ins = estimated_cost(ctx)
    assert ins.evidence["usd"] == pytest.approx(24.58)
    assert "$24.58 (120 min · 1× GPU @ $12.29/h)" in ins.title
    assert "~$15.98 of that is idle capacity (MFU 35.0%)" in ins.title


def test_cost_override_and_unknown_price():
    no_price = make_ctx([1.0] * 3, duration_s=1800, gpu_model="NVIDIA H200", gpu_count=1)
    assert "no reference price for NVIDIA H200" in estimated_cost(no_price).title
    rated = make_ctx(
        [1.0] * 3, duration_s=1800, gpu_model="NVIDIA H200", gpu_count=1, gpu_rate_usd_per_hour=3.0
    )
    assert estimated_cost(rated).evidence["usd"] == pytest.approx(1.5)


def test_work_scale_follows_the_declared_work_of_an_iteration():
    from gpuprof.insights.history import work_scale

    sps = {"samples_per_step": 64}
    assert work_scale({"samples_per_step": 256}, 1, sps, 1) == (4.0, "sample")
    assert work_scale(sps, 2, sps, 1) == (2.0, "sample")  # twice the ranks, twice the work
    assert work_scale(sps, 1, sps, 1) == (1.0, "iteration")
    tokens = {"tokens_per_step": 4096, "samples_per_step": 8}
    assert work_scale(tokens, 1, {"tokens_per_step": 2048, "samples_per_step": 8}, 1) == (
        2.0,
        "token",
    )
    # only one side declares, or a bad value: by iteration, as compare does
    assert work_scale(sps, 1, {}, 1) == (1.0, "iteration")
    assert work_scale({"samples_per_step": True}, 1, sps, 1) == (1.0, "iteration")
    assert work_scale({"samples_per_step": -3}, 1, sps, 1) == (1.0, "iteration")
    # nothing declared in common: other micro-batches or ranks, per micro-batch
    assert work_scale({}, 1, {}, 1, 4.0, 1.0) == (4.0, "micro-batch")
    assert work_scale(sps, 2, {}, 1, 1.0, 2.0) == (1.0, "micro-batch")  # 2 x 1 vs 1 x 2
    assert work_scale({}, 1, {}, 1, 4.0, 4.02) == (1.0, "iteration")  # within 1 %: one shape
    # declared work wins over micro-batches, as in compare
    assert work_scale(sps, 1, sps, 1, 4.0, 1.0) == (1.0, "iteration")


def test_a_regression_per_sample_says_its_figures_per_sample():
    # this run: 256 samples at 130 ms; the history scaled to 256 samples: 100 ms
    ctx = make_ctx(
        [130.0] * 13, history_median_step_ms=(100.0,), samples_per_step=256, history_unit="sample"
    )
    ins = regression(ctx)
    assert ins is not None
    assert "(median): 0.508 ms vs 0.391 ms a sample (30% slower)" in ins.title
    assert "compared per sample" in ins.detail
    # the same figures by iteration when nothing was scaled
    plain = regression(make_ctx([130.0] * 13, history_median_step_ms=(100.0,)))
    assert "iteration 130.0 ms vs 100.0 ms" in plain.title and "per sample" not in plain.detail
