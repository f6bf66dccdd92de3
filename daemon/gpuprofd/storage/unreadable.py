"""Stored values no reader can decode: each read as a stand-in and counted,
so one value costs itself, never the view that reads it.

gpuprof reads back only what it wrote, but a database can hold other
values: raw SQL, another program, a damaged disk. Each kind has one decoder,
which every reader uses:

- a text cell that is not UTF-8, or a BLOB in a text column, reads as text,
  U+FFFD in place of the bytes that are not UTF-8 (the connection and its
  rows: :mod:`gpuprofd.storage.textcells`);
- a JSON cell that is not JSON, or not of the shape stored (:func:`json_cell`,
  :func:`json_cells`), reads as an empty value;
- a packed block of steps, samples or gradient buckets whose bytes are
  damaged (:func:`block`) is left out, and the rest of the run read.

They are counted in the :class:`Unreadable` of the read in progress
(:func:`collecting`: one ``gpuprofctl`` command, one API request), which
says them (:meth:`Unreadable.notes`). Outside one (the daemon's own passes)
each is logged once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import textcells
from gpuprofd.storage.textcells import UndecodedCells

log = logging.getLogger(__name__)

T = TypeVar("T")
#: One value: (its run's id, None where its row names none; its table and
#: column, or its table for a block; which one: a step, a block, a row's index).
Key = tuple[int | None, str, Any]
#: The values logged outside a :func:`collecting` read, each once; at most
#: this many kept (then each is logged again: a log line, never memory).
MAX_LOGGED = 1000


@dataclass
class Unreadable:
    """What one read (a command, a request) could not decode."""

    where: str = "the database"
    """The database read, as said to people (a path, a URL without its password)."""
    text: UndecodedCells = field(default_factory=UndecodedCells)
    """Text cells that are not UTF-8 (shown with U+FFFD)."""
    values: set[Key] = field(default_factory=set)
    """JSON cells shown empty."""
    blocks: set[Key] = field(default_factory=set)
    """Packed blocks left out."""

    def __len__(self) -> int:
        return len(self.text) + len(self.values) + len(self.blocks)

    def notes(self) -> list[str]:
        """One sentence per kind met, for people: how many, in which run and
        table, what is shown instead, why."""
        out, where = [], self.where
        n = len(self.text)
        if n:
            out.append(
                f"{n} text cell{'' if n == 1 else 's'} in {where} "
                f"{'is' if n == 1 else 'are'} not UTF-8 ({self.text.describe()}): shown with "
                "\ufffd in place of the bytes that are not; they were written outside "
                "gpuprof, or the file is damaged"
            )
        before = "(a copy of it from before holds them)"
        n = len(self.values)
        if n:
            out.append(
                f"{n} stored value{'' if n == 1 else 's'} in {where} could not be read "
                f"({describe(self.values)}): shown empty; they were changed outside gpuprof, "
                f"or the file is damaged {before}"
            )
        n = len(self.blocks)
        if n:
            out.append(
                f"{n} packed block{'' if n == 1 else 's'} in {where} could not be read "
                f"({describe(self.blocks)}): the steps, samples or buckets they held are left "
                f"out; the file is damaged {before}"
            )
        return out


def describe(keys: set[Key]) -> str:
    """``run 1: insights.evidence, steps.phases (2); rows without a run id: host_packs (1)``."""
    by_run: dict[int | None, dict[str, int]] = {}
    for run, where, _ in keys:
        got = by_run.setdefault(run, {})
        got[where] = got.get(where, 0) + 1
    parts = []
    for run in sorted(r for r in by_run if r is not None):
        cols = sorted(by_run[run].items())
        parts.append(f"run {run}: " + ", ".join(f"{w} ({n})" if n > 1 else w for w, n in cols))
    if None in by_run:
        cols = sorted(by_run[None].items())
        parts.append("rows without a run id: " + ", ".join(f"{w} ({n})" for w, n in cols))
    return "; ".join(parts)


_current: ContextVar[Unreadable | None] = ContextVar("unreadable", default=None)
_logged: set[Key] = set()


@contextlib.contextmanager
def collecting(where: str = "the database") -> Iterator[Unreadable]:
    """Count what the reads inside (the tasks and threads they start
    included) cannot decode in the :class:`Unreadable` yielded (of *where*)."""
    got = Unreadable(where)
    token = _current.set(got)
    try:
        yield got
    finally:
        _current.reset(token)


def current() -> Unreadable | None:
    """The :class:`Unreadable` of the read in progress; None outside one."""
    return _current.get()


def note_rows(
    rows: list[Any], seen_before: int, names: Callable[[], list[str]] | None = None
) -> None:
    """Note the text cells that are not UTF-8 among *rows*, one query's
    (:func:`gpuprofd.storage.textcells.may_hold`: read since
    :func:`~gpuprofd.storage.textcells.seen` was *seen_before*); ``names()``:
    the columns of plain tuples."""
    got = _current.get()
    if got is not None and textcells.may_hold(rows, seen_before):
        got.text.add(rows, names() if names is not None else None)


def _note(blocks: bool, key: Key, why: str) -> None:
    got = _current.get()
    if got is not None:
        (got.blocks if blocks else got.values).add(key)
        return
    if key in _logged:
        return
    if len(_logged) >= MAX_LOGGED:
        _logged.clear()
    _logged.add(key)
    run, where, which = key
    kind = "packed block" if blocks else "value"
    left = "left out" if blocks else "read as empty"
    log.warning("a stored %s of %s (run %s, %r) could not be read (%s): %s", kind, where, run,
                which, why, left)  # fmt: skip


def null() -> None:
    """The stand-in (``empty``) of a value whose absence reads as NULL."""
    return None


def json_cell(
    text: Any,
    where: str,
    run: int | None = None,
    which: Any = None,
    *,
    shape: type | tuple[type, ...] = dict,
    empty: Callable[[], Any] = dict,
) -> Any:
    """The value of the JSON cell *text* (``str`` or ``bytes``) of *where*
    (``table.column``), *run*'s; ``empty()`` where it is NULL or ``''``, and
    (counted) where it is not JSON or not an instance of *shape*."""
    if text is None or text == "" or text == b"":
        return empty()
    try:
        got = orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError) as exc:
        _note(False, (run, where, which), str(exc))
        return empty()
    return shaped(got, where, run, which, shape=shape, empty=empty)


def shaped(
    value: Any,
    where: str,
    run: int | None = None,
    which: Any = None,
    *,
    shape: type | tuple[type, ...] = dict,
    empty: Callable[[], Any] = dict,
) -> Any:
    """*value*, decoded already from JSON (:func:`json_cell`, a packed
    block), where it is an instance of *shape*; else ``empty()``, counted."""
    if isinstance(value, shape):
        return value
    _note(False, (run, where, which), f"JSON {type(value).__name__}, not the value stored")
    return empty()


def json_cells(
    texts: Sequence[Any],
    where: str,
    run: int | None = None,
    which: Callable[[int], Any] | None = None,
    *,
    shape: type | tuple[type, ...] = dict,
    empty: Callable[[], Any] = dict,
) -> list[Any]:
    """:func:`json_cell` of each of *texts*, None where NULL (one parse
    each, no call per cell unless one is unreadable: a day's 172,800 steps);
    ``which(i)`` names the *i*-th (default: *i*)."""
    loads = orjson.loads
    try:
        got = [None if t is None else loads(t) for t in texts]
    except (orjson.JSONDecodeError, TypeError):
        pass
    else:
        if all(g is None or isinstance(g, shape) for g in got):
            return got
    name = which or (lambda i: i)
    return [
        None if t is None else json_cell(t, where, run, name(i), shape=shape, empty=empty)
        for i, t in enumerate(texts)
    ]


def block(
    data: Any, unpack: Callable[[Any], T], where: str, run: int | None = None, which: Any = None
) -> T | None:
    """``unpack(data)``: a packed block of *where* (its table), *run*'s;
    None (counted) where *unpack* finds it damaged (a DatabaseError)."""
    try:
        return unpack(data)
    except DatabaseError as exc:
        _note(True, (run, where, which), str(exc))
        return None
