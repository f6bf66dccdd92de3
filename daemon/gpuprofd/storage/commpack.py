"""A step's DDP bucket rows packed into one ``comm_steps`` row, and back.

Under DDP a step times each gradient bucket's all-reduce: a row
``(bucket, start_ns, end_ns, bytes)`` per bucket, 280 of them a step for a
mid-size model. Stored one database row each, a kept step cost ~14 KB; packed,
each column is delta-coded down the step's buckets (indices step by one,
launches and completions by the backward's pace, sizes repeat), the int64
deltas split into byte planes (:mod:`gpuprofd.storage.planes`: their high
bytes are zero) and zlib-compressed: ~1 KB a step, lossless (every value,
NULL included, comes back as stored).

Pure: no I/O. The writers store :func:`step_row`; every reader of a run's
buckets unpacks with :func:`unpack` (through ``gpuprofd.storage.reads``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage.planes import from_planes, to_planes

#: The packed format's first byte (a later format gets another).
FORMAT = 1
#: A NULL in a bucket row (the protocol's values are all >= 0).
_NULL = -1
#: Columns of a bucket row.
COLUMNS = ("bucket", "start_ns", "end_ns", "bytes")
_WIDTH = len(COLUMNS)

#: ``comm_steps`` columns in :func:`step_row` order.
STEP_COLUMNS = ("run_id", "step", "start_ns", "buckets", "bytes", "packed")
INSERT_SQL = (
    f"INSERT INTO comm_steps ({', '.join(STEP_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(STEP_COLUMNS))})"
)


class PackError(DatabaseError):
    """A ``packed`` value this code cannot read (another format, corrupt)."""


def pack(rows: Sequence[Sequence[int | None]]) -> bytes:
    """*rows* ``(bucket, start_ns, end_ns, bytes)`` (ints in [0, 2**63) or
    None) as the bytes :func:`unpack` reads back.

    Raises:
        ValueError: a row of another width, or a value out of that range.
    """
    if any(len(r) != _WIDTH for r in rows):
        raise ValueError(f"a bucket row has {_WIDTH} values: {COLUMNS}")
    nulls = False
    try:
        try:
            a = np.array(rows, dtype=np.int64).reshape(-1, _WIDTH)
        except TypeError:  # a None among them: stored as -1, below any value
            nulls = True
            if any(v is not None and v < 0 for r in rows for v in r):
                raise ValueError("bucket values are >= 0") from None
            flat = [[_NULL if v is None else v for v in r] for r in rows]
            a = np.array(flat, dtype=np.int64).reshape(-1, _WIDTH)
    except OverflowError:
        raise ValueError("bucket values are < 2**63") from None
    if not nulls and (a < 0).any():
        raise ValueError("bucket values are >= 0")
    a = a.T  # (columns, buckets)
    deltas = np.diff(a, axis=1, prepend=np.zeros((_WIDTH, 1), np.int64))  # wraps: lossless
    return bytes([FORMAT]) + zlib.compress(to_planes(deltas), 6)


def unpack(packed: Any) -> np.ndarray:
    """The rows :func:`pack` was given, as an int64 array (buckets, 4): NULL is -1.

    Raises:
        PackError: not a packed value of this format (nor bytes at all).
    """
    if not isinstance(packed, bytes | bytearray | memoryview):
        raise PackError(f"not a packed bucket value (a {type(packed).__name__})")
    packed = bytes(packed)
    if not packed or packed[0] != FORMAT:
        raise PackError(f"not a packed bucket value (format {packed[:1]!r})")
    try:
        raw = zlib.decompress(packed[1:])
    except zlib.error as exc:
        raise PackError(f"corrupt packed bucket value ({exc})") from None
    if len(raw) % (8 * _WIDTH):
        raise PackError("corrupt packed bucket value (length)")
    deltas = from_planes(raw).reshape(_WIDTH, -1)
    return np.cumsum(deltas, axis=1, dtype=np.int64).T


def step_row(run_id: int, step: int, rows: Sequence[Sequence[int | None]]) -> tuple[Any, ...]:
    """One ``comm_steps`` row (:data:`STEP_COLUMNS` order) for a step's bucket rows.

    Raises:
        ValueError: as :func:`pack`.
    """
    starts = [r[1] for r in rows if r[1] is not None]
    total = sum(r[3] for r in rows if r[3] is not None)
    return (run_id, step, min(starts, default=0), len(rows), total, pack(rows))


def step_rows(run_id: int, rows: Iterable[Sequence[int | None]]) -> list[tuple[Any, ...]]:
    """``comm_steps`` rows from bucket rows ``(step, bucket, start_ns, end_ns,
    bytes)``: one per step, its buckets in the order given.

    Raises:
        ValueError: as :func:`pack`.
    """
    by_step: dict[int, list[Sequence[int | None]]] = {}
    for r in rows:
        by_step.setdefault(int(r[0]), []).append(r[1:])  # type: ignore[arg-type]
    return [step_row(run_id, step, buckets) for step, buckets in by_step.items()]


def bucket_rows(stored: Iterable[Sequence[Any]]) -> list[tuple[int | None, ...]]:
    """``(step, bucket, start_ns, end_ns, bytes)`` rows (NULL: None) from
    ``comm_steps`` ``(step, packed)`` rows, in their order.

    Raises:
        PackError: a ``packed`` value this code cannot read.
    """
    out: list[tuple[int | None, ...]] = []
    for step, packed in stored:
        out.extend(step_buckets(step, packed))
    return out


def step_buckets(step: int, packed: Any) -> list[tuple[int | None, ...]]:
    """:func:`bucket_rows` of one ``comm_steps`` row.

    Raises:
        PackError: a ``packed`` value this code cannot read.
    """
    a = unpack(packed)
    cols: list[list[Any]] = a.T.tolist()
    if (a == _NULL).any():
        cols = [[None if v == _NULL else v for v in c] for c in cols]
    return list(zip(repeat(step, len(a)), *cols, strict=True))
