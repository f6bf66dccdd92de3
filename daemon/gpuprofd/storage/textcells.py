"""Text cells of a SQLite file whose bytes are not UTF-8.

gpuprof writes only UTF-8, but a file can hold other bytes in a text column:
raw SQL (``UPDATE runs SET run_name = CAST(x'fffe41' AS TEXT)``), another
program, a damaged disk. Python's ``sqlite3`` refuses such a cell (``Could
not decode to UTF-8 column ...``) and with it the whole query, so one cell
would hide every run. Each gpuprof connection decodes text with :func:`decode`
instead (:func:`tolerant`): bytes that are not UTF-8 become U+FFFD, and the
value is an :class:`Undecodable`, so a reader can count the cells and name
their runs (:class:`UndecodedCells`).

A BLOB written into a text column comes back as ``bytes`` (``sqlite3``'s
converters, its only hook for BLOBs, read ``''`` as None): the rows of
gpuprof's readers (:func:`row`, their row factory) read it as text the same
way, in every column but those gpuprof stores BLOBs in
(:data:`BLOB_COLUMNS`). Rows read as plain tuples (``fetchtuples``: the bulk
reads of steps and samples, no object made per row) keep a BLOB as ``bytes``:
their text columns are JSON cells, which
:func:`gpuprofd.storage.unreadable.json_cell` reads from bytes as from text.

Postgres needs none of this: a UTF8 database (the usual encoding) refuses
such bytes when they are written (``invalid byte sequence for encoding
"UTF8"``). A SQL_ASCII one stores them, and reading them back then fails
with that error (a :class:`~gpuprofd.core.errors.DatabaseError`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Undecodable(str):
    """A text cell whose bytes were not UTF-8, with U+FFFD in place of each
    bad sequence (a ``str`` like any other, marked so it can be counted)."""


_lock = threading.Lock()
_seen = 0
"""Undecodable cells decoded in this process (by every connection's thread)."""


def decode(data: bytes) -> str:
    """A text cell's bytes as text: UTF-8, else :class:`Undecodable`."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        global _seen
        with _lock:  # connections read in several threads
            _seen += 1
        return Undecodable(data.decode(errors="replace"))


#: The columns gpuprof stores BLOBs in, by name (packed steps, samples and
#: gradient buckets: ``storage/schema.py``); a BLOB in any other is text.
BLOB_COLUMNS = frozenset({"data", "packed"})
_BYTES = frozenset({bytes})


def row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> sqlite3.Row:
    """A ``sqlite3.Row`` of *values* (a connection's ``row_factory``), a
    BLOB in a column not in :data:`BLOB_COLUMNS` as text (:func:`decode`)."""
    if _BYTES.isdisjoint(map(type, values)):  # one pass in C: most rows hold none
        return sqlite3.Row(cursor, values)
    names = [d[0] for d in cursor.description]
    values = tuple(
        decode(v) if type(v) is bytes and n not in BLOB_COLUMNS else v
        for n, v in zip(names, values, strict=True)
    )
    return sqlite3.Row(cursor, values)


def seen() -> int:
    """How many undecodable cells this process has read so far (compare two
    readings to know whether the rows read between hold any)."""
    return _seen


def tolerant(conn: Any) -> None:
    """Make *conn* (``sqlite3`` or ``aiosqlite``) decode text that is not
    UTF-8 (:func:`decode`)."""
    conn.text_factory = decode


def connect(database: str | Path, **kwargs: Any) -> sqlite3.Connection:
    """``sqlite3.connect(database, **kwargs)``, decoding as :func:`tolerant` says."""
    conn = sqlite3.connect(database, **kwargs)
    tolerant(conn)
    return conn


def _is_runs(keys: list[str]) -> bool:
    """Are these the columns of ``runs`` rows (``run_key``, which every one has)?"""
    return "run_key" in keys and "id" in keys


def may_hold(rows: list[Any], seen_before: int) -> bool:
    """Can *rows*, read since :func:`seen` was *seen_before*, hold cells to
    count (an :class:`Undecodable` was made since)?"""
    return seen() != seen_before


@dataclass
class UndecodedCells:
    """The undecodable cells a reader met: each once where its row names its
    run (``run_id``, or a ``runs`` row's ``id``), else counted by column each
    time it is read."""

    named: set[tuple[int, str]] = field(default_factory=set)
    """(run id, column) of each."""
    unnamed: Counter[str] = field(default_factory=Counter)
    """Column -> cells in rows that name no run (``?``: a row of plain tuples)."""

    def add(self, rows: list[Any], names: list[str] | None = None) -> None:
        """Note the :class:`Undecodable` cells of *rows* (the ``sqlite3.Row``
        objects of one query, or its tuples and their column *names*)."""
        if not rows:
            return
        if isinstance(rows[0], sqlite3.Row):
            keys = rows[0].keys()
        elif names is not None and len(names) == len(rows[0]):
            keys = names
        else:
            n = sum(isinstance(v, Undecodable) for row in rows for v in row)
            if n:
                self.unnamed["?"] += n
            return
        keys = list(keys)
        run_col = "run_id" if "run_id" in keys else "id" if _is_runs(keys) else None
        run_at = None if run_col is None else keys.index(run_col)
        look = frozenset((Undecodable,))
        for r in rows:
            if look.isdisjoint(map(type, r)):  # one pass in C: most rows hold none
                continue
            bad = [k for k, v in zip(keys, r, strict=True) if isinstance(v, Undecodable)]
            run = r[run_at] if run_at is not None else None
            if isinstance(run, int):
                self.named.update((run, k) for k in bad)
            else:
                self.unnamed.update(bad)

    def __len__(self) -> int:
        return len(self.named) + sum(self.unnamed.values())

    def describe(self) -> str:
        """``run 2: run_name; run 3: host, project; rows without a run id: name (4)``."""
        by_run: dict[int, list[str]] = {}
        for run, column in sorted(self.named):
            by_run.setdefault(run, []).append(column)
        parts = [f"run {run}: {', '.join(cols)}" for run, cols in by_run.items()]
        if self.unnamed:
            cols = ", ".join(f"{c} ({n})" for c, n in sorted(self.unnamed.items()))
            parts.append(f"rows without a run id: {cols}")
        return "; ".join(parts)
