"""A block of 2 Hz sample rows (``host_samples``, ``run_cpu_samples``) as
numpy columns (:class:`Samples`) and as one compressed value (a
``host_packs`` / ``run_cpu_packs`` ``data`` BLOB), and back, losslessly:
every value of every row, NULLs included, comes back as stored.

The layout is :mod:`gpuprofd.storage.stepcodec`'s: integer columns through
its :func:`~gpuprofd.storage.stepcodec.add_int_column` (evenly spaced times
and constant counts cost no array, the rest are deltas), float columns as
their IEEE-754 bits taken as int64 and delta-coded the same way (a reading
that changes little shares its high bytes with the one before), all split
into byte planes (:mod:`gpuprofd.storage.planes`) before zlib. A column
holding anything else (SQLite keeps what it is given) is kept as its JSON
list. Pure: no I/O.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage.stepcodec import (
    add_int_column,
    int64_column,
    read_frame,
    read_int_column,
    write_frame,
)

#: ``host_samples`` columns a pack holds (``boot_id`` is the pack's key), in row order.
HOST_COLUMNS = (
    "mono_ns",
    "cpu_pct",
    "cpu_count",
    "disk_read_bps",
    "disk_read_iops",
    "page_cache_bytes",
    "mem_total_bytes",
    "swap_in_bps",
)
#: ``run_cpu_samples`` columns a pack holds (``run_id`` is the pack's key).
RUN_CPU_COLUMNS = ("mono_ns", "cores")


def _floats(values: Sequence[Any], has_null: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """*values* (floats, None where *has_null*) as float64 and a NULL mask (None: no NULLs)."""
    if not has_null:
        return np.array(values, dtype=np.float64).reshape(len(values)), None
    mask = np.fromiter((v is None for v in values), bool, len(values))
    return np.array([0.0 if v is None else v for v in values], dtype=np.float64), mask


#: The value types of a column :func:`int64_column` may take, and of a float column.
_INT_KINDS = frozenset((int, bool, type(None)))
_FLOAT_KINDS = frozenset((float, type(None)))


@dataclass(repr=False)
class Samples:
    """Sample rows as columns, one entry per row, in time order."""

    names: tuple[str, ...]
    n: int
    ints: dict[str, np.ndarray] = field(default_factory=dict)
    """Integer column -> int64 (0 where NULL)."""
    floats: dict[str, np.ndarray] = field(default_factory=dict)
    """Float column -> float64 (0.0 where NULL)."""
    nulls: dict[str, np.ndarray] = field(default_factory=dict)
    """... -> bool, True where NULL (only the columns that have a NULL)."""
    objects: dict[str, list[Any]] = field(default_factory=dict)
    """The other columns, values as stored."""

    @classmethod
    def from_rows(cls, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> Samples:
        """Rows of *names*' values, as a database read returns them."""
        out = cls(tuple(names), len(rows))
        cols = list(zip(*rows, strict=True)) if rows else [()] * len(names)
        for name, values in zip(names, cols, strict=True):
            kinds = set(map(type, values))  # one pass in C: a 2 Hz day is 172,800 values
            if kinds <= _INT_KINDS and (got := int64_column(values)) is not None:
                out.ints[name] = got[0]
            elif kinds and kinds <= _FLOAT_KINDS:
                got = _floats(values, type(None) in kinds)
                out.floats[name] = got[0]
            else:
                out.objects[name] = list(values)
                continue
            if got[1] is not None:
                out.nulls[name] = got[1]
        return out

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Samples({self.n} rows of {self.names})"

    def column(self, name: str) -> list[Any]:
        """Column *name* as a list of the stored values, None where NULL."""
        if name in self.objects:
            return list(self.objects[name])
        arr = self.ints[name] if name in self.ints else self.floats[name]
        out: list[Any] = arr.tolist()
        nulls = self.nulls.get(name)
        if nulls is not None:
            for i in np.flatnonzero(nulls).tolist():
                out[i] = None
        return out

    def numbers(self, name: str) -> np.ndarray:
        """Column *name* as float64, NaN where NULL (or not a number)."""
        if name in self.objects:
            vals = self.objects[name]
            return np.array(
                [v if type(v) in (int, float) else np.nan for v in vals], np.float64
            ).reshape(len(vals))
        arr = self.ints[name] if name in self.ints else self.floats[name]
        out = arr.astype(np.float64)
        if name in self.nulls:
            out[self.nulls[name]] = np.nan
        return out

    def times(self) -> np.ndarray:
        """``mono_ns`` as int64 (a read never holds a sample without one)."""
        if "mono_ns" in self.ints:
            return self.ints["mono_ns"]
        return np.array(self.column("mono_ns"), np.int64).reshape(self.n)

    def rows(self) -> list[tuple[Any, ...]]:
        """The rows, tuples in :attr:`names`' order."""
        return list(zip(*(self.column(c) for c in self.names), strict=True))

    def take(self, idx: np.ndarray) -> Samples:
        """The rows at the positions *idx* (int or bool array), in its order."""
        pick = np.arange(self.n)[idx].tolist()
        return Samples(
            self.names,
            len(pick),
            {k: v[idx] for k, v in self.ints.items()},
            {k: v[idx] for k, v in self.floats.items()},
            {k: v[idx] for k, v in self.nulls.items()},
            {k: [v[i] for i in pick] for k, v in self.objects.items()},
        )

    @classmethod
    def concat(cls, names: Sequence[str], parts: Sequence[Samples]) -> Samples:
        """*parts*' rows one after the other (an empty :class:`Samples` of *names* if none)."""
        if len(parts) == 1:
            return parts[0]
        out = cls(tuple(names), sum(p.n for p in parts))
        for name in names:
            kinds = {("i" if name in p.ints else "f" if name in p.floats else "o") for p in parts}
            if kinds == {"i"} or kinds == {"f"}:
                table = out.ints if kinds == {"i"} else out.floats
                table[name] = np.concatenate(
                    [(p.ints if name in p.ints else p.floats)[name] for p in parts]
                )
                if any(name in p.nulls for p in parts):
                    out.nulls[name] = np.concatenate(
                        [p.nulls.get(name, np.zeros(p.n, bool)) for p in parts]
                    )
            elif parts:
                out.objects[name] = [v for p in parts for v in p.column(name)]
            else:
                out.ints[name] = np.zeros(0, np.int64)
        return out


