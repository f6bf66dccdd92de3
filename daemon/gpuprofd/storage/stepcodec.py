"""A block of ``steps`` rows as columns (:class:`Columns`, numpy) and as
one compressed value (a ``step_packs.data`` BLOB), and back, losslessly:
every column of every row, NULLs, the ``phases`` dict and the
``optimizers`` JSON text included.

Each integer column is an int64 array (a NULL mask beside it where it has
NULLs), ``phases`` one int64 array per phase name with a mask of the rows
that list it. Stored, the step index, times and memory figures are deltas
from the row before (small numbers), and the int64s are split into byte
planes (:mod:`gpuprofd.storage.planes`: the high bytes of ns figures are
nearly constant) before zlib. A column holding anything else than integers
(SQLite keeps what it is given) is kept as its list of values, and
``phases`` as dicts where one is not a flat ``{name: integer}`` object, so
nothing is ever lost to the encoding.

Rows are tuples in :data:`COLUMNS`' order; ``phases`` is the stored JSON
text on the way in (:meth:`Columns.from_rows`) and a dict (None: NULL) on
the way out (:meth:`Columns.rows`): the shape
:mod:`gpuprofd.storage.reads.steprows` gives every reader.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import orjson

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage.planes import from_planes, to_planes

#: A steps row's columns, in the order of the rows encoded and decoded.
COLUMNS = (
    "step",
    "t0_ns",
    "t1_ns",
    "wait_ns",
    "explicit",
    "micro",
    "phases",
    "skipped",
    "eval_ns",
    "optimizers",
    "mem_allocated_bytes",
    "mem_reserved_bytes",
    "mem_peak_bytes",
    "traced",
)
PHASES = COLUMNS.index("phases")
OPTIMIZERS = COLUMNS.index("optimizers")
#: The columns held as int64 where every value is an integer.
INTEGER_COLUMNS = tuple(c for c in COLUMNS if c not in ("phases", "optimizers"))
#: Integer columns stored as deltas from the row before (they change slowly).
_DELTA = frozenset({"step", "t0_ns", "t1_ns", "mem_allocated_bytes", "mem_reserved_bytes",
                    "mem_peak_bytes"})  # fmt: skip
_VERSION = 1
_HEAD = struct.Struct("<BI")  # format version, header length
_I64 = (-(2**63), 2**63 - 1)


def int64_column(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray | None] | None:
    """*values* as int64 and a NULL mask (None: no NULLs); None: not all integers."""
    try:  # numpy's own look at the types first: int64 only where every value is an int
        arr = np.array(values)
    except (OverflowError, ValueError):
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype in (np.int64, np.bool_) and len(arr):
        return arr.astype(np.int64, copy=False), None
    mask = None
    if None in values:
        mask = np.fromiter((v is None for v in values), bool, len(values))
        values = [0 if v is None else v for v in values]
    if not all(type(v) is int or type(v) is bool for v in values):
        return None
    if values and (min(values) < _I64[0] or max(values) > _I64[1]):
        return None
    return np.array(values, dtype=np.int64), mask


@dataclass(repr=False)
class Columns:
    """Steps as columns, one entry per row (see the module doc)."""

    n: int
    ints: dict[str, np.ndarray] = field(default_factory=dict)
    """Integer column -> int64 (0 where NULL)."""
    nulls: dict[str, np.ndarray] = field(default_factory=dict)
    """... -> bool, True where NULL (only the columns that have a NULL)."""
    objects: dict[str, list[Any]] = field(default_factory=dict)
    """The other columns (``optimizers`` always), values as stored."""
    phases: dict[str, np.ndarray] = field(default_factory=dict)
    """Phase name -> int64 ns (0 where the step does not list it), names in
    the order they first appear."""
    has_phase: dict[str, np.ndarray] = field(default_factory=dict)
    """Phase name -> bool: the step lists it."""
    phases_null: np.ndarray | None = None
    """bool: the step's ``phases`` is NULL (None: none is)."""
    phase_dicts: list[Any] | None = None
    """The ``phases`` as dicts (None: NULL) where they are not all flat
    integer objects (then :attr:`phases` is empty)."""

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[Sequence[Any]],
        phases: Callable[[Sequence[Any]], list[Any]] | None = None,
    ) -> Columns:
        """Rows in :data:`COLUMNS`' order, ``phases`` as its JSON text, each
        parsed by ``orjson.loads`` or, given, by *phases* (the column's
        texts -> their values, None where NULL).

        Raises:
            ValueError: a ``phases`` text is not JSON (without *phases*).
        """
        n = len(rows)
        cols = list(zip(*rows, strict=True)) if rows else [()] * len(COLUMNS)
        out = cls(n)
        for name, values in zip(COLUMNS, cols, strict=True):
            if name == "phases":
                if phases is not None:
                    out._set_phases(phases(values))
                else:
                    out._set_phases([None if t is None else orjson.loads(t) for t in values])
                continue
            got = None if name == "optimizers" else int64_column(values)
            if got is None:
                out.objects[name] = list(values)
            else:
                out.ints[name] = got[0]
                if got[1] is not None:
                    out.nulls[name] = got[1]
        return out

    def set_phases(self, dicts: list[Any]) -> None:
        """Replace the ``phases`` with *dicts* (one per row, None: NULL)."""
        self.phases, self.has_phase, self.phase_dicts = {}, {}, None
        self._set_phases(dicts)

    def _set_phases(self, dicts: list[Any]) -> None:
        n = self.n
        nulls = [d is None for d in dicts]
        self.phases_null = np.array(nulls, dtype=bool) if any(nulls) else None
        # rows listing the same names (a run's steps mostly do) go column-wise
        by_names: dict[tuple[str, ...], list[int]] = {}
        for i, d in enumerate(dicts):
            if type(d) is not dict:
                if d is not None:
                    self.phase_dicts = dicts
                    return
                continue
            by_names.setdefault(tuple(d), []).append(i)
        for names, where in by_names.items():
            values = [tuple(dicts[i].values()) for i in where]
            flat = [v for vs in values for v in vs]
            if not all(type(v) is int for v in flat) or (
                flat and (min(flat) < _I64[0] or max(flat) > _I64[1])
            ):
                self.phases, self.has_phase, self.phase_dicts = {}, {}, dicts
                return
            idx = np.array(where, dtype=np.int64)
            arr = np.array(values, dtype=np.int64).reshape(len(where), len(names))
            for j, key in enumerate(names):
                if key not in self.phases:
                    self.phases[key] = np.zeros(n, np.int64)
                    self.has_phase[key] = np.zeros(n, bool)
                self.phases[key][idx] = arr[:, j]
                self.has_phase[key][idx] = True

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:  # not numpy's print of every array (a day: 172,800 rows)
        return f"Columns({self.n} rows, phases {list(self.phases)})"

    def column(self, name: str) -> list[Any]:
        """Column *name* (not ``phases``) as a list, None where NULL."""
        if name in self.objects:
            return self.objects[name]
        out: list[Any] = self.ints[name].tolist()
        nulls = self.nulls.get(name)
        if nulls is not None:
            for i in np.flatnonzero(nulls).tolist():
                out[i] = None
        return out

    def phase_list(self) -> list[Any]:
        """Each row's ``phases`` as a dict (a new one per row), None where NULL."""
        if self.phase_dicts is not None:
            return list(self.phase_dicts)
        keys = list(self.phases)
        if keys and all(h.all() for h in self.has_phase.values()):
            values = zip(*(self.phases[k].tolist() for k in keys), strict=True)
            out: list[Any] = [dict(zip(keys, vs, strict=True)) for vs in values]
        else:
            out = [{} for _ in range(self.n)]
            for k in keys:
                vals = self.phases[k]
                for i in np.flatnonzero(self.has_phase[k]).tolist():
                    out[i][k] = int(vals[i])
        if self.phases_null is not None:
            for i in np.flatnonzero(self.phases_null).tolist():
                out[i] = None
        return out

    def rows(self) -> list[tuple[Any, ...]]:
        """The rows: tuples in :data:`COLUMNS`' order, ``phases`` a dict (None: NULL)."""
        cols = [self.phase_list() if c == "phases" else self.column(c) for c in COLUMNS]
        return list(zip(*cols, strict=True))

    def take(self, idx: np.ndarray) -> Columns:
        """The rows at the positions *idx* (int array), in its order."""
        pick = idx.tolist()
        return Columns(
            len(pick),
            {k: v[idx] for k, v in self.ints.items()},
            {k: v[idx] for k, v in self.nulls.items()},
            {k: [v[i] for i in pick] for k, v in self.objects.items()},
            {k: v[idx] for k, v in self.phases.items()},
            {k: v[idx] for k, v in self.has_phase.items()},
            None if self.phases_null is None else self.phases_null[idx],
            None if self.phase_dicts is None else [self.phase_dicts[i] for i in pick],
        )

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        """*parts*' rows one after the other."""
        if len(parts) == 1:
            return parts[0]
        n = sum(p.n for p in parts)
        out = cls(n)
        for name in INTEGER_COLUMNS + ("optimizers",):
            if any(name in p.objects for p in parts):
                out.objects[name] = list(chain.from_iterable(p.column(name) for p in parts))
                continue
            out.ints[name] = np.concatenate([p.ints[name] for p in parts])
            if any(name in p.nulls for p in parts):
                out.nulls[name] = np.concatenate(
                    [p.nulls.get(name, np.zeros(p.n, bool)) for p in parts]
                )
        if any(p.phase_dicts is not None for p in parts):
            out._set_phases([d for p in parts for d in p.phase_list()])
            return out
        for p in parts:
            for k in p.phases:
                out.phases.setdefault(k, np.zeros(0, np.int64))
        out.phases = {
            k: np.concatenate([p.phases.get(k, np.zeros(p.n, np.int64)) for p in parts])
            for k in out.phases
        }
        out.has_phase = {
            k: np.concatenate([p.has_phase.get(k, np.zeros(p.n, bool)) for p in parts])
            for k in out.phases
        }
        if any(p.phases_null is not None for p in parts):
            out.phases_null = np.concatenate(
                [p.phases_null if p.phases_null is not None else np.zeros(p.n, bool) for p in parts]
            )
        return out


