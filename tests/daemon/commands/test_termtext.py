"""gpuprofd.commands.termtext: a run's strings made inert, widths, gains, bars."""

from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console

from gpuprofd.commands.termtext import (
    cell,
    finding_line,
    fit,
    gain_of,
    gain_text,
    ms_text,
    phase_bar,
    safe,
    sparkline,
)


def printed(text) -> str:  # noqa: ANN001
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=True, color_system="truecolor").print(text)
    return out.getvalue()


def test_control_characters_show_as_escapes_and_never_reach_the_terminal() -> None:
    name = "run\x1b[2J\x07\r\n\u202eevil\u2028x\x9b31m"
    shown = safe(name)
    assert shown == "run\\x1b[2J\\x07\\x0d\\x0a\\u202eevil\\u2028x\\x9b31m"
    out = printed(finding_line({"severity": "HIGH", "title": name}, 120))
    # rich adds its own SGR codes; none of the name's controls gets through
    assert "\x1b[2J" not in out and "\x07" not in out and "\u202e" not in out and "\x9b" not in out
    assert "run\\x1b[2J" in out
    assert safe("naïve 日本 <b>") == "naïve 日本 <b>"  # printable text is left alone
    assert safe(None) == "-"


def test_fit_and_cell_count_terminal_cells() -> None:
    assert fit("digits-mlp", 20) == "digits-mlp"
    assert fit("digits-mlp-long-name", 8) == "digits-…"
    assert cell_len(fit("日本語の名前です", 7)) <= 7
    assert cell("abc", 5) == "abc  " and cell(42, 5, right=True) == "   42"
    assert cell("a\x1bb", 5) == "a\\x1…"  # escaped first, then fitted


def test_a_gain_shows_when_the_finding_carries_one() -> None:
    top = {
        "severity": "HIGH",
        "title": "t",
        "gain_ms_per_iteration": 51.23,
        "gain_speedup_max": 2.6,
    }
    assert gain_of(top) == (51.23, 2.6)
    assert gain_text(top) == "saves 51.2 ms/it, up to 2.6×"
    assert gain_of({"evidence": {"gain_ms_per_iteration": 3.0}}) == (3.0, None)
    assert gain_text({"evidence": {"gain_speedup_max": 12.4}}) == "up to 12×"
    # a small gain keeps its digits: "up to 1×" would say it is worth nothing
    assert gain_text({"evidence": {"gain_speedup_max": 1.034}}) == "up to 1.03×"
    # none, or nonsense: no gain shown
    for finding in ({}, {"gain_ms_per_iteration": "x"}, {"gain_speedup_max": float("nan")}):
        assert gain_text(finding) == ""
    line = finding_line({**top, "title": "w" * 100}, 60).plain
    assert len(line) == 60 and line.endswith("(saves 51.2 ms/it, up to 2.6×)")  # the gain kept


def test_numbers_keep_their_width() -> None:
    assert [ms_text(v) for v in (0.4821, 52.14, 1234.5, None)] == ["0.48", "52.1", "1234", "-"]


def test_the_phase_bar_is_always_its_width() -> None:
    bar = phase_bar({"loader_wait": 62.0, "forward": 10.0, "backward": 18.0, "other": 10.0}, 10)
    assert bar.plain == "WWWWWWFBB."
    assert phase_bar({"loader_wait": 33.3, "forward": 33.3, "backward": 33.4}, 10).plain == (
        "WWWFFFBBBB"
    )
    assert phase_bar({}, 10).plain == "·" * 10  # nothing known
    assert len(phase_bar({"forward": 1e-9, "backward": 99.0}, 7).plain) == 7


def test_sparkline_levels() -> None:
    assert sparkline([0, 1, 2, 4, 8, None]) == "▁▁▂▄█ "
    assert sparkline([5, 10], top=20) == "▂▄"