def encode(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    """The ``data`` of a pack of *rows* (tuples of *names*' values).

    Raises:
        ValueError: a value neither a number nor JSON.
    """
    return pack(Samples.from_rows(names, rows))


def pack(cols: Samples) -> bytes:
    """*cols* as one compressed value (see the module doc).

    Raises:
        ValueError: an object column that is not JSON.
    """
    meta: list[list[Any]] = []  # [name, kind, has_mask, extra]
    arrays: list[np.ndarray] = []
    for name in cols.names:
        if name in cols.ints:
            add_int_column(meta, arrays, name, cols.ints[name], cols.nulls.get(name), True)
        elif name in cols.floats:
            bits = cols.floats[name].view(np.int64)
            add_int_column(meta, arrays, name, bits, cols.nulls.get(name), True)
            meta[-1][1] = "f" + meta[-1][1]  # read back as float64 bits
        else:
            try:
                meta.append([name, "j", False, orjson.dumps(cols.objects[name]).decode()])
            except TypeError as exc:
                raise ValueError(f"column {name} holds a value that is not JSON ({exc})") from None
    return write_frame(cols.n, meta, arrays)


def unpack(data: bytes) -> Samples:
    """The columns of a pack's ``data``, rows in the order encoded.

    Raises:
        DatabaseError: *data* is damaged or of an unknown format.
    """
    try:
        return _unpack(data)
    except (zlib.error, struct.error, ValueError, KeyError, IndexError, TypeError) as exc:
        raise DatabaseError(f"a packed block of samples is damaged ({exc})") from None


def _unpack(data: bytes) -> Samples:
    head, take = read_frame(data, "sample")
    n = int(head["n"])
    out = Samples(tuple(c[0] for c in head["cols"]), n)
    for name, kind, has_mask, extra in head["cols"]:
        if kind == "j":
            values = orjson.loads(extra)
            if type(values) is not list or len(values) != n:
                raise ValueError(f"column {name} of another length")
            out.objects[name] = values
            continue
        arr, mask = read_int_column(kind.lstrip("f"), has_mask, extra, n, take)
        if kind.startswith("f"):
            out.floats[name] = arr.view(np.float64)
        else:
            out.ints[name] = arr
        if mask is not None:
            out.nulls[name] = mask
    return out
