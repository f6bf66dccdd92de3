from __future__ import annotations

import pytest

from gpuprof.insights.cost import estimated_cost
from gpuprof.insights.history import regression

from .conftest import make_ctx


def test_regression_fires_41_percent_slower():
    ctx = make_ctx([152.0] * 10, history_median_step_ms=(100.0, 108.0, 120.0, 10.0))
    ins = regression(ctx)
    assert ins is not None and ins.severity == "MED"
    assert ins.evidence["baseline_ms"] == pytest.approx(108.0)  # 4th run ignored
    assert "152.0 ms vs 108.0 ms (41% slower)" in ins.title


def test_regression_against_one_previous_run_wording():
    ins = regression(make_ctx([130.0] * 10, history_median_step_ms=(100.0,)))
    assert ins.title.startswith("Regression vs the previous run of 't' (median)")


def test_regression_silent_within_noise_or_faster_or_no_history():
    assert regression(make_ctx([105.0] * 10, history_median_step_ms=(100.0,))) is None
    assert regression(make_ctx([50.0] * 10, history_median_step_ms=(100.0,))) is None
    assert regression(make_ctx([500.0] * 10)) is None


def test_regression_uses_iteration_time_so_loader_slowdowns_count():
    ctx = make_ctx([100.0] * 10, [100.0] * 10, history_median_step_ms=(100.0,))
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
