"""gpuprofctl top's frame, rendered from a controlled ``node`` message."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from gpuprofd.commands.topframe import TopChoices, move_pick, sorted_runs, top_frame
from tests.daemon.commands.feeds import node_message, plain


def frame(choices: TopChoices | None = None, width: int = 80, height: int = 24, **kw) -> str:  # noqa: ANN003
    text = top_frame(
        kw.pop("node", node_message()),
        choices or TopChoices(),
        width,
        height,
        where="127.0.0.1:7311",
        clock=lambda t: "12:03:04",
        **kw,
    )
    return plain(text, width)


EXPECTED = """\
gpuprof top · 127.0.0.1:7311 · 2 live runs · 12:03:04             sort: run id ▼
RUN NAME          USER    RANK   STEPS STEP/S   MEAN MEDIAN PHASES      MFU DROP
  8 sft-\\x1b[2J\\… bob     1/8       40    1.2  812.0  805.5 FFFBBBBBCO  18%    3
  7 digits-mlp    alice   0/1     1520   12.1   82.4   52.1 WWWWWWFBBO    -    0
  8 [MED]  MFU 18%: the GPU does a small share of the math it could
  7 [HIGH] 62% of step time waiting on the load…  (saves 51.2 ms/it, up to 2.6×)

GPU NAME                    UTIL   MEMORY GiB   POWER W SM MHz TEMP RUN
  0 NVIDIA H200              41%    1.4/140.4   212/700   1980  38C #7 r0
  1 NVIDIA H200              97%    1.4/140.4   212/700   1980  38C #8 r1
CPU 2.5 of 16 cores busy: runs 2.1 (#8 0.9, #7 1.2), others 0.4
ms/it, last 100 steps · W wait  H between  F fwd  B bwd  C comm  O opt  . other
s sort  r reverse  ↑↓ pick  enter watch  q quit
"""


def test_the_frame_of_two_runs_two_gpus_and_the_host() -> None:
    assert frame() == EXPECTED


def test_sorting_by_each_key_and_reversing() -> None:
    runs = node_message()["runs"]
    order = {
        k: [r["id"] for r in sorted_runs(runs, TopChoices(sort=k))]
        for k in ("id", "name", "rate", "iter", "wait", "cpu")
    }
    assert order == {
        "id": [8, 7],
        "name": [8, 7],  # "sft-..." after "digits-mlp", descending
        "rate": [7, 8],  # 12.1 steps/s first
        "iter": [8, 7],  # 812 ms first
        "wait": [7, 8],  # 62% loader wait first
        "cpu": [7, 8],  # 1.21 cores first
    }
    assert [r["id"] for r in sorted_runs(runs, TopChoices(sort="rate", descending=False))] == [8, 7]
    choices = TopChoices()
    for _ in range(6):
        choices.next_sort()
    assert choices.sort == "id"  # s cycles through every key
    assert "sort: steps/s ▲" in frame(TopChoices(sort="rate", descending=False)).splitlines()[0]


def test_a_run_without_figures_sorts_last_either_way() -> None:
    msg = node_message()
    msg["runs"][1]["window"] = {**msg["runs"][1]["window"], "steps_per_s": None}
    for descending in (True, False):
        got = sorted_runs(msg["runs"], TopChoices(sort="rate", descending=descending))
        assert got[-1]["id"] == 7


def test_picking_moves_the_highlight_within_the_runs() -> None:
    runs = sorted_runs(node_message()["runs"], TopChoices())
    choices = TopChoices()
    move_pick(runs, choices, 1)
    assert choices.picked == 7
    move_pick(runs, choices, 1)
    assert choices.picked == 7  # the last stays picked
    move_pick(runs, choices, -5)
    assert choices.picked == 8
    out = io.StringIO()
    text = top_frame(node_message(), TopChoices(picked=7), 80, 24, clock=lambda t: "x")
    Console(file=out, width=80, force_terminal=True, color_system="standard").print(text)
    picked = [ln for ln in out.getvalue().splitlines() if "digits-mlp" in ln][0]
    assert "\x1b[7m" in picked  # reverse video on the picked row only
    assert "\x1b[7m" not in [ln for ln in out.getvalue().splitlines() if "bob" in ln][0]


@pytest.mark.parametrize("width", [60, 80, 132])
@pytest.mark.parametrize("height", [10, 24, 50])
def test_every_line_fits_the_terminal(width: int, height: int) -> None:
    msg = node_message()
    msg["runs"] = msg["runs"] * 20  # more runs than any height shows
    lines = frame(node=msg, width=width, height=height).splitlines()
    assert len(lines) <= height
    assert all(cell_len(ln) <= width for ln in lines), [ln for ln in lines if cell_len(ln) > width]
    assert lines[-1].startswith("s sort")  # the keys always show


def test_a_short_terminal_keeps_the_picked_run_and_says_how_many_more() -> None:
    msg = node_message()
    more = [{**msg["runs"][1], "id": i, "name": f"run-{i}"} for i in range(10, 30)]
    msg["runs"] = [*msg["runs"], *more]
    lines = frame(TopChoices(picked=7), node=msg, height=14).splitlines()
    assert any("digits-mlp" in ln for ln in lines)  # id 7 sorts last by id, yet shows
    assert any(ln.startswith("… ") and "more runs" in ln for ln in lines)
    assert len(lines) <= 14


def test_a_hostile_name_is_shown_as_text_never_sent_to_the_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=132, force_terminal=True, color_system="truecolor")
    console.print(top_frame(node_message(), TopChoices(), 132, 24, clock=lambda t: "x"))
    raw = out.getvalue()
    assert "sft-\\x1b[2J\\x1b]0;pwned\\x07" in raw  # all of it, visible
    assert "\x1b[2J" not in raw and "\x1b]" not in raw and "\x07" not in raw


def test_waiting_for_the_feed_and_no_runs() -> None:
    assert frame(node=None).splitlines()[1] == "waiting for the live feed of 127.0.0.1:7311…"
    empty = {**node_message(), "runs": [], "gpus": [], "hosts": []}
    lines = frame(node=empty).splitlines()
    assert lines[0].startswith("gpuprof top · 127.0.0.1:7311 · 0 live runs")
    assert lines[2] == "no live runs: they show here as soon as one starts"
    error = frame(error="the database could not be read").splitlines()[1]
    assert error == "error: the database could not be read"


def test_gpus_of_several_hosts_are_named_by_host() -> None:
    msg = node_message()
    msg["gpus"][1] = {**msg["gpus"][1], "host": "node-b", "index": None}
    msg["hosts"].append({**msg["hosts"][0], "host": "node-b", "cpu_count": None})
    lines = frame(node=msg).splitlines()
    assert any(ln.startswith("  - node-b NVIDIA H200") for ln in lines)
    assert "CPU node-b: no recent host sample" in lines
    assert any(ln.startswith("CPU node-a 2.5 of 16 cores busy") for ln in lines)


def test_the_frames_in_the_docs_are_todays() -> None:
    """docs/terminal.md shows frames captured from a real run: their fixed
    lines are what the views draw now."""
    from pathlib import Path

    from gpuprofd.commands.topframe import KEYS_LINE

    doc = (Path(__file__).resolve().parents[3] / "docs" / "terminal.md").read_text()
    blocks = doc.split("```\n")
    top = next(b for b in blocks if b.startswith("gpuprof top · "))
    watch = next(b for b in blocks if b.startswith("gpuprof watch · "))
    now = frame().splitlines()
    assert top.splitlines()[1] == now[1]  # the column headers
    assert top.splitlines()[-2:] == now[-2:]  # the legend and the keys
    assert KEYS_LINE in top and watch.splitlines()[-1] == "q quit"
    assert all(len(ln) <= 80 for ln in top.splitlines() + watch.splitlines())


def test_printed_as_plain_text_it_lists_no_keys() -> None:
    # piped or --once: no key works there, so none is offered
    printed = frame(keys=False)
    assert printed == EXPECTED.replace("s sort  r reverse  ↑↓ pick  enter watch  q quit\n", "")
