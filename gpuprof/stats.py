"""Small order statistics used by the rules and the summary (pure, no numpy)."""

from __future__ import annotations

import math
from collections.abc import Sequence


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
