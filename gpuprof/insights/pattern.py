"""The shape of a run's slow steps: at a regular interval, or in bursts.

Pure functions over step numbers: the numbers the steps were recorded with
(:attr:`gpuprof.insights.base.RunContext.numbers`), which skip the steps
left out (traced) or lost on the way, so an interval is counted in the
run's own steps, not in the positions of the steps kept.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

#: Share of the steps on the interval's lattice (every N-th step, over the
#: whole steady run) that must be slow: a checkpoint every 20 steps is slow
#: each time; a lattice a burst happens to touch is not.
PERIODIC_LATTICE_SHARE = 0.75
#: Share of all slow steps (or of their lost time) the lattice must hold: a
#: few extra slow steps (a GC pause, a neighbour's burst of CPU) do not hide
#: the period, but a run whose slow steps are mostly elsewhere is not periodic.
PERIODIC_SLOW_SHARE = 0.5
#: Slow steps on the lattice (repetitions) needed to call it periodic: three
#: slow steps N apart are as often chance (three GC pauses) as a schedule.
PERIODIC_MIN_REPEATS = 4
#: Longest stretch of the lattice without its slow step, as a share of the
#: lattice's steps (at least one step may always be missed): periodic work
#: recurs from the start of the steady run to its end, so slow steps every N
#: steps in one part of the run only (a busy host's episode, an evaluation
#: phase) are not it.
PERIODIC_MAX_MISSED_SHARE = 0.1
#: Bursts named in a finding's title; more are counted, not listed.
MAX_BURSTS_NAMED = 6
#: Fast steps between two slow ones that still leave them one burst. Within
#: a burst of load a busy host's scheduler lets some steps run a whole time
#: slice unpreempted: 3 busy processes per core over 2 ms steps left runs of
#: 2-3 fast steps between the slow ones, and one burst read as dozens.
#: Five or more fast steps apart, slow steps are separate bursts
#: (the issue's GPT run: 22, 29–32, 38).
BURST_JOIN_FAST_STEPS = 4


class Period(NamedTuple):
    """Slow steps at a regular interval over the whole steady run."""

    every: int
    """The interval N, in steps."""
    phase: int
    """The step numbers mod N that are slow."""
    repeats: int
    """Slow steps on the lattice (every N-th step of the steady run)."""
    lattice: int
    """Steps on the lattice that ran (and were timed)."""


def _gaps(steps: Sequence[int]) -> set[int]:
    return {b - a for a, b in zip(steps, steps[1:], strict=False) if b - a >= 2}


def _longest_missed(lattice: Sequence[int], slow: set[int]) -> int:
    """The most consecutive steps of *lattice* not in *slow*."""
    longest = run = 0
    for s in lattice:
        run = 0 if s in slow else run + 1
        longest = max(longest, run)
    return longest


def _fit(
    slow: Sequence[int], weights: Sequence[float], steps: Sequence[int], known: set[int], gap: int
) -> tuple[Period, float] | None:
    """*gap*'s heaviest lattice (the residue mod *gap* whose slow steps weigh
    most: every step of *steps*, the sorted numbers of which *known* is the
    set, with that residue) as a :class:`Period` with the weight its slow
    steps hold, if it spans the whole run (see :func:`period`); else None."""
    by_residue: dict[int, float] = {}
    for s, w in zip(slow, weights, strict=True):
        by_residue[s % gap] = by_residue.get(s % gap, 0.0) + w
    residue = max(by_residue, key=lambda r: (by_residue[r], -r))
    if (steps[-1] - steps[0]) // gap <= len(known):
        first = steps[0] + (residue - steps[0]) % gap
        lattice = [s for s in range(first, steps[-1] + 1, gap) if s in known]
    else:  # numbers far apart (a jump, a stride): walk the steps, not the span
        lattice = sorted(s for s in known if s % gap == residue)
    on = {s for s in slow if s % gap == residue} & known
    if not lattice or len(on) < PERIODIC_LATTICE_SHARE * len(lattice):
        return None
    if _longest_missed(lattice, on) > max(1, int(PERIODIC_MAX_MISSED_SHARE * len(lattice))):
        return None
    lo, hi = lattice[0], lattice[-1]
    between = bisect.bisect_right(steps, hi) - bisect.bisect_left(steps, lo) - len(lattice)
    off = sum(1 for s in slow if lo <= s <= hi and s % gap != residue)
    if between and off / between > 1 - PERIODIC_LATTICE_SHARE:
        return None  # the steps between are slow too: a burst
    return Period(gap, residue, len(on), len(lattice)), by_residue[residue]


def period(
    slow: Sequence[int],
    steps: Sequence[int],
    excess: Sequence[float] | None = None,
    min_repeats: int = PERIODIC_MIN_REPEATS,
) -> Period | None:
    """The interval at which the sorted step numbers *slow* recur through the
    whole of *steps* (the sorted numbers of the steps they are among: the
    steady run, gaps where steps were lost or left out), else None.

    Candidates N are the gaps of at least 2 between consecutive slow steps,
    and between the slowest quarter of them (by *excess*). N's lattice is
    every step of *steps* whose number mod N is the residue the slow steps
    weigh most on: from near the first of *steps* to near the last, with no
    drift of the phase. On it the slow steps must number ≥ *min_repeats*
    (:data:`PERIODIC_MIN_REPEATS` by default), fill ≥
    :data:`PERIODIC_LATTICE_SHARE` of it and miss no stretch longer than
    :data:`PERIODIC_MAX_MISSED_SHARE` of it, while at most 1 − that share of
    the other steps there are slow; and they must hold ≥
    :data:`PERIODIC_SLOW_SHARE` of *slow* (of their *excess*, when given: the
    time each slow step lost, ms, so a few long periodic stalls outweigh many
    short jitters on a busy host). The candidate holding most wins."""
    if len(slow) < max(min_repeats, 2) or not steps:
        return None
    known = set(steps)
    weights = [float(w) for w in excess] if excess is not None else [1.0] * len(slow)
    heavy_from = sorted(weights)[(3 * len(weights)) // 4]
    heavy = [s for s, w in zip(slow, weights, strict=True) if w >= heavy_from]
    total = sum(weights)
    span = steps[-1] - steps[0] + 1
    missing = span - len(known)
    best: tuple[float, Period] | None = None
    for gap in sorted(_gaps(slow) | _gaps(heavy)):
        # the fit's residue must hold that many slow steps (its lattice has at
        # least span // gap - missing steps): counted in C, this rules out most
        # gaps of a busy host's scattered slow steps before the weighted fit
        # (1M steps, 50k of them slow at random: 8.6 s -> 3.1 s, measured here)
        need = max(min_repeats, PERIODIC_LATTICE_SHARE * (span // gap - missing))
        if need > len(slow) or max(Counter(map(gap.__rmod__, slow)).values()) < need:
            continue
        fit = _fit(slow, weights, steps, known, gap)
        if fit is None or fit[0].repeats < min_repeats:
            continue
        found, held = fit
        if held >= PERIODIC_SLOW_SHARE * total and (best is None or held > best[0]):
            best = (held, found)
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
