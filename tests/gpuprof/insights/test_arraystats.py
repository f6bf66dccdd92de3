"""The numpy order statistics give exactly gpuprof.stats' values (same
ranks, same interpolation, same Python number type) on the edge cases."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpuprof import stats
from gpuprof.insights import arraystats

CASES = [
    [5.0],
    [3, 1],
    [1.5, 1.5, 1.5],
    [10**18, 3, 10**18 - 1, 7],  # int64 ns: no rounding through float
    [0.1, 0.2, 0.30000000000000004, -1e300, 1e-300, 7.0],
    list(range(1000, 0, -1)),
    [random.Random(7).random() * 1e9 for _ in range(10_001)],
]


@pytest.mark.parametrize("values", CASES)
@pytest.mark.parametrize("q", [0.0, 12.5, 50.0, 90.0, 99.0, 100.0])
def test_percentile_is_the_lists(values: list[float], q: float) -> None:
    want = stats.percentile(values, q)
    got = arraystats.percentile(np.array(values), q)
    assert got == want and type(got) is type(want)


def test_median_of_an_even_count_interpolates() -> None:
    assert arraystats.median(np.array([4, 1, 3, 2])) == 2.5
    assert arraystats.median(np.array([1_000_000_000, 500_000_000], dtype=np.int64)) == 750_000_000


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        arraystats.median(np.zeros(0))
    with pytest.raises(ValueError, match="q must be"):
        arraystats.percentile(np.ones(3), 101.0)
