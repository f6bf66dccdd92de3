"""Small statistics used by the rules, the summary and the run compare
(pure, no numpy): order statistics, and the speed-up of one run over another
with its confidence interval (:func:`speed_ratio`)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def median(values: Sequence[float]) -> float:
    """Median of *values*.

    Raises:
        ValueError: if *values* is empty.
    """
    return percentile(values, 50.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100) with linear interpolation between ranks
    (numpy's default ``linear`` method).

    Raises:
        ValueError: if *values* is empty or *q* is outside 0-100.
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean. Raises ValueError if *values* is empty."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return math.fsum(values) / len(values)


#: Confidence of the interval on the speed-up.
CONFIDENCE = 0.95
#: Bootstrap resamples: with 2,000, the interval's ends move by about 2 % of
#: its width from one seed to another (standard deviation over 20 seeds, two
#: runs of 200 steps).
RESAMPLES = 2000
#: The bootstrap's seed: the same two runs always give the same interval.
SEED = 0
#: A long run's steps are cut into at most this many contiguous blocks and
#: the blocks resampled (their sums and counts): the point estimate stays
#: the exact mean, the bootstrap costs the same for a day-long run as for
#: 500 steps (about 0.2 s on one core), and neighbouring steps, which move
#: together (a busy minute, a slow file), stay together.
MAX_BLOCKS = 500
#: Fewer steady steps than this in either run: no interval (a percentile
#: bootstrap of a handful of values gives one far too narrow).
MIN_STEPS = 10


@dataclass(frozen=True)
class SpeedRatio:
    """How much faster B is than A, per unit of work (:func:`speed_ratio`)."""

    speedup: float
    """A's mean time per unit / B's: 2.0 is B twice as fast, 0.5 half as fast."""
    low: float | None
    """Lower end of the :data:`CONFIDENCE` interval on :attr:`speedup`; None
    with fewer than :data:`MIN_STEPS` steps in either run."""
    high: float | None
    """Upper end of the interval; None as :attr:`low`."""
    within_noise: bool | None
    """The interval holds 1 (no difference beyond the step-to-step noise of
    the two runs); None without an interval."""
    steps_a: int
    steps_b: int


def _blocks(values: Sequence[float]) -> list[tuple[float, int]]:
    """(sum, count) of each of at most :data:`MAX_BLOCKS` contiguous blocks
    of *values*, of sizes differing by at most one."""
    n = len(values)
    k = min(n, MAX_BLOCKS)
    bounds = [i * n // k for i in range(k + 1)]
    return [(math.fsum(values[lo:hi]), hi - lo) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def _resampled_mean(rng: random.Random, blocks: list[tuple[float, int]]) -> float:
    picked = rng.choices(blocks, k=len(blocks))
    return math.fsum(s for s, _ in picked) / sum(c for _, c in picked)


def speed_ratio(
    a_ms: Sequence[float], b_ms: Sequence[float], units_a: float = 1.0, units_b: float = 1.0
) -> SpeedRatio:
    """B's speed-up over A from their iteration times (ms), with a
    :data:`CONFIDENCE` interval: a bootstrap (:data:`RESAMPLES` resamples,
    seed :data:`SEED`, percentile interval) of the ratio of the two means,
    each run's steps resampled in contiguous blocks (:data:`MAX_BLOCKS`).

    *units_a* / *units_b*: the work one iteration of each does (samples,
    tokens; 1: compared per iteration); the speed-up is per unit of work.
    The interval covers the noise between steps of the two runs, not what
    varies from one launch to the next (another node, another data order).

    Raises:
        ValueError: either run has no iterations, a mean that is not
            positive, or units that are not positive.
    """
    if not a_ms or not b_ms:
        raise ValueError("a speed ratio needs iterations in both runs")
    if units_a <= 0 or units_b <= 0:
        raise ValueError(f"units per iteration must be positive, got {units_a} and {units_b}")
    mean_a, mean_b = mean(a_ms), mean(b_ms)
    if mean_a <= 0 or mean_b <= 0:
        raise ValueError("a speed ratio needs positive iteration times")
    scale = units_b / units_a
    point = mean_a / mean_b * scale
    if min(len(a_ms), len(b_ms)) < MIN_STEPS:
        return SpeedRatio(point, None, None, None, len(a_ms), len(b_ms))
    rng = random.Random(SEED)
    blocks_a, blocks_b = _blocks(a_ms), _blocks(b_ms)
    ratios = sorted(
        _resampled_mean(rng, blocks_a) / _resampled_mean(rng, blocks_b) * scale
        for _ in range(RESAMPLES)
    )
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = percentile(ratios, tail), percentile(ratios, 100 - tail)
    return SpeedRatio(point, low, high, low <= 1.0 <= high, len(a_ms), len(b_ms))
