"""The run-vs-run compare (gpuprof.compare) and its speed test
(gpuprof.stats.speed_ratio) on controlled step times."""

from __future__ import annotations

import random
import re

import pytest

from gpuprof.compare import compare_basis, compare_runs, finding_changes, phase_split, verdict
from gpuprof.insights.base import WARMUP_STEPS, RunContext
from gpuprof.stats import MAX_BLOCKS, MIN_STEPS, speed_ratio


def noisy(mean_ms: float, spread_ms: float, n: int, seed: int) -> list[float]:
    """*n* iteration times uniform in mean ± spread (the true mean is *mean_ms*)."""
    rng = random.Random(seed)
    return [mean_ms + rng.uniform(-spread_ms, spread_ms) for _ in range(n)]


def ctx(
    step_ms: list[float],
    wait_ms: list[float] | None = None,
    phases_per_step: dict[str, float] | None = None,
    **kw,
) -> RunContext:
    """A context with these per-step times (ms); the steady steps' phase
    totals are *phases_per_step* (ms) times the steady step count."""
    wait_ms = wait_ms if wait_ms is not None else [0.0] * len(step_ms)
    n = len(step_ms) - WARMUP_STEPS if len(step_ms) > 2 * WARMUP_STEPS else len(step_ms)
    kw.setdefault("run_name", "r")
    kw.setdefault("status", "finished")
    return RunContext(
        step_ms=tuple(step_ms),
        wait_ms=tuple(wait_ms),
        steady_phase_ms={k: v * n for k, v in (phases_per_step or {}).items()},
        **kw,
    )


def finding(rule: str, severity: str = "HIGH", title: str = "t", **extra) -> dict:
    return {"rule": rule, "severity": severity, "title": title, "detail": "", "fix": "", **extra}


# --- speed_ratio ---------------------------------------------------------------


def test_constant_times_give_the_exact_ratio_and_a_point_interval():
    r = speed_ratio([50.0] * 40, [20.0] * 40)
    assert (r.speedup, r.low, r.high) == (2.5, 2.5, 2.5)
    assert r.within_noise is False


def test_the_ratio_is_of_the_means_so_a_removed_slow_step_counts():
    # every 10th step 100 ms, the rest 10 ms: the median is 10 ms either way,
    # the mean 19 ms against 10 ms
    a = [100.0 if i % 10 == 0 else 10.0 for i in range(200)]
    r = speed_ratio(a, [10.0] * 200)
    assert r.speedup == pytest.approx(1.9)
    assert r.low > 1.0 and r.within_noise is False


def test_the_interval_holds_the_true_ratio():
    # uniform noise around 50 and 20 ms: the true speed-up is 2.5
    held = []
    for seed in range(20):
        r = speed_ratio(noisy(50, 10, 200, seed), noisy(20, 4, 200, 100 + seed))
        assert r.low < r.speedup < r.high
        assert r.high - r.low < 0.15  # 200 steps pin it to about ±2.3 %
        held.append(r.low <= 2.5 <= r.high)
    assert sum(held) >= 17  # a 95 % interval: 19 of 20 expected


def test_two_samples_of_one_distribution_are_within_noise():
    within = [
        speed_ratio(noisy(30, 6, 150, seed), noisy(30, 6, 150, 500 + seed)).within_noise
        for seed in range(20)
    ]
    assert sum(bool(w) for w in within) >= 17  # 19 of 20 expected
    r = speed_ratio(noisy(30, 6, 150, 0), noisy(30, 6, 150, 500))
    assert r.within_noise is True and r.low < 1.0 < r.high


def test_a_five_percent_gain_over_a_noisy_run_is_within_noise_a_steady_one_is_not():
    noisy_a, noisy_b = noisy(100, 60, 30, 1), noisy(95, 57, 30, 2)
    assert speed_ratio(noisy_a, noisy_b).within_noise is True
    r = speed_ratio(noisy(100, 2, 300, 1), noisy(95, 1.9, 300, 2))
    assert r.within_noise is False and r.speedup == pytest.approx(100 / 95, rel=0.01)