def encode(rows: Sequence[Sequence[Any]]) -> bytes:
    """The ``step_packs.data`` of *rows* (tuples in :data:`COLUMNS`' order,
    ``phases`` and ``optimizers`` their stored JSON texts or None).

    Raises:
        ValueError: a ``phases`` text is not JSON.
    """
    return pack(Columns.from_rows(rows))


def add_int_column(
    meta: list[list[Any]],
    arrays: list[np.ndarray],
    name: str,
    arr: np.ndarray,
    mask: np.ndarray | None,
    delta: bool,
) -> None:
    """Append int64 column *name* (*mask*: True where NULL) to a pack being
    made: its ``[name, kind, has_mask, extra]`` to *meta*, its arrays to
    *arrays*. Evenly spaced (or constant) without NULLs: kind ``c``, no array;
    else kind ``i``, *delta*: stored as differences from the value before."""
    if len(arr) > 1 and mask is None:
        gaps = np.diff(arr)  # an array: wraps in int64 without a warning
        step = gaps[0]
        if (gaps == step).all():  # constant or evenly spaced: no array at all
            meta.append([name, "c", False, [int(arr[0]), int(step)]])
            return
    if delta and len(arr):
        arr = np.diff(arr, prepend=np.int64(0))  # wraps in int64: cumsum undoes it
    meta.append([name, "i", mask is not None, delta])
    arrays.append(arr)
    if mask is not None:
        arrays.append(mask.astype(np.int64))


