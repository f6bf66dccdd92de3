"""gpuprofd.commands.screen: the keys a terminal sends, the size of a frame."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpuprofd.commands.screen import decode_keys, frame_size


def test_keys_and_arrows_in_what_the_terminal_sent() -> None:
    assert decode_keys(b"q") == ["q"]
    assert decode_keys(b"\x1b[A\x1b[Bj\r") == ["up", "down", "j", "enter"]
    assert decode_keys(b"\x1bOA\x1b[C\x1b[D") == ["up", "right", "left"]  # application mode too
    assert decode_keys(b"\x1b") == ["esc"] and decode_keys(b"\x1b[Z") == ["esc"]
    assert decode_keys(b"\n") == ["enter"] and decode_keys(b"") == []


def test_a_frame_as_text_is_columns_by_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINES", "40")
    console = Console(file=io.StringIO(), width=100)
    assert frame_size(console) == (100, 40)
    monkeypatch.setenv("LINES", "junk")
    assert frame_size(console) == (100, 24)