def test_the_interval_is_the_same_every_time():
    a, b = noisy(50, 10, 100, 7), noisy(40, 8, 100, 8)
    assert speed_ratio(a, b) == speed_ratio(a, b)


def test_too_few_steps_give_no_interval():
    r = speed_ratio([10.0] * (MIN_STEPS - 1), [5.0] * 40)
    assert r.speedup == 2.0
    assert (r.low, r.high, r.within_noise) == (None, None, None)


def test_a_long_run_is_resampled_in_blocks_and_keeps_its_exact_mean():
    a = noisy(20, 5, 50 * MAX_BLOCKS, 3)
    b = noisy(10, 2, 7 * MAX_BLOCKS + 13, 4)
    r = speed_ratio(a, b)
    assert r.speedup == pytest.approx((sum(a) / len(a)) / (sum(b) / len(b)), rel=1e-12)
    assert r.low < 2.0 < r.high  # true ratio 2


def test_units_make_the_ratio_per_unit_of_work():
    # B takes 1.6x as long per iteration but does twice the samples
    r = speed_ratio([10.0] * 20, [16.0] * 20, units_a=32, units_b=64)
    assert r.speedup == pytest.approx(1.25)


@pytest.mark.parametrize(
    "a, b, units",
    [([], [1.0], (1, 1)), ([1.0], [], (1, 1)), ([0.0], [1.0], (1, 1)), ([1.0], [1.0], (0, 1))],
)
def test_bad_input_is_a_value_error(a, b, units):
    with pytest.raises(ValueError):
        speed_ratio(a, b, *units)


# --- basis -------------------------------------------------------------------------


def test_runs_of_one_shape_compare_per_iteration():
    basis = compare_basis(ctx([10.0] * 20), ctx([8.0] * 20))
    assert (basis.unit, basis.units_a, basis.units_b, basis.note) == ("iteration", 1, 1, None)
    # both declare the same work per iteration: still per iteration
    same = compare_basis(
        ctx([10.0] * 20, tokens_per_step=4096), ctx([8.0] * 20, tokens_per_step=4096)
    )
    assert same.unit == "iteration"


def test_one_run_alone_declaring_its_work_is_said():
    basis = compare_basis(ctx([10.0] * 20, samples_per_step=32), ctx([8.0] * 20))
    assert (basis.unit, basis.note) == (
        "iteration",
        "compared per iteration: only A declares samples_per_step",
    )


def test_a_bigger_batch_is_compared_per_sample():
    a = ctx([10.0] * 30, samples_per_step=32)
    b = ctx([16.0] * 30, samples_per_step=64)
    out = compare_runs(a, b, [], [])
    assert out["basis"]["unit"] == "sample"
    assert (out["basis"]["units_a"], out["basis"]["units_b"]) == (32, 64)
    assert out["speedup"] == pytest.approx(1.25)  # 0.3125 vs 0.25 ms per sample
    assert out["a"]["units_per_s"] == pytest.approx(3200.0)  # 32 samples per 10 ms
    assert out["b"]["units_per_s"] == pytest.approx(4000.0)
    assert out["verdict"].startswith("B is 1.25× faster per sample (95 % CI 1.25–1.25)")
    assert out["phases"][0]["delta_ms"] is None  # ms of runs of other shapes do not subtract


def test_tokens_win_over_samples_and_count_every_rank():
    a = ctx([10.0] * 30, tokens_per_step=1000, samples_per_step=4, world_size=2)
    b = ctx([10.0] * 30, tokens_per_step=1000, samples_per_step=4, world_size=4)
    basis = compare_basis(a, b)
    assert (basis.unit, basis.units_a, basis.units_b) == ("token", 2000, 4000)
    assert (
        basis.note == "compared per token: A does 2,000 tokens per iteration (all ranks), B 4,000"
    )
    assert compare_runs(a, b, [], [])["speedup"] == pytest.approx(2.0)


