from __future__ import annotations

import pytest

from gpuprof.insights import run_rules
from gpuprof.insights.steps import (
    compilation_warmup,
    cpu_bound_dataloader,
    dataloader_stall,
    first_step_outlier,
    high_step_variance,
    stall_fraction,
)

from .conftest import make_ctx


def test_stall_fraction_excludes_step_zero_wait():
    # step 0's 1000 ms wait is start-up; the rest wait 25 of every 100 ms
    ctx = make_ctx([75] * 5, [1000, 25, 25, 25, 25])
    assert stall_fraction(ctx) == pytest.approx(0.25)


def test_dataloader_stall_fires_above_15_percent():
    ctx = make_ctx([80] * 10, [20] * 10)  # 20 %
    ins = dataloader_stall(ctx)
    assert ins is not None
    assert ins.severity == "MED"
    # no timed DataLoader: the gap between steps, not advice about num_workers
    assert ins.title.startswith("20% of step time spent between steps (inter-step gap)")
    assert "num_workers" not in ins.fix.split(";")[0] and "wrap_dataloader" in ins.fix
    assert ins.evidence["mean_wait_ms"] == pytest.approx(20.0)


def test_dataloader_stall_high_and_explicit_wording():
    ins = dataloader_stall(make_ctx([50] * 10, [50] * 10, explicit_wait=True))
    assert ins.severity == "HIGH"
    assert "timed next() calls" in ins.title


def test_dataloader_stall_silent_at_10_percent():
    assert dataloader_stall(make_ctx([90] * 10, [10] * 10)) is None


def test_cpu_bound_fires_with_pegged_cpu_and_hides_plain_stall():
    ctx = make_ctx([60] * 10, [40] * 10, host_cpu_pct=95.0, cpu_count=16)
    ins = cpu_bound_dataloader(ctx)
    assert ins is not None and ins.severity == "HIGH"
    assert "95% avg across 16 cores" in ins.title
    rules = [i.rule for i in run_rules(ctx)]
    assert "cpu_bound_dataloader" in rules and "dataloader_stall" not in rules


@pytest.mark.parametrize(
    "kw",
    [
        {"host_cpu_pct": 50.0},  # CPU has headroom
        {"host_cpu_pct": None},  # not sampled: stay silent, don't guess
        {"host_cpu_pct": 95.0, "host_disk_read_bps": 900e6},  # the disk is the busy part
    ],
)
def test_cpu_bound_silent_without_pegged_cpu(kw):
    ctx = make_ctx([60] * 10, [40] * 10, **kw)
    assert cpu_bound_dataloader(ctx) is None
    assert "dataloader_stall" in [i.rule for i in run_rules(ctx)]


def test_cpu_bound_silent_without_stall():
    assert cpu_bound_dataloader(make_ctx([95] * 10, [5] * 10, host_cpu_pct=99.0)) is None


def test_compilation_warmup_fires_between_3x_and_10x():
    ctx = make_ctx([500, 350, 120] + [100] * 10)
    ins = compilation_warmup(ctx)
    assert ins is not None
    assert ins.evidence["steady_median_ms"] == pytest.approx(100.0)
    assert ins.evidence["warmup_steps"] == 2  # steps 0 and 1 are > 3x, step 2 is not
    assert first_step_outlier(ctx) is None


def test_compilation_warmup_silent_on_flat_run():
    assert compilation_warmup(make_ctx([250] + [100] * 12)) is None


def test_warmup_findings_silent_when_the_extra_time_is_negligible():
    # 4x and 40x ratios, but 3 ms and 39 ms of one-off time: true and useless
    assert compilation_warmup(make_ctx([4.0] + [1.0] * 12)) is None
    assert first_step_outlier(make_ctx([40.0] + [1.0] * 12)) is None


def test_first_step_outlier_on_h200_compiled_mlp(h200_steps):
    step_ms = [s * 1e3 for s in h200_steps["compile_warmup"]["step_s"]]
    ctx = make_ctx(step_ms)
    ins = first_step_outlier(ctx)
    assert ins is not None
    assert ins.evidence["first_step_ms"] == pytest.approx(step_ms[0], rel=1e-3)
    assert ins.evidence["first_step_ms"] / ins.evidence["median_rest_ms"] > 1000
    # the outlier supersedes the generic warm-up finding
    rules = [i.rule for i in run_rules(ctx)]
    assert "first_step_outlier" in rules and "compilation_warmup" not in rules


def test_first_step_outlier_silent_on_h200_eager_gpt(h200_steps):
    ctx = make_ctx([s * 1e3 for s in h200_steps["trace_sdpa"]["step_s"]])
    assert first_step_outlier(ctx) is None
    assert compilation_warmup(ctx) is None
    assert high_step_variance(ctx) is None


