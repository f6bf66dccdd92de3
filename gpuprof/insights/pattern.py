"""The shape of a run's slow steps: at a regular interval, or in bursts.

Pure functions over step numbers (0-based positions in the run's timed
steps, as :class:`gpuprof.insights.base.RunContext` holds them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

#: Share of the gaps between consecutive slow steps that must equal one
#: interval for the slow steps to be periodic: one extra slow step (a GC
#: pause) among every-20th-step checkpoints breaks two gaps of ~10.
PERIODIC_GAP_SHARE = 0.75
#: Slow steps needed to call a pattern periodic: two gaps agreeing.
PERIODIC_MIN_SLOW = 3
#: Bursts named in a finding's title; more are counted, not listed.
MAX_BURSTS_NAMED = 6


def period(slow: Sequence[int]) -> int | None:
    """The interval N (≥ 2) at which the sorted step numbers *slow* recur —
    at least :data:`PERIODIC_GAP_SHARE` of their gaps equal N — else None
    (fewer than :data:`PERIODIC_MIN_SLOW` slow steps, or no such interval)."""
    if len(slow) < PERIODIC_MIN_SLOW:
        return None
    gaps = [b - a for a, b in zip(slow, slow[1:], strict=False)]
    gap, count = Counter(gaps).most_common(1)[0]
    if gap < 2 or count < PERIODIC_GAP_SHARE * len(gaps):
        return None
    return gap


def bursts(slow: Sequence[int]) -> list[tuple[int, int]]:
    """The sorted step numbers *slow* as runs of consecutive steps, each
    ``(first, last)``; steps one apart (a fast step between two slow ones)
    join one burst."""
    out: list[list[int]] = []
    for s in slow:
        if out and s - out[-1][1] <= 2:
            out[-1][1] = s
        else:
            out.append([s, s])
    return [(a, b) for a, b in out]


def bursts_text(runs: Sequence[tuple[int, int]]) -> str:
    """``22, 29–32, 38`` (at most :data:`MAX_BURSTS_NAMED`, then ``and N more``)."""
    named = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:MAX_BURSTS_NAMED]]
    more = len(runs) - MAX_BURSTS_NAMED
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")