def test_other_micro_batches_without_declared_work_compare_per_micro_batch():
    a = ctx([10.0] * 30, micro_batches=(1,) * 30)
    b = ctx([36.0] * 30, micro_batches=(4,) * 30)  # 4 micro-batches of 9 ms
    out = compare_runs(a, b, [], [])
    assert out["basis"]["unit"] == "micro-batch"
    assert "assumes micro-batches of one size" in out["basis"]["note"]
    assert out["speedup"] == pytest.approx(10 / 9, abs=1e-4)  # JSON keeps 4 decimals


# --- phases and findings ----------------------------------------------------------------


def test_phase_split_is_of_the_steady_iterations():
    # warm-up steps 0-2 are slow and not counted; steady: 5 ms wait + 15 ms step
    c = ctx(
        [100.0] * 3 + [15.0] * 20,
        [50.0] * 3 + [5.0] * 20,
        {"data": 1.0, "forward": 4.0, "backward": 6.0, "optimizer": 2.0, "gpuprof": 0.5},
    )
    split = phase_split(c)
    assert split["loader_wait"] == pytest.approx((6.0, 30.0))  # wait 5 + data 1, of 20
    assert split["forward"] == pytest.approx((4.0, 20.0))
    assert split["backward"] == pytest.approx((6.0, 30.0))
    assert split["optimizer"] == pytest.approx((2.0, 10.0))
    assert split["other"] == pytest.approx((2.0, 10.0))  # 15 - (1 + 4 + 6 + 2)
    assert split["comm"] is None  # no collectives timed


def test_findings_resolved_new_changed_unchanged():
    a = [
        finding("cpu_bound_dataloader", "HIGH", "57% waiting", gain_speedup_max=2.3),
        finding("high_step_variance", "MED"),
        finding("low_mfu", "MED", "MFU 20%"),
        finding("estimated_cost", "LOW"),
    ]
    b = [
        finding("low_mfu", "MED", "MFU 31%"),
        finding("high_step_variance", "LOW"),
        finding("gpu_idle_between_steps", "MED"),
        finding("estimated_cost", "LOW"),
    ]
    got = finding_changes(a, b)
    assert [e["rule"] for e in got["resolved"]] == ["cpu_bound_dataloader"]
    assert got["resolved"][0]["label"] == "CPU-bound loader"
    assert got["resolved"][0]["gain_a"] == {"gain_speedup_max": 2.3}
    assert [e["rule"] for e in got["new"]] == ["gpu_idle_between_steps"]
    assert got["new"][0]["gain_b"] == {}  # no gain figures: tolerated
    assert [(e["rule"], e["severity_a"], e["severity_b"]) for e in got["changed"]] == [
        ("high_step_variance", "MED", "LOW")
    ]
    unchanged = {e["rule"]: e for e in got["unchanged"]}
    assert set(unchanged) == {"low_mfu", "estimated_cost"}
    assert (unchanged["low_mfu"]["title_a"], unchanged["low_mfu"]["title_b"]) == (
        "MFU 20%",
        "MFU 31%",
    )


def test_a_stall_found_cpu_bound_is_changed_not_resolved_and_new():
    # A: a plain stall; B: the same stall, its cause found: it did not go away
    a = [finding("dataloader_stall", "HIGH", "57% waiting")]
    b = [finding("cpu_bound_dataloader", "HIGH", "40% waiting; CPU-bound")]
    got = finding_changes(a, b)
    assert got["resolved"] == [] and got["new"] == []
    assert [(e["rule_a"], e["rule"], e["label"]) for e in got["changed"]] == [
        ("dataloader_stall", "cpu_bound_dataloader", "loader stall → CPU-bound loader"),
    ]
    assert (got["changed"][0]["title_a"], got["changed"][0]["title_b"]) == (
        "57% waiting",
        "40% waiting; CPU-bound",
    )
    # the other way (a slow first step told as a plain warm-up): changed too
    back = finding_changes([finding("first_step_outlier", "MED")], [finding("compilation_warmup")])
    assert [e["label"] for e in back["changed"]] == ["slow first step → slow warm-up"]
    # unrelated findings still resolve and appear: the demo's fix (A's
    # CPU-bound stall gone, B on a busy host) resolved the stall
    other = finding_changes([finding("cpu_bound_dataloader")], [finding("host_cpu_contention")])
    assert [e["rule"] for e in other["resolved"]] == ["cpu_bound_dataloader"]
    assert [e["rule"] for e in other["new"]] == ["host_cpu_contention"]
    assert other["changed"] == []
    # and the verdict calls nothing resolved
    n = 40
    out = compare_runs(ctx([30.0] * n, [20.0] * n), ctx([30.0] * n, [10.0] * n), a, b)
    assert "resolved" not in out["verdict"] and "new" not in out["verdict"]


