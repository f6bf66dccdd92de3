"""The shape of a run's slow steps: at a regular interval, or in bursts.

Pure functions over step numbers (0-based positions in the run's timed
steps, as :class:`gpuprof.insights.base.RunContext` holds them).
"""

from __future__ import annotations

from collections.abc import Sequence

#: Share of the steps on the interval's lattice (every N-th step from the
#: first slow one on it to the last) that must be slow: a checkpoint every 20
#: steps is slow each time; a lattice a burst happens to touch is not.
PERIODIC_LATTICE_SHARE = 0.75
#: Share of all slow steps (or of their lost time) the lattice must hold: a
#: few extra slow steps (a GC pause, a neighbour's burst of CPU) do not hide
#: the period, but a run whose slow steps are mostly elsewhere is not periodic.
PERIODIC_SLOW_SHARE = 0.5
#: Slow steps on the lattice needed to call it periodic.
PERIODIC_MIN_SLOW = 3
#: Bursts named in a finding's title; more are counted, not listed.
MAX_BURSTS_NAMED = 6
#: Fast steps between two slow ones that still leave them one burst. Within
#: a burst of load a busy host's scheduler lets some steps run a whole time
#: slice unpreempted: 3 busy processes per core over 2 ms steps left runs of
#: 2-3 fast steps between the slow ones, and one burst read as dozens.
#: Five or more fast steps apart, slow steps are separate bursts
#: (the issue's GPT run: 22, 29–32, 38).
BURST_JOIN_FAST_STEPS = 4


def _gaps(steps: Sequence[int]) -> set[int]:
    return {b - a for a, b in zip(steps, steps[1:], strict=False) if b - a >= 2}


def _lattice_hold(
    slow: Sequence[int], weights: Sequence[float], gap: int
) -> tuple[int, int, float, float]:
    """(slow steps on the heaviest lattice of *gap*, the lattice's length
    between them, the weight they hold, the share of the other steps in that
    span that are slow too)."""
    by_residue: dict[int, float] = {}
    for s, w in zip(slow, weights, strict=True):
        by_residue[s % gap] = by_residue.get(s % gap, 0.0) + w
    residue = max(by_residue, key=lambda r: (by_residue[r], -r))
    on = [s for s in slow if s % gap == residue]
    lattice = (on[-1] - on[0]) // gap + 1
    between = on[-1] - on[0] + 1 - lattice
    off = sum(1 for s in slow if on[0] <= s <= on[-1] and s % gap != residue)
    return len(on), lattice, by_residue[residue], off / between if between else 0.0


def period(slow: Sequence[int], excess: Sequence[float] | None = None) -> int | None:
    """The interval N (≥ 2) at which the sorted step numbers *slow* recur,
    else None. Candidates are the gaps of at least 2 between consecutive slow
    steps, and between the slowest quarter of them (by *excess*); on N's
    lattice (the step numbers mod N that hold the most), the slow steps must
    number ≥ :data:`PERIODIC_MIN_SLOW`, fill ≥ :data:`PERIODIC_LATTICE_SHARE`
    of the lattice's steps between the first and the last of them (while at
    most 1 − that share of the other steps there are slow), and hold
    ≥ :data:`PERIODIC_SLOW_SHARE` of *slow* (of their *excess*, when given:
    the time each slow step lost, ms, so a few long periodic stalls outweigh
    many short jitters on a busy host). The candidate holding most wins."""
    if len(slow) < PERIODIC_MIN_SLOW:
        return None
    weights = [float(w) for w in excess] if excess is not None else [1.0] * len(slow)
    heavy_from = sorted(weights)[(3 * len(weights)) // 4]
    heavy = [s for s, w in zip(slow, weights, strict=True) if w >= heavy_from]
    total = sum(weights)
    best: tuple[float, int] | None = None
    for gap in sorted(_gaps(slow) | _gaps(heavy)):
        n, lattice, held, off = _lattice_hold(slow, weights, gap)
        if n < PERIODIC_MIN_SLOW or n < PERIODIC_LATTICE_SHARE * lattice:
            continue
        if off > 1 - PERIODIC_LATTICE_SHARE:  # the steps between are slow too: a burst
            continue
        if held >= PERIODIC_SLOW_SHARE * total and (best is None or held > best[0]):
            best = (held, gap)
    return best[1] if best is not None else None


def bursts(slow: Sequence[int]) -> list[tuple[int, int]]:
    """The sorted step numbers *slow* as runs of consecutive steps, each
    ``(first, last)``; slow steps with at most :data:`BURST_JOIN_FAST_STEPS`
    fast steps between them join one burst."""
    out: list[list[int]] = []
    for s in slow:
        if out and s - out[-1][1] <= BURST_JOIN_FAST_STEPS + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return [(a, b) for a, b in out]


def burst_loss(
    runs: Sequence[tuple[int, int]], slow: Sequence[int], excess: Sequence[float]
) -> list[float]:
    """Per burst of *runs* (:func:`bursts` of the sorted *slow*), the time its
    slow steps lost: the sum of their *excess* (ms each, one per slow step)."""
    lost = [0.0] * len(runs)
    k = 0
    for s, w in zip(slow, excess, strict=True):
        while runs[k][1] < s:
            k += 1
        lost[k] += float(w)
    return lost


def heaviest(
    runs: Sequence[tuple[int, int]], lost: Sequence[float], n: int
) -> list[tuple[int, int]]:
    """The *n* bursts of *runs* that lost the most time (*lost*, one per burst;
    ties to the earlier), in step order."""
    top = sorted(range(len(runs)), key=lambda i: (-lost[i], i))[:n]
    return [runs[i] for i in sorted(top)]


def bursts_text(runs: Sequence[tuple[int, int]], lost: Sequence[float] | None = None) -> str:
    """``22, 29–32, 38``: at most :data:`MAX_BURSTS_NAMED`, in step order. With
    *lost* (the time each burst lost, :func:`burst_loss`) the heaviest are
    named, then ``and N smaller``; without, the first, then ``and N more``."""
    if lost is None:
        named, tail = list(runs[:MAX_BURSTS_NAMED]), "more"
    else:
        named, tail = heaviest(runs, lost, MAX_BURSTS_NAMED), "smaller"
    words = [f"{a}" if a == b else f"{a}–{b}" for a, b in named]
    left = len(runs) - len(named)
    return ", ".join(words) + (f" and {left} {tail}" if left > 0 else "")
