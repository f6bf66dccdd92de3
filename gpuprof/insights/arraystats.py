"""Order statistics of numpy columns with :mod:`gpuprof.stats`' exact
results: the same ranks and the same interpolation on the same Python
numbers, found by ``np.partition`` (linear time) instead of sorting a list
of a day's 172,800 Python numbers.

Pure; numpy is imported on first use (the training process imports
gpuprof too).
"""

from __future__ import annotations

import math
from typing import Any


def percentile(values: Any, q: float) -> float:
    """:func:`gpuprof.stats.percentile` of *values* (a 1-d numpy array of
    int64 or float64, no NaN: the caller leaves out what is missing), the
    same value: the two neighbouring ranks taken as Python numbers, then
    interpolated as that function does.

    Raises:
        ValueError: *values* is empty or *q* is outside 0-100.
    """
    import numpy as np

    n = len(values)
    if not n:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    pos = (n - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    part = np.partition(np.asarray(values), [lo, hi] if hi != lo else lo)
    a, b = part[lo].item(), part[hi].item()
    return a + (b - a) * (pos - lo)  # type: ignore[no-any-return]


def median(values: Any) -> float:
    """:func:`gpuprof.stats.median` of *values* (see :func:`percentile`).

    Raises:
        ValueError: *values* is empty.
    """
    return percentile(values, 50.0)
