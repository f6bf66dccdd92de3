"""The one read interface: every read the rules, ``gpuprofctl`` and the HTTP
API make is a function of a :class:`Reader`, whatever holds the database.

Readers: the daemon's :class:`gpuprofd.storage.writes.store.Store` (its read
connection on SQLite, its pool on Postgres), :class:`SqliteFileReader` (a
read-only ``sqlite3`` connection, for ``gpuprofctl`` on a file) and
:class:`gpuprofd.storage.postgres.PostgresReader`.

SQL given to a reader is written once, in the subset both engines run, with
``?`` placeholders (:mod:`gpuprofd.storage.dialect`); rows come back as
mappings that also index by position (``sqlite3.Row``, ``asyncpg.Record``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from gpuprofd.storage.dialect import Dialect
from gpuprofd.storage.url import parse as parse_url

Row = Mapping[str, Any]


class Reader(Protocol):
    """Runs read queries (committed data only)."""

    dialect: Dialect
    where: str
    """The database, as said to people: a file path, or a URL without its password."""

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of *sql* (``?`` placeholders) with *params*.

        Raises:
            DatabaseError: the database is damaged, incomplete or unreachable.
        """
        ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any | None:
        """The first row of *sql*, or None."""
        ...

    async def fetchtuples(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """Rows of *sql* indexed by position only (on SQLite plain tuples, no
        ``sqlite3.Row`` made per row): for bulk reads turned into columns
        (a day's 172,800 host samples read ~40 % faster)."""
        ...


@contextlib.asynccontextmanager
async def open_reader(target: str | Path) -> AsyncIterator[Reader]:
    """A :class:`Reader` of *target* (a storage URL or a file path,
    :func:`gpuprofd.storage.url.parse`), closed on exit. What it cannot
    decode is counted in the read in progress
    (:func:`gpuprofd.storage.unreadable.collecting`).

    Raises:
        DatabaseError: missing, not a gpuprof database, too new, or unreachable.
        BadInputError: *target* is not a storage URL.
    """
    url = parse_url(target)
    if url.path is not None:
        from gpuprofd.storage.sqlite import SqliteFileReader, open_ro

        reader = SqliteFileReader(open_ro(url.path), url.path)
    else:
        from gpuprofd.storage.postgres import PostgresReader

        reader = await PostgresReader.connect(url)
    try:
        yield reader
    finally:
        await reader.close()