def test_contention_folded_into_a_starved_loader_is_not_new_nor_resolved():
    # A: the workers starved of CPU (the contention folded in); B: the stall
    # fixed, the same busy host left: its contention finding was there in A
    starved = finding("cpu_bound_dataloader", evidence={"cause": "contention"})
    got = finding_changes([starved], [finding("host_cpu_contention")])
    assert got["new"] == [] and got["resolved"] == []
    assert [(e["rule_a"], e["rule"], e["label"]) for e in got["changed"]] == [
        ("cpu_bound_dataloader", "host_cpu_contention", "CPU-bound loader → host CPU contention"),
    ]
    # the mirror: A's contention, B's stall starved by it
    back = finding_changes([finding("host_cpu_contention")], [starved])
    assert back["new"] == [] and back["resolved"] == []
    assert [e["label"] for e in back["changed"]] == ["host CPU contention → CPU-bound loader"]
    # a CPU-bound loader of the run's own making told nothing of others' CPU
    own = finding("cpu_bound_dataloader", evidence={"cause": "own"})
    other = finding_changes([own], [finding("host_cpu_contention")])
    assert [e["rule"] for e in other["new"]] == ["host_cpu_contention"]
    assert [e["rule"] for e in other["resolved"]] == ["cpu_bound_dataloader"]


def test_a_regression_between_runs_of_different_names_is_each_runs_own():
    a = [finding("regression", "MED", "30% slower than its last 3 runs"), finding("low_mfu", "MED")]
    b = [finding("low_mfu", "MED")]
    same = finding_changes(a, b)
    assert [e["rule"] for e in same["resolved"]] == ["regression"]  # one name: it went away
    apart = finding_changes(a, b, same_name=False)
    assert apart["resolved"] == [] and apart["new"] == []
    assert [(e["rule"], e["severity_a"]) for e in apart["history"]] == [("regression", "MED")]
    assert [e["rule"] for e in apart["unchanged"]] == ["low_mfu"]
    # both sides' own regressions are kept apart too, never "changed"
    both = finding_changes(a, [finding("regression", "HIGH")], same_name=False)
    assert both["changed"] == [] and both["history"][0]["severity_b"] == "HIGH"


def test_the_verdict_says_no_regression_resolved_between_names():
    n = 200
    a = ctx(noisy(20.0, 1, n, 1), noisy(5.0, 1, n, 2), {}, run_name="baseline")
    b = ctx(noisy(20.0, 1, n, 3), noisy(5.0, 1, n, 4), {}, run_name="new-model")
    out = compare_runs(a, b, [finding("regression", "MED")], [])
    assert "regression" not in out["verdict"]
    assert [e["rule"] for e in out["findings"]["history"]] == ["regression"]
    faster = compare_runs(
        a,
        ctx(noisy(15.0, 1, n, 3), noisy(5.0, 1, n, 4), {}, run_name="baseline"),
        [finding("regression", "MED")],
        [],
    )
    assert '"regression" is resolved' in faster["verdict"]


