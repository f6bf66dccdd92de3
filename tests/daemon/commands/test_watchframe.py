"""gpuprofctl watch's state and frame, from a controlled sequence of live
messages (tests/daemon/commands/feeds.py)."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from gpuprofd.commands.livestate import RunState, StepPoint
from gpuprofd.commands.watchframe import (
    chart_columns,
    chart_rows,
    chart_top,
    steps_per_column,
    summary_text,
    watch_frame,
)
from tests.daemon.commands.feeds import (
    GPU0,
    HOSTILE,
    RUN_HEADLINE,
    STALL,
    T0,
    plain,
    run_messages,
    step_row,
)


def watched(steps: int = 60) -> RunState:
    state = RunState(7, headline=dict(RUN_HEADLINE))
    for msg in run_messages(steps):
        state.apply(msg)
    return state


def frame(state: RunState, width: int = 80, height: int = 24) -> str:
    return plain(watch_frame(state, width, height, plain=True, clock=lambda t: "12:03:04"), width)


EXPECTED = """\
gpuprof watch · #7 digits-mlp · alice · running                         12:03:04
60 steps · 1.9 steps/s · 525.4 ms/it mean, 500.0 median (last 59 steps)
ms/iteration, one column per step                                   top 800.0 ms
O         O         O         O         O         O
B         B         B         B         B         B
B         B         B         B         B         B
FOOOOOOOOOFOOOOOOOOOFOOOOOOOOOFOOOOOOOOOFOOOOOOOOOFOOOOOOOOO
FBBBBBBBBBFBBBBBBBBBFBBBBBBBBBFBBBBBBBBBFBBBBBBBBBFBBBBBBBBB
WBBBBBBBBBWBBBBBBBBBWBBBBBBBBBWBBBBBBBBBWBBBBBBBBBWBBBBBBBBB
WFFFFFFFFFWFFFFFFFFFWFFFFFFFFFWFFFFFFFFFWFFFFFFFFFWFFFFFFFFF
WFFFFFFFFFWFFFFFFFFFWFFFFFFFFFWFFFFFFFFFWFFFFFFFFFWFFFFFFFFF
                    e                   T
step 0                   T traced · e eval · s skipped                   step 59
W wait 9%  F fwd 30%  B bwd 46%  O opt 15%  . other 0%
GPU 0 NVIDIA H200  util 41%  mem 1.4/140.4 GiB  212/700 W  1980 MHz  38C
CPU  this run 1.2 cores, others 0.3 of 16
Findings (2, whole run, as of 12:03:04):
  [HIGH] 62% of step time waiting on the loader…  (saves 51.2 ms/it, up to 2.6×)
  [MED]  MFU 18%: the GPU does a small share of the math it could
