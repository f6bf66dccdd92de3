"""int64 numbers as byte planes, the layout both packed formats compress
(:mod:`gpuprofd.storage.stepcodec`'s step blocks and
:mod:`gpuprofd.storage.commpack`'s bucket rows).

The 8 bytes of each little-endian int64 are stored apart: all first bytes,
then all second bytes, ... Figures that change slowly (deltas, ns times of
one run, byte counts) share their high bytes, so each high plane is a run
of one byte value that zlib all but removes. Pure: no I/O.
"""

from __future__ import annotations

import numpy as np


def to_planes(values: np.ndarray) -> bytes:
    """*values* (int64, any shape; read in C order) as 8 byte planes:
    ``8 * values.size`` bytes."""
    flat = np.ascontiguousarray(values, "<i8").reshape(-1)
    return flat.view(np.uint8).reshape(-1, 8).T.tobytes()


def from_planes(raw: bytes) -> np.ndarray:
    """The int64 values :func:`to_planes` was given, flat (1-D, C order).

    Raises:
        ValueError: *raw*'s length is not a multiple of 8.
    """
    if len(raw) % 8:
        raise ValueError(f"byte planes of {len(raw)} bytes: not a multiple of 8")
    planes = np.frombuffer(raw, np.uint8).reshape(8, -1)
    out: np.ndarray = planes.T.copy().view("<i8").reshape(-1)
    return out
