"""Byte planes (gpuprofd.storage.planes): each int64's byte k goes to plane
k, and back, for any int64 value."""

from __future__ import annotations

import numpy as np
import pytest

from gpuprofd.storage.planes import from_planes, to_planes


def test_each_byte_of_a_value_goes_to_its_own_plane() -> None:
    raw = to_planes(np.array([1, 256, -1], np.int64))
    assert len(raw) == 24
    assert raw[0:3] == bytes([1, 0, 255])  # plane 0: the low bytes
    assert raw[3:6] == bytes([0, 1, 255])  # plane 1
    assert raw[21:24] == bytes([0, 0, 255])  # plane 7: the high bytes


def test_planes_give_back_every_int64_in_c_order() -> None:
    rng = np.random.default_rng(7)
    values = rng.integers(-(2**63), 2**63 - 1, size=(3, 50), dtype=np.int64, endpoint=True)
    values[0, :2] = [-(2**63), 2**63 - 1]
    back = from_planes(to_planes(values))
    assert back.dtype == np.int64 and back.tolist() == values.reshape(-1).tolist()
    assert from_planes(to_planes(np.zeros(0, np.int64))).size == 0


def test_a_length_not_a_multiple_of_8_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of 8"):
        from_planes(b"\x00" * 7)