q quit
"""


def test_the_frame_of_a_watched_run() -> None:
    assert frame(watched()) == EXPECTED


def test_steps_past_the_run_states_count_are_counted() -> None:
    from gpuprofd.commands.watch import progress_line

    state = watched()  # the state: 60 steps, the last index 59
    state.apply({"type": "steps", "rows": [step_row(i, 20.0, 480.0) for i in range(60, 85)]})
    assert state.step_count() == 85
    assert frame(state).splitlines()[1].startswith("85 steps · ")
    assert " step 84 · 85 steps · " in progress_line(state)
    # the next state counts 80 of them (up to index 79): 5 are beyond it
    state.apply({"type": "run", "run": {**state.state, "steps": 80, "last_step": 79}})
    assert state.step_count() == 85
    # a state without last_step (an older gpuprofd): its count as said
    state.apply({"type": "run", "run": {"status": "running", "steps": 80}})
    assert state.step_count() == 80


def test_in_a_terminal_the_phases_are_coloured_blocks() -> None:
    out = io.StringIO()
    text = watch_frame(watched(), 80, 24, plain=False, clock=lambda t: "12:03:04")
    Console(file=out, width=80, force_terminal=True, color_system="standard").print(text)
    chart = out.getvalue().splitlines()[3:11]
    assert all("█" in ln for ln in chart) and not any("W" in ln or "B" in ln for ln in chart)
    assert "\x1b[31m█" in out.getvalue()  # the loader wait's red, on the spikes' bottom cells


def test_the_feed_is_applied_once_whatever_repeats_a_reconnect_brings() -> None:
    state = watched()
    assert state.cursors() == {"step": 59, "t": T0 + 6}
    for msg in run_messages():  # a reconnect with old cursors: everything again
        state.apply(msg)
    assert [p.step for p in state.steps] == list(range(60))
    older = {"type": "gpus", "samples": [{"uuid": GPU0, "t": T0 + 1, "util_pct": 5.0}]}
    state.apply(older)
    assert state.gpus[GPU0]["util_pct"] == 41.0  # an older sample never replaces a newer
    state.apply({"type": "steps", "rows": [step_row(60, 20.0, 480.0), {"step": "x"}, "junk"]})
    assert state.steps[-1].step == 60 and len(state.steps) == 61  # the bad rows skipped
    assert state.cursors() == {"step": 60, "t": T0 + 6}


def test_a_reset_asks_for_new_cursors_and_start_at_skips_the_past() -> None:
    state = RunState(7)
    state.apply({"type": "reset"})
    assert state.reset
    state.start_at(step=1499, t=T0 + 100)
    assert not state.reset and state.cursors() == {"step": 1499, "t": T0 + 100}
    state.apply({"type": "steps", "rows": [step_row(5, 1, 1), step_row(1500, 1, 1)]})
    assert [p.step for p in state.steps] == [1500]


def test_fast_loops_group_steps_so_the_chart_moves_at_a_readable_pace() -> None:
    assert [steps_per_column(r) for r in (None, 0.5, 2.0, 3.0, 11.6, 400.0)] == [1, 1, 1, 2, 8, 256]
    points = [StepPoint(i, T0, 10.0 + i, (10.0 + i, 0, 0, 0, 0, 0, 0)) for i in range(3, 20)]
    cols = chart_columns(points, 80, 4)
    # grouped by step index: 3 | 4-7 | 8-11 | 12-15 | 16-19, so a column keeps its steps
    assert [(c.first, c.n) for c in cols] == [(3, 1), (4, 4), (8, 4), (12, 4), (16, 4)]
    assert cols[1].iter == pytest.approx(15.5)
    assert [(c.first, c.n) for c in chart_columns(points, 2, 4)] == [(12, 4), (16, 4)]


def test_one_slow_step_is_clipped_so_the_others_stay_readable() -> None:
    steady = [StepPoint(i, T0, 100.0, (0, 0, 100.0, 0, 0, 0, 0)) for i in range(1, 10)]
    slow = StepPoint(0, T0, 3000.0, (0, 0, 0, 0, 0, 0, 3000.0))
    cols = chart_columns([slow, *steady], 80, 1)
    top = chart_top(cols)
    assert top == pytest.approx(250.0)  # 2.5 x the median column, not the 3 s step
    rows = [r.plain for r in chart_rows(cols, 5, top, plain=True)]
    assert rows[0][0] == "↑" and rows[-1] == ".FFFFFFFFF"
    even = chart_columns(steady, 80, 1)
    assert chart_top(even) == 100.0  # no outlier: the tallest column is the top
    assert "↑" not in "".join(r.plain for r in chart_rows(even, 5, chart_top(even), plain=True))


def test_every_line_fits_and_the_findings_give_way_to_the_height() -> None:
    state = watched(300)
    state.apply({"type": "insights", "insights": [STALL] * 30, "computed_s": T0})
    for width, height in ((60, 16), (80, 24), (132, 40)):
        lines = frame(state, width, height).splitlines()
        assert len(lines) <= height and all(cell_len(ln) <= width for ln in lines)
        assert lines[-1] == "q quit" and any("more" in ln for ln in lines)


def test_before_anything_came_and_before_the_first_findings() -> None:
    state = RunState(3, headline={"name": "x", "status": "running", "gpus": []})
    lines = frame(state).splitlines()
    assert lines[0].startswith("gpuprof watch · #3 x · running")
    assert "no step yet" in lines and lines[-2].startswith("Findings: none yet")
    state.apply({"type": "insights", "insights": [], "computed_s": T0})
    assert frame(state).splitlines()[-2] == "Findings: none, as of 12:03:04"


def test_findings_show_most_severe_first() -> None:
    state = watched()
    low = {"rule": "estimated_cost", "severity": "LOW", "title": "Estimated cost"}
    state.apply({"type": "insights", "insights": [low, STALL], "computed_s": T0})
    lines = frame(state).splitlines()
    assert (
        lines[-3].startswith("  [HIGH] 62% of step time") and lines[-2] == "  [LOW]  Estimated cost"
    )


def test_a_hostile_name_and_finding_show_as_text() -> None:
    state = watched()
    state.apply({"type": "run", "run": {"name": HOSTILE, "status": "running", "steps": 60}})
    hostile_finding = {**STALL, "title": "evil \x1b[2J title"}
    state.apply({"type": "insights", "insights": [hostile_finding], "computed_s": T0})
    out = io.StringIO()
    text = watch_frame(state, 120, 24, clock=lambda t: "x")
    Console(file=out, width=120, force_terminal=True, color_system="truecolor").print(text)
    raw = out.getvalue()
    assert "#7 sft-\\x1b[2J\\x1b]0;pwned\\x07" in raw and "evil \\x1b[2J title" in raw
    assert "\x1b[2J" not in raw and "\x1b]" not in raw and "\x07" not in raw


def test_the_summary_at_the_end_is_inert_text() -> None:
    summary = {
        "run_id": 7,
        "run_name": HOSTILE,
        "status": "finished",
        "steps": 60,
        "mean_iteration_ms": 525.4,
        "median_step_ms": 500.0,
        "insights": [STALL],
        "notes": [],
    }
    text = summary_text(summary)
    assert "gpuprof · sft-\\x1b[2J\\x1b]0;pwned\\x07  (60 steps, 525.4 ms/iteration" in text
    assert "\x1b" not in text and "[HIGH] 62% of step time waiting on the loader" in text
    state = watched()
    state.apply({"type": "run", "run": {"status": "finished", "steps": 60}})
    assert state.ended and "finished" in frame(state).splitlines()[0]