def test_a_regression_that_went_with_its_rolling_baseline_is_not_resolved():
    # one name, B as slow as A: A's regression is gone from B only because
    # B's earlier runs (A among them) are now as slow; nothing was fixed
    n = 200
    a = ctx(noisy(20.0, 1, n, 1), noisy(5.0, 1, n, 2), {}, run_name="job")
    b = ctx(noisy(20.0, 1, n, 3), noisy(5.0, 1, n, 4), {}, run_name="job")
    same = compare_runs(a, b, [finding("regression", "MED")], [])
    assert same["within_noise"] is True
    assert same["findings"]["resolved"] == []
    assert [e["rule"] for e in same["findings"]["history"]] == ["regression"]
    assert "regression" not in same["verdict"]
    # nor new in a B no slower than A
    again = compare_runs(a, b, [], [finding("regression", "MED")])
    assert again["findings"]["new"] == [] and len(again["findings"]["history"]) == 1
    # B slower beyond noise: new
    slow = ctx(noisy(26.0, 1, n, 3), noisy(5.0, 1, n, 4), {}, run_name="job")
    assert '"regression" is new' in compare_runs(a, slow, [], [finding("regression")])["verdict"]


def test_the_issues_sentence():
    # A: 32.4 ms loader wait + 24.4 ms step (57 % waiting); B: 0.8 + 18.8 ms
    n = 200
    a = ctx(
        noisy(24.4, 2, n, 1), noisy(32.4, 4, n, 2), {"forward": 8.0, "backward": 14.0}, status="x"
    )
    b = ctx(noisy(18.8, 2, n, 3), noisy(0.8, 0.2, n, 4), {"forward": 6.0, "backward": 11.0})
    out = compare_runs(
        a,
        b,
        [finding("cpu_bound_dataloader"), finding("estimated_cost", "LOW")],
        [finding("estimated_cost", "LOW")],
        a_id=1,
        b_id=2,
    )
    assert re.fullmatch(
        r"B is 2\.9× faster \(95 % CI 2\.\d+–\d\.\d+\): loader wait fell from 57 % to 4 %; "
        r'"CPU-bound loader" is resolved\.',
        out["verdict"],
    ), out["verdict"]
    assert out["ci_low"] < 56.8 / 19.6 < out["ci_high"]
    assert out["within_noise"] is False
    # the step's phases rose as shares but fell in time: not named
    back = next(p for p in out["phases"] if p["phase"] == "backward")
    assert back["delta_pct"] > 5 and back["time_ratio"] < 1
    assert (out["a"]["run_id"], out["b"]["run_id"]) == (1, 2)
    assert out["a"]["steady_steps"] == n - WARMUP_STEPS


def test_a_phase_whose_share_rose_only_because_the_loader_shrank_is_not_named():
    # backward 3.8 -> 4.1 ms (6 % -> 22 % of the iteration) while the wait fell 53 -> 8 ms
    n = 200
    a = ctx(noisy(10.0, 0.5, n, 1), noisy(53.0, 2, n, 2), {"forward": 5.0, "backward": 3.8})
    b = ctx(noisy(10.3, 0.5, n, 3), noisy(8.0, 1, n, 4), {"forward": 5.0, "backward": 4.1})
    out = compare_runs(a, b, [], [])
    back = next(p for p in out["phases"] if p["phase"] == "backward")
    assert back["delta_pct"] > 10 and back["time_ratio"] > 1  # the share and the time rose
    assert back["change_pct"] == pytest.approx(100 * 0.3 / 63.0, abs=0.2)  # by 0.5 % of A's
    wait = next(p for p in out["phases"] if p["phase"] == "loader_wait")
    assert wait["change_pct"] == pytest.approx(-100 * 45 / 63.0, abs=2)
    assert re.search(r": loader wait fell from 8\d % to 4\d %\.$", out["verdict"]), out["verdict"]
    assert "backward" not in out["verdict"]


