"""Reading back what a finding's title names (for tests that check it)."""

from __future__ import annotations

import re


def named_ranges(title: str) -> list[tuple[int, int]]:
    """The step ranges a high_step_variance title names, ``(first, last)``
    each: "slow steps at 752–859, 2472 coincide ..." → [(752, 859), (2472, 2472)]."""
    listed = re.search(r" at (?:steps )?(\d+(?:–\d+)?(?:, \d+(?:–\d+)?)*)", title)
    assert listed, title
    out = []
    for part in listed.group(1).split(", "):
        first, _, last = part.partition("–")
        out.append((int(first), int(last or first)))
    return out


def overlapped(spans: list[tuple[int, int]], title: str) -> list[tuple[int, int]]:
    """The *spans* (first, last step) that a range the title names overlaps."""
    named = named_ranges(title)
    return [(a, b) for a, b in spans if any(x <= b and a <= y for x, y in named)]