def read_int_column(
    kind: str, has_mask: bool, extra: Any, n: int, take: Callable[[], np.ndarray]
) -> tuple[np.ndarray, np.ndarray | None]:
    """An int64 column :func:`add_int_column` stored (kind ``i`` or ``c``)
    and its NULL mask (None: none), its arrays read with *take*."""
    if kind == "c":  # first value, spacing
        first, step = (int(v) for v in extra)
        return first + step * np.arange(n, dtype=np.int64), None
    arr = take()
    if extra:
        arr = np.cumsum(arr, dtype=np.int64)
    return arr, (take().astype(bool) if has_mask else None)


def pack(cols: Columns) -> bytes:
    """*cols* as one compressed value (see the module doc)."""
    meta: list[list[Any]] = []  # [name, kind, has_mask, extra]
    arrays: list[np.ndarray] = []

    def add(name: str, arr: np.ndarray, mask: np.ndarray | None, delta: bool) -> None:
        add_int_column(meta, arrays, name, arr, mask, delta)

    for name in COLUMNS:
        if name == "phases":
            if cols.phase_dicts is not None:
                meta.append([name, "j", False, orjson.dumps(cols.phase_dicts).decode()])
                continue
            nulls = cols.phases_null
            meta.append([name, "p", nulls is not None, list(cols.phases)])
            if nulls is not None:
                arrays.append(nulls.astype(np.int64))
            for key, values in cols.phases.items():
                has = cols.has_phase[key]
                add(f"phases.{key}", values, None if has.all() else ~has, False)
        elif name in cols.objects:
            meta.append([name, "j", False, orjson.dumps(cols.objects[name]).decode()])
        else:
            add(name, cols.ints[name], cols.nulls.get(name), name in _DELTA)
    return write_frame(cols.n, meta, arrays)