def test_a_phase_that_grew_while_its_share_fell_is_named_by_its_time():
    # A: 10 ms wait + 10 ms step (forward 5 ms: 25 %); B: 100 ms wait + 20 ms
    # step (forward 15 ms: 12.5 %). The forward's share fell, yet it tripled:
    # 10 ms more an iteration, 50 % of A's, part of why B is 6× slower.
    n = 200
    a = ctx(noisy(10.0, 0.5, n, 1), noisy(10.0, 0.5, n, 2), {"forward": 5.0, "backward": 4.0})
    b = ctx(noisy(20.0, 0.5, n, 3), noisy(100.0, 2, n, 4), {"forward": 15.0, "backward": 4.0})
    out = compare_runs(a, b, [], [])
    fwd = next(p for p in out["phases"] if p["phase"] == "forward")
    assert fwd["delta_pct"] < -5 and fwd["change_pct"] == pytest.approx(50, abs=3)
    assert re.fullmatch(
        r"B is 6\.\d× slower \(95 % CI [\d.–]+\): loader wait rose from 50 % to 83 %; "
        r"forward time per iteration rose 3\.\d×\.",
        out["verdict"],
    ), out["verdict"]
    # every part tripled (the forward's share held at 25 %): the headline says it all
    same = ctx(noisy(30.0, 0.5, n, 3), noisy(30.0, 1, n, 4), {"forward": 15.0, "backward": 12.0})
    out = compare_runs(a, same, [], [])
    assert re.fullmatch(r"B is 3\.0× slower \(95 % CI [\d.–]+\)\.", out["verdict"]), out["verdict"]
    # grown by less than PHASE_TIME_PCT of A's iteration: left out
    small = ctx(noisy(21.0, 0.5, n, 3), noisy(100.0, 2, n, 4), {"forward": 6.0})
    out = compare_runs(
        ctx(noisy(10.0, 0.5, n, 1), noisy(10.0, 0.5, n, 2), {"forward": 5.0}), small, [], []
    )
    assert "forward" not in out["verdict"], out["verdict"]


def test_a_slower_run_says_its_slow_down_interval():
    out = compare_runs(ctx(noisy(10, 1, 100, 1)), ctx(noisy(14, 1.4, 100, 2)), [], [])
    m = re.fullmatch(r"B is 1\.4\d× slower \(95 % CI (1\.\d+)–(1\.\d+)\)\.", out["verdict"])
    assert m, out["verdict"]
    assert float(m[1]) < 1.4 < float(m[2])


def test_within_noise_is_said_and_new_findings_named():
    out = compare_runs(
        ctx(noisy(30, 6, 150, 0)),
        ctx(noisy(30, 6, 150, 500)),
        [],
        [finding("power_capping", "MED"), finding("thermal_throttling", "HIGH")],
    )
    assert out["within_noise"] is True
    assert re.fullmatch(
        r"B is as fast as A within noise \(\d\.\d\d×, 95 % CI 0\.\d\d–1\.\d\d\): "
        r'"thermal throttling" and "power capping" are new\.',
        out["verdict"],
    ), out["verdict"]


def test_verdict_names_at_most_three_findings():
    from gpuprof.stats import SpeedRatio

    changes = finding_changes([finding(f"rule_{i}") for i in range(5)], [])
    sentence = verdict(SpeedRatio(2.0, 1.9, 2.1, False, 50, 50), "iteration", [], changes)
    assert sentence == (
        'B is 2.0× faster (95 % CI 1.9–2.1): "rule 0", "rule 1", "rule 2" and 2 more are resolved.'
    )


def test_a_run_without_steps_cannot_be_compared():
    with pytest.raises(ValueError, match=r"run 4 \('empty'\) has no timed steps"):
        compare_runs(ctx([10.0] * 20), ctx([], run_name="empty"), [], [], 3, 4)


def test_too_few_steps_are_said_instead_of_an_interval():
    out = compare_runs(ctx([10.0] * 8), ctx([5.0] * 8), [], [])
    assert out["verdict"] == "B is 2.0× faster (too few steady steps for an interval: 5 and 5)."
    assert (out["ci_low"], out["ci_high"], out["within_noise"]) == (None, None, None)