def test_high_step_variance_fires_on_periodic_spikes():
    steady = [10.0] * 30
    steady[10] = steady[20] = steady[29] = 40.0  # checkpoint every 10 steps
    ins = high_step_variance(make_ctx([10, 10, 10] + steady))
    assert ins is not None
    assert ins.evidence["p50_ms"] == pytest.approx(10.0)
    assert ins.evidence["p99_ms"] == pytest.approx(40.0)


def test_high_step_variance_ignores_warmup_and_short_runs():
    assert high_step_variance(make_ctx([500, 300, 100] + [10.0] * 30)) is None
    assert high_step_variance(make_ctx([10.0] * 10 + [50.0])) is None  # too few steps


def test_one_or_two_slow_steps_are_not_periodic_variance():
    steady = [10.0] * 60
    steady[17] = 84.0  # one GC pause in a 60-step run: p99 is that one step
    assert high_step_variance(make_ctx([10, 10, 10] + steady)) is None
    steady[40] = 30.0
    assert high_step_variance(make_ctx([10, 10, 10] + steady)) is None
    steady[55] = 30.0  # a third: periodic
    assert high_step_variance(make_ctx([10, 10, 10] + steady)).evidence["slow_steps"] == 3


def test_cpu_bound_needs_the_run_itself_to_use_the_cpu():
    # host pegged at 95 % of 2 cores, but the run's processes use 0.3 core: another tenant
    other = make_ctx([60] * 10, [40] * 10, host_cpu_pct=95.0, cpu_count=2, run_cpu_cores=0.3)
    assert cpu_bound_dataloader(other) is None
    # ... which is the finding, the stall its symptom
    assert {"host_cpu_contention"} <= {i.rule for i in run_rules(other)} - {"dataloader_stall"}
    assert "dataloader_stall" not in [i.rule for i in run_rules(other)]
    # the run's main process + workers use 1.9 of the 1.9 busy cores: its own workers
    own = make_ctx([60] * 10, [40] * 10, host_cpu_pct=95.0, cpu_count=2, run_cpu_cores=1.9)
    assert cpu_bound_dataloader(own).evidence["run_cpu_cores"] == 1.9


def test_stall_counts_loader_time_between_micro_batches():
    # 4 micro-batches per step: only the first one's loading is before the step
    ctx = make_ctx([100] * 10, [5] * 10, data_ms=[30] * 10)
    assert stall_fraction(ctx) == pytest.approx(35 / 105)
    assert dataloader_stall(ctx).evidence["mean_wait_ms"] == pytest.approx(35.0)
    assert dataloader_stall(make_ctx([100] * 10, [5] * 10)) is None  # without it: 5 %


def test_warmup_wording_matches_its_step_count():
    one = compilation_warmup(make_ctx([500] + [100] * 12))
    assert one.fix == "Exclude step 0 from throughput measurements."
    outlier = first_step_outlier(make_ctx([2000, 900] + [10] * 12))
    assert outlier.fix.startswith("Filter steps 0–1 out of timing")


def test_first_step_outlier_and_warmup_agree_on_excess():
    # 115x a 0.8 ms median: both rules see the same 91 ms of one-off time, below the floor
    ctx = make_ctx([92.0] + [0.8] * 20)
    assert first_step_outlier(ctx) is None and compilation_warmup(ctx) is None
    big = make_ctx([230.0] + [2.0] * 20)  # 115x, 228 ms extra: the outlier, not warm-up
    assert [i.rule for i in run_rules(big) if i.rule != "estimated_cost"] == ["first_step_outlier"]


def test_cpu_bound_explains_erratic_steps():
    steady = [10.0] * 30
    steady[10] = steady[20] = steady[29] = 40.0
    ctx = make_ctx([10, 10, 10] + steady, [20.0] * 33, host_cpu_pct=97.0, cpu_count=2)
    rules = {i.rule for i in run_rules(ctx)}
    assert "cpu_bound_dataloader" in rules and "high_step_variance" not in rules
    assert high_step_variance(ctx) is not None  # on its own it would fire


def test_high_step_variance_needs_the_slow_steps_to_cost_something():
    # the fresh-user case: 0.3 ms steps, a few at 1.6 ms: erratic, but 6.5 ms lost in all
    tiny = make_ctx([0.3] * 40 + [1.6] * 5)
    assert high_step_variance(tiny) is None
    # the same shape at 100x the scale loses 650 ms: a finding
    big = high_step_variance(make_ctx([30.0] * 40 + [160.0] * 5))
    assert big is not None and big.evidence["excess_ms"] == 650.0
