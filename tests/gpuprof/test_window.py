"""gpuprof.window: the figures of a live run's last steps (top's and watch's)."""

from __future__ import annotations

import pytest

from gpuprof.window import PHASES, window_figures


def row(iter_ms: float, wait: float = 0.0, **flags: bool) -> dict:
    phases = dict.fromkeys(PHASES, 0.0)
    phases.update(loader_wait=wait, forward=iter_ms - wait)
    return {"iter": iter_ms, **phases, **flags}


def test_mean_median_rate_and_shares_of_the_timed_steps() -> None:
    rows = [row(10, wait=5), row(20, wait=5), row(60, wait=5), row(500, traced=True)]
    figs = window_figures(rows, unit_s=1e-3)
    assert figs["steps"] == 3 and figs["traced"] == 1  # the traced step is not timed
    assert figs["mean"] == pytest.approx(30.0) and figs["median"] == 20.0
    assert figs["steps_per_s"] == pytest.approx(1000 / 30)
    assert figs["pct"]["loader_wait"] == pytest.approx(100 * 15 / 90)
    assert figs["pct"]["forward"] == pytest.approx(100 * 75 / 90)
    assert figs["pct"]["comm"] is None  # no step timed a collective


def test_comm_has_a_share_once_a_step_timed_one_and_units_are_the_rows() -> None:
    rows = [row(2e6), {**row(2e6), "comm": 1e6, "forward": 1e6, "eval": True, "skipped": True}]
    figs = window_figures(rows, unit_s=1e-9)
    assert figs["pct"]["comm"] == pytest.approx(25.0)
    assert figs["steps_per_s"] == pytest.approx(500.0)  # 2 ms an iteration, in ns
    assert (figs["eval"], figs["skipped"]) == (1, 1)


def test_no_timed_step_gives_no_figures() -> None:
    for rows in ([], [row(5, traced=True)], [row(0)]):
        figs = window_figures(rows, unit_s=1e-3)
        assert figs["mean"] is None and figs["steps_per_s"] is None
        assert set(figs["pct"].values()) == {None}


def test_the_time_between_steps_has_a_share_only_when_a_step_had_some() -> None:
    plain = window_figures([row(10, wait=5), row(20, wait=5)], unit_s=1e-3)
    assert plain["pct"]["between_steps"] is None  # none: not "0 %" beside every run
    slept = window_figures(
        [row(10, wait=5), {**row(50, wait=5), "between_steps": 40.0, "forward": 5.0}],
        unit_s=1e-3,
    )
    assert slept["pct"]["between_steps"] == pytest.approx(100 * 40 / 60)
    assert sum(slept["pct"][p] or 0 for p in PHASES) == pytest.approx(100.0)  # parts add up
