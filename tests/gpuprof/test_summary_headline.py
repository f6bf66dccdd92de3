"""The summary's header figure (throughput that holds run to run) and its
one line on contention."""

from __future__ import annotations

from gpuprof.summary import format_summary, headline, make_summary

from .insights.conftest import make_ctx


def _bimodal(fast_ms: float, slow_ms: float, first_slow: int, n: int = 40):
    """Two loader workers delivering batches in pairs: every other iteration
    (from step *first_slow*, 0 or 1) waits for the next pair."""
    waits = [slow_ms - fast_ms if i % 2 == first_slow else 0.0 for i in range(n)]
    return make_ctx([fast_ms] * n, waits)


def test_bimodal_runs_share_one_headline_figure_with_the_median_beside_it():
    # two identical loops: the steady steps' median lands on either mode
    a = make_summary(1, _bimodal(45.0, 215.0, 1), [], "/d")
    b = make_summary(2, _bimodal(45.0, 215.0, 0), [], "/d")
    assert (a["median_step_ms"], b["median_step_ms"]) == (215.0, 45.0)
    assert headline(a) == "40 steps, 132.3 ms/iteration (median 215.0), 7.6 steps/s"
    assert headline(b) == "40 steps, 127.7 ms/iteration (median 45.0), 7.8 steps/s"
    assert b["steps_per_s"] == round(1e3 / b["mean_iteration_ms"], 3)


def test_median_shown_only_where_it_differs_from_the_mean():
    steady = make_summary(1, make_ctx([100.0] * 20), [], "/d")
    assert headline(steady) == "20 steps, 100.0 ms/iteration, 10.0 steps/s"
    skewed = make_summary(1, make_ctx([100.0] * 15 + [400.0] * 5), [], "/d")
    # steady steps 3..19: 12 at 100 ms, 5 at 400 ms: mean 188.2, median 100
    assert headline(skewed) == "20 steps, 188.2 ms/iteration (median 100.0), 5.3 steps/s"


def test_a_summary_stored_before_the_mean_keeps_its_median_headline():
    old = {"run_name": "r", "steps": 3, "median_step_ms": 12.0, "avg_step_ms": 13.0}
    assert headline(old) == "3 steps, median 12.0 ms"
    assert headline({"run_name": "r", "steps": 0, "avg_step_ms": None}) == "0 steps"
    assert headline({"run_name": "r", "steps": 1, "median_step_ms": 9.0}) == "1 step, median 9.0 ms"


def _contended_ctx(share_contended: float, n: int = 40):
    k = round(share_contended * n)
    return make_ctx(
        [10.0] * n,
        step_host_pct=tuple([100.0] * k + [40.0] * (n - k)),
        step_other_cores=tuple([1.2] * k + [0.1] * (n - k)),
        step_own_cores=tuple([0.8] * n),
        cpu_count=2,
    )


def test_measured_under_contention_in_the_json_and_once_in_the_text():
    summary = make_summary(1, _contended_ctx(0.5), [], "/d")
    assert summary["measured_under_contention"] == {
        "share_of_steps": 0.5,
        "other_cores": 1.2,
        "cpu_count": 2,
    }
    text = format_summary(summary)
    assert text.count("Measured under contention") == 1
    assert (
        "  Measured under contention: other processes held 1.2 of 2 cores during 50% of the "
        "steps; its timings are slower than on an idle host." in text.splitlines()
    )


def test_no_contention_line_on_a_quiet_host_or_without_samples():
    quiet = make_summary(1, _contended_ctx(0.05), [], "/d")  # 2 of 40 steps: noise
    assert quiet["measured_under_contention"] is None
    assert "contention" not in format_summary(quiet)
    unsampled = make_summary(1, make_ctx([10.0] * 40), [], "/d")
    assert unsampled["measured_under_contention"] is None
