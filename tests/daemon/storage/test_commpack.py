"""A step's bucket rows packed into one value and back (gpuprofd.storage.commpack)."""

from __future__ import annotations

import random
import zlib

import pytest

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import commpack


def test_rows_come_back_as_given_nulls_and_extremes_included() -> None:
    rnd = random.Random(7)
    rows = [
        (b, rnd.randrange(2**63), rnd.randrange(2**63), rnd.randrange(2**50)) for b in range(300)
    ]
    rows[5] = (5, None, 0, None)  # a team server's row may lack values
    rows[6] = (0, 2**63 - 1, 0, 0)  # out of order, largest value
    got = commpack.bucket_rows([(42, commpack.pack(rows))])
    assert got == [(42, *r) for r in rows]


def test_a_step_row_carries_its_first_launch_count_and_bytes() -> None:
    rows = [(1, 500, 700, 10), (0, 300, 900, None), (2, None, None, 5)]
    run_id, step, start, n, total, packed = commpack.step_row(9, 3, rows)
    assert (run_id, step, start, n, total) == (9, 3, 300, 3, 15)
    assert commpack.bucket_rows([(step, packed)]) == [(3, *r) for r in rows]
    assert commpack.step_row(9, 4, [(0, None, None, None)])[2:5] == (0, 1, 0)


def test_a_regular_step_packs_small() -> None:
    """280 buckets launched as the backward goes (jittered by up to 50 us)."""
    rnd = random.Random(1)
    rows = [
        (
            b,
            10**12 + b * 1_000_000 + rnd.randrange(50_000),
            10**12 + b * 1_000_000 + 4_000_000,
            25 * 2**20,
        )
        for b in range(280)
    ]
    packed = commpack.pack(rows)
    assert len(packed) < 280 * 4  # vs 280 rows of ~50 bytes each, stored one a row
    assert [r[1:] for r in commpack.bucket_rows([(0, packed)])] == rows


def test_steps_are_grouped_in_the_order_given() -> None:
    rows = [(1, 0, 10, 20, 5), (2, 0, 30, 40, 5), (1, 1, 11, 21, 6)]
    got = commpack.step_rows(8, rows)
    assert [(r[0], r[1], r[3], r[4]) for r in got] == [(8, 1, 2, 11), (8, 2, 1, 5)]


@pytest.mark.parametrize(
    "rows",
    [[(0, -2, 0, 0)], [(0, 2**63, 0, 0)], [(0, 1, 2)], [(0, -1, 0, 0)], [(0, -1, None, 0)]],
)
def test_values_outside_the_protocol_are_refused(rows: list) -> None:
    with pytest.raises(ValueError, match="bucket"):
        commpack.pack(rows)


@pytest.mark.parametrize(
    "packed",
    [b"", b"\x02" + zlib.compress(b"\0" * 32), b"\x01not zlib", b"\x01" + zlib.compress(b"1234")],
)
def test_a_corrupt_value_is_a_clear_error(packed: bytes) -> None:
    with pytest.raises(DatabaseError, match="packed bucket value"):
        commpack.bucket_rows([(0, packed)])
