"""The summary says what each finding is worth, lists them by it, and its
headline line says what the top fix is worth."""

from __future__ import annotations

import pytest

from gpuprof.insights import run_rules
from gpuprof.summary import (
    duration_text,
    format_summary,
    gain_headline,
    gain_line,
    make_summary,
    speedup_text,
)

from .insights.conftest import make_ctx


def _mixed(n: int = 40):
    """A HIGH stall (20 ms of each step's wait) worth less than a MED
    erratic-steps finding (every 10th step 300 ms against 10)."""
    step = [10.0] * n
    for i in range(9, n, 10):
        step[i] = 300.0
    return make_ctx(step, [20.0] * n, explicit_wait=True, duration_s=3.0)


def _summary(ctx):
    return make_summary(1, ctx, [i.to_dict() for i in run_rules(ctx)], "/d")


def test_findings_are_listed_by_gain_with_their_worth_and_the_top_fixs_headline():
    summary = _summary(_mixed())
    assert [(i["rule"], i["severity"]) for i in summary["insights"]] == [
        ("high_step_variance", "MED"),
        ("dataloader_stall", "HIGH"),
        ("estimated_cost", "LOW"),
    ]
    lines = format_summary(summary).splitlines()
    # steady steps 3-39: 4 slow steps 290 ms over the median each, 31.4 ms per
    # iteration of 61.4 (40.8 ms steps + 20 ms wait), 40 steps
    at = lines.index("  Insights (3, by what fixing each is worth):")
    assert lines[at - 1] == (
        "  Fixing the slow steps: up to 2.0× faster (~1 s of this 3-s run); "
        "fixing all 2: up to 6.1×"
    )
    assert lines[at + 1].startswith("  [MED]  Step compute time is erratic")
    assert lines[at + 2] == (
        "          Worth: up to 2.0× faster: 31.4 of 61.4 ms per iteration (51%), ~1 s of this run"
    )
    assert lines[at + 3].startswith("  [HIGH] 33% of step time waiting on the loader")
    assert lines[at + 4] == (
        "          Worth: up to 1.5× faster: 20.0 of 61.4 ms per iteration (33%), "
        "~800 ms of this run"
    )
    assert lines[at + 5] == "  [LOW]  Estimated cost: not estimated (no NVIDIA GPU in this run)"
    # the two describe different time: fixing both is worth their parts together
    gains = summary["gains"]
    assert gains["fix_all_ms_per_iteration"] == pytest.approx(51.351, abs=1e-3)
    assert gains["fix_all_parts_ms"] == {"loader_wait": 20.0, "slow_steps": 31.351}
    assert gains["findings"] == 2 and summary["duration_s"] == 3.0


def test_details_add_the_method_and_a_finding_not_estimated_says_why():
    ins = {
        "gain_ms_per_iteration": 10.0,
        "gain_pct": 20.0,
        "gain_speedup_max": 1.25,
        "gain_run_s": 1500.0,
        "gain_usd": 12.5,
        "gain_iteration_ms": 50.0,
        "gain_method": "the wait, removed",
    }
    assert gain_line(ins, details=True) == [
        "          Worth: up to 1.2× faster: 10.0 of 50.0 ms per iteration (20%), "
        "~25 min, ~$12.50 of this run",
        "          How: the wait, removed",
    ]
    not_estimated = {"gain_ms_per_iteration": None, "gain_method": "not estimated: why"}
    assert gain_line(not_estimated) == ["          Worth: not estimated"]
    assert gain_line(not_estimated, details=True) == ["          Worth: not estimated: why"]
    assert gain_line({"gain_ms_per_iteration": None, "gain_method": None}) == []


def test_a_sub_millisecond_gain_keeps_its_digits():
    # a CPU loop of 0.17-ms iterations whose slow steps cost 0.048 ms each:
    # "0.0 of 0.2 ms per iteration (28%)" read as a gain of nothing
    ins = {"gain_ms_per_iteration": 0.048, "gain_pct": 28.0, "gain_speedup_max": 1.4}
    assert gain_line({**ins, "gain_iteration_ms": 0.17}) == [
        "          Worth: up to 1.4× faster: 0.048 of 0.17 ms per iteration (28%)"
    ]
    assert gain_line({**ins, "gain_ms_per_iteration": 0.03, "gain_iteration_ms": 3.2}) == [
        "          Worth: up to 1.4× faster: 0.030 of 3.2 ms per iteration (28%)"
    ]


def test_the_headline_with_money_and_without_any_gain():
    summary = {
        "duration_s": 2640.0,
        "insights": [
            {
                "severity": "HIGH",
                "gain_ms_per_iteration": 32.4,
                "gain_speedup_max": 2.33,
                "gain_run_s": 1500.0,
                "gain_usd": 67.0,
                "gain_label": "the loader stall",
            }
        ],
    }
    assert gain_headline(summary) == (
        "  Fixing the loader stall: up to 2.3× faster (~25 min of this 44-min run, ~$67.00)"
    )
    assert gain_headline({"insights": [{"severity": "LOW"}]}) is None
    # a summary without any gain prints the findings as before
    plain = _summary(make_ctx([10.0] * 10))
    assert "  Insights (1):" in format_summary(plain).splitlines()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.03, "30 ms"), (14.2, "14 s"), (1500, "25 min"), (3 * 3600, "3.0 h")],
)
def test_durations_are_said_in_a_runs_units(seconds, text):
    assert duration_text(seconds) == text


def test_speedups_keep_two_decimals_below_1_1():
    assert (speedup_text(1.04), speedup_text(2.33)) == ("1.04×", "2.3×")