def unpack(data: bytes) -> Columns:
    """The columns of a ``step_packs.data`` value, rows in the order encoded.

    Raises:
        DatabaseError: *data* is damaged or of an unknown format.
    """
    try:
        return _unpack(data)
    except (zlib.error, struct.error, ValueError, KeyError, IndexError, TypeError) as exc:
        raise DatabaseError(f"a packed block of steps is damaged ({exc})") from None


def decode(data: bytes) -> list[tuple[Any, ...]]:
    """The rows of a ``step_packs.data`` value (:meth:`Columns.rows`).

    Raises:
        DatabaseError: *data* is damaged or of an unknown format.
    """
    return unpack(data).rows()


def write_frame(n: int, meta: list[Any], arrays: Sequence[np.ndarray]) -> bytes:
    """A pack's bytes: its format version, a JSON head (*n* rows, the
    columns' *meta*) and the int64 *arrays* as byte planes, compressed (the
    frame of step and sample packs alike)."""
    body = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    head = orjson.dumps({"n": n, "cols": meta})
    return zlib.compress(_HEAD.pack(_VERSION, len(head)) + head + to_planes(body), 9)


def read_frame(data: bytes, what: str) -> tuple[dict[str, Any], Callable[[], np.ndarray]]:
    """A :func:`write_frame` value's head and a function giving its next
    column of ``head["n"]`` int64s.

    Raises:
        ValueError: an unknown format (*what*: ``step``, ``sample``) or truncated
            columns; zlib.error, struct.error: damaged.
    """
    raw = zlib.decompress(bytes(data))
    version, head_len = _HEAD.unpack_from(raw)
    if version != _VERSION:
        raise ValueError(f"unknown {what} pack format {version}")
    head = orjson.loads(raw[_HEAD.size : _HEAD.size + head_len])
    n = int(head["n"])
    body = from_planes(raw[_HEAD.size + head_len :])  # ValueError: truncated
    pos = 0

    def take() -> np.ndarray:
        nonlocal pos
        if pos + n > body.size:
            raise ValueError("truncated columns")
        pos += n
        got: np.ndarray = body[pos - n : pos]
        return got

    return head, take


def _unpack(data: bytes) -> Columns:
    head, take = read_frame(data, "step")
    n = int(head["n"])
    out = Columns(n)
    for name, kind, has_mask, extra in head["cols"]:
        if kind in ("i", "c"):
            arr, mask = read_int_column(kind, has_mask, extra, n, take)
            if name.startswith("phases."):
                key = name[len("phases.") :]
                out.phases[key] = arr
                out.has_phase[key] = np.ones(n, bool) if mask is None else ~mask
            else:
                out.ints[name] = arr
                if mask is not None:
                    out.nulls[name] = mask
        elif kind == "j":
            values = orjson.loads(extra)
            if type(values) is not list or len(values) != n:
                raise ValueError(f"column {name} of another length")
            if name == "phases":
                out.phase_dicts = values
            else:
                out.objects[name] = values
        elif kind == "p":
            out.phases_null = take().astype(bool) if has_mask else None
        else:
            raise ValueError(f"unknown column kind {kind!r}")
    missing = [
        c for c in INTEGER_COLUMNS + ("optimizers",) if c not in out.ints and c not in out.objects
    ]
    if missing:
        raise ValueError(f"columns missing: {missing}")
    return out
