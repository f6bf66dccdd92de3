"""What a writer hands the store (:class:`gpuprofd.storage.writes.store.Store`):
an :class:`Op` (one statement, an atomic group of :class:`Part` s, or a
function run in a :class:`Txn`), the outbox events it carries when the node
forwards (:class:`Forward`), and :class:`AtomicCheckError`, which undoes an
atomic op whose rows moved under it. Plain data: no connection here.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuprofd.storage.dialect import Dialect


class AtomicCheckError(sqlite3.Error):
    """A :class:`Part` changed another number of rows than it expected: the
    data moved since the caller read it, so its whole atomic op is undone."""


@dataclass(frozen=True)
class Part:
    """One statement of an atomic op (:meth:`Store.write_atomic`): *sql* run
    with each of *rows* (an ``executemany``); *expect_rows*, if set, is how
    many rows it must change in all, else the atomic op is rolled back."""

    sql: str
    rows: Sequence[Sequence[Any]] = ((),)
    expect_rows: int | None = None


@dataclass(frozen=True)
class Forward:
    """What of an op a forwarding node also writes to its outbox, in the op's
    transaction (:mod:`gpuprofd.storage.writes.outbox`): an event of *kind* (a
    ``gpuprofd.storage.writes.batch`` kind) that a full outbox gives up in
    *priority* order (lowest first). *encode(op, value)* gives the event's
    run id (None: about the node), its body (a JSON-able object with its
    ``rows``/``fields``, or None: read from ``runs`` when sent) and its row
    count; *value* is what the op's statement returned (a new run's id)."""

    kind: str
    priority: int
    encode: Callable[[Op, Any], tuple[int | None, Any, int]]


@dataclass
class Op:
    """One SQL statement to write. ``future`` (if any) gets the cursor's
    ``lastrowid`` after the commit, or the exception."""

    sql: str
    params: Sequence[Any] = ()
    future: asyncio.Future[int | None] | None = field(default=None, repr=False)
    drop_reason: str = "store_error"
    parts: Sequence[Part] = ()
    """Set by :meth:`Store.write_atomic`: statements run all-or-none in the
    batch's transaction (``sql`` is then only a label)."""
    run_id: int | None = None
    """The run whose event this op stores: a lost op is counted against it."""
    txn: Callable[[Txn], Awaitable[Any]] | None = None
    """Set by :meth:`Store.transaction`: a function run inside the batch's
    transaction (under a savepoint: all or none); its result is the op's."""
    forward: tuple[Forward, ...] = ()
    """Events this op also puts in the outbox when the store forwards
    (:attr:`Store.forwarding`): written in the same transaction, and only if
    the op itself was stored."""

    @property
    def urgent(self) -> bool:
        """Someone awaits this op: commit without waiting for more."""
        return self.future is not None


class Txn:
    """What :meth:`Store.transaction`'s function is given: statements run in
    the writer's open transaction (``?`` placeholders on both backends)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.dialect: Dialect = db.dialect

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """The rows of *sql* (a SELECT, or a statement with RETURNING), by position."""
        return await self._db.fetch_in_txn(sql, params)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; returns the rows it changed."""
        changed, _ = await self._db.execute(sql, params)
        return changed

    async def executemany(
        self, sql: str, rows: Sequence[Sequence[Any]], *, typed: bool = False
    ) -> None:
        """Run *sql* with each of *rows* (a bulk insert: COPY on Postgres).
        *typed*: every value has its column's type already (rows built from
        a checked ingest batch): Postgres takes them without looking again."""
        if rows:
            if typed:
                await self._db.executemany(sql, rows, typed=True)
            else:
                await self._db.executemany(sql, rows)