def test_a_run_too_short_for_the_rules_resolves_and_adds_no_finding():
    # B, 2 steps, had no contention finding because no rule could look, not
    # because the host went quiet: its absence is not "resolved"
    a_found = [finding("host_cpu_contention", "HIGH"), finding("estimated_cost", "LOW")]
    b_found = [finding("estimated_cost", "LOW"), finding("compilation_warmup", "MED")]
    out = compare_runs(ctx([10.0] * 40), ctx([5.0] * 2), a_found, b_found)
    got = out["findings"]
    assert got["resolved"] == [] and got["new"] == []
    assert [e["rule"] for e in got["unjudged"]] == ["host_cpu_contention", "compilation_warmup"]
    assert [e["rule"] for e in got["unchanged"]] == ["estimated_cost"]
    assert out["verdict"] == "B is 2.0× faster (too few steady steps for an interval: 37 and 2)."
    # 10 steady steps on both sides: judged
    enough = compare_runs(ctx([10.0] * 40), ctx([5.0] * 13), a_found, b_found)["findings"]
    assert [e["rule"] for e in enough["resolved"]] == ["host_cpu_contention"]
    assert enough["unjudged"] == []
    # a running run gpuprofd has not judged yet (no finding stored, not even
    # the cost line): its findings are not looked for either
    fresh = ctx([5.0] * 40, status="running")
    early = compare_runs(ctx([10.0] * 40), fresh, a_found, [])["findings"]
    assert early["resolved"] == [] and len(early["unjudged"]) == 2
    judged = compare_runs(ctx([10.0] * 40), fresh, a_found, b_found)["findings"]
    assert [e["rule"] for e in judged["resolved"]] == ["host_cpu_contention"]


def busy(step_ms: list[float], others: float) -> RunContext:
    """A run whose every step had the 2-core host pegged, *others* cores of
    it held by other processes (what the host sampler recorded)."""
    n = len(step_ms)
    return ctx(step_ms, step_host_pct=(100.0,) * n, step_other_cores=(others,) * n, cpu_count=2)


def test_a_slowdown_measured_on_a_busy_host_says_so():
    a, b = ctx([10.0] * 40), busy([13.0] * 40, 0.8)
    out = compare_runs(a, b, [], [])
    assert out["measured_under_contention"] == {
        "a": None,
        "b": {"share_of_steps": 1.0, "other_cores": 0.8, "cpu_count": 2},
    }
    assert out["verdict"] == (
        "B is 1.30× slower (95 % CI 1.30–1.30); B was measured on a busy host (other "
        "processes held 0.8 of 2 cores during 100% of its steps): the slowdown may be "
        "the host's, not the code's."
    )
    # the same runs the other way round: A's speed-up over the busy run is suspect too
    back = compare_runs(b, a, [], [])
    assert back["verdict"].endswith("the speed-up may be the host's, not the code's.")


def test_a_busy_host_is_not_named_where_it_cannot_explain_the_ratio():
    # the busy run was the faster one: its lead holds despite the load
    out = compare_runs(busy([10.0] * 40, 0.8), ctx([13.0] * 40), [], [])
    assert out["verdict"] == "B is 1.30× slower (95 % CI 1.30–1.30)."
    # within noise: nothing to explain
    same = compare_runs(ctx(noisy(10, 1, 60, 1)), busy(noisy(10, 1, 60, 2), 0.8), [], [])
    assert same["within_noise"] and "busy host" not in same["verdict"]
    # a light load (others under half a core) is not contention
    light = compare_runs(ctx([10.0] * 40), busy([13.0] * 40, 0.3), [], [])
    assert light["measured_under_contention"]["b"] is None
    assert "busy host" not in light["verdict"]


def test_both_runs_on_a_busy_host():
    out = compare_runs(busy([10.0] * 40, 0.8), busy([13.0] * 40, 0.9), [], [])
    assert out["verdict"].endswith(
        "; both runs were measured on a busy host: the ratio carries its load as well."
    )
