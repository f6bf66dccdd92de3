"""The SQLite backend: a database file.

- :class:`SqliteWriter`: the daemon store's two aiosqlite connections to
  the file (one writes, in WAL mode; one reads, ``query_only``);
- :func:`connect_ro` / :func:`open_ro`: the file opened read-only, for
  gpuprofctl's reads and ``nsys-import``'s report: ``file:…?mode=ro``, so
  reading never creates or changes a file (a missing path fails instead of
  becoming an empty database); :func:`open_ro` also checks the file is a
  gpuprof database and lets an older one answer today's queries;
- :class:`SqliteFileReader`: a :class:`gpuprofd.storage.reader.Reader` over
  such a connection.

The Postgres backend is :mod:`gpuprofd.storage.postgres`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiosqlite

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import filecheck, schema, textcells, unreadable
from gpuprofd.storage.dialect import SQLITE, Dialect

MISSING_HINT = "run a script under gpuprof.profile() first, or pass the path"


def open_ro(path: Path) -> sqlite3.Connection:
    """Open *path* read-only and check it is a gpuprof database.

    Raises:
        DatabaseError: missing, not SQLite, corrupt, or not ours.
    """
    if not path.exists():
        raise DatabaseError(f"no database at {path} ({MISSING_HINT})")
    if path.is_dir():
        raise DatabaseError(f"{path} is a directory, not a database file")
    try:
        conn = connect_ro(path)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {path} ({exc})") from None
    conn.row_factory = textcells.row
    try:
        version = schema.check_connection(conn, path)
        if not version:
            raise DatabaseError(f"{path} is an empty database, not a gpuprof one")
        if version < schema.SCHEMA_VERSION:
            schema.shadow_old_tables(conn, version)
    except DatabaseError:
        conn.close()
        raise
    return conn


def connect_ro(path: Path) -> sqlite3.Connection:
    """Connect to *path* read-only (the path is quoted: ``?`` and ``#`` are URI syntax).

    A WAL database (gpuprofd's) in a directory it cannot write (a read-only
    mount, an archive) is opened ``immutable``: even a read-only reader of
    WAL needs to create ``-shm`` beside it, so SQLite would refuse it
    ("unable to open database file"); with no ``-wal`` left beside it the
    file holds every commit, and nothing writes it there.

    Raises:
        sqlite3.Error: it cannot be opened (missing, a directory, no permission).
    """
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    conn = _connect(uri)
    if not _sealed(path):
        return conn
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
    except sqlite3.OperationalError:
        conn.close()
        return _connect(f"{uri}&immutable=1")
    return conn


def _connect(uri: str) -> sqlite3.Connection:
    # a connection is used by one thread at a time, not always the one that
    # opened it (SqliteFileReader runs each query in a worker thread)
    return textcells.connect(uri, uri=True, check_same_thread=False)


def _sealed(path: Path) -> bool:
    """*path* lies in a directory this process cannot write, with no
    write-ahead log beside it (``-wal`` missing or empty): what it reads
    there is all there is."""
    if os.access(path.absolute().parent, os.W_OK):
        return False
    wal = path.with_name(path.name + "-wal")
    try:
        return wal.stat().st_size == 0
    except FileNotFoundError:
        return True


class SqliteFileReader:
    """A :class:`Reader` over read-only ``sqlite3`` connections to a file
    (:func:`open_ro`). Each query runs in a worker thread on a connection
    of its own, so reads awaited together (``asyncio.gather``) run at once:
    SQLite works without Python's lock, and a day-long run's aggregates
    (its job's CPU, its GPU rollups) are summed while its steps are turned
    into Python objects. At most :data:`MAX_CONNECTIONS` are open.

    Text that is not UTF-8 reads with U+FFFD (:mod:`gpuprofd.storage.textcells`),
    noted in the read in progress (:func:`gpuprofd.storage.unreadable.note_rows`)."""

    dialect: Dialect = SQLITE
    #: Connections open at most: the queries one context build overlaps.
    MAX_CONNECTIONS = 4

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self.where = str(path.absolute())
        self._free: list[sqlite3.Connection] = [conn]
        self._opened = 1
        self._ready = asyncio.Condition()

    async def _take(self) -> sqlite3.Connection:
        async with self._ready:
            while not self._free and self._opened >= self.MAX_CONNECTIONS:
                await self._ready.wait()
            if self._free:
                return self._free.pop()
            self._opened += 1
        try:
            return await asyncio.to_thread(open_ro, self.path)
        except BaseException:
            async with self._ready:
                self._opened -= 1
                self._ready.notify()
            raise

    async def _give(self, conn: sqlite3.Connection) -> None:
        async with self._ready:
            self._free.append(conn)
            self._ready.notify()

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return await self._fetch(sql, params, False)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchtuples(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        return await self._fetch(sql, params, True)

    async def _fetch(self, sql: str, params: Sequence[Any], tuples: bool) -> list[Any]:
        conn = await self._take()
        seen = textcells.seen()
        try:
            rows, names = await asyncio.to_thread(
                _fetchall, conn, self.where, sql, tuple(params), tuples
            )
        finally:
            await self._give(conn)
        unreadable.note_rows(rows, seen, lambda: names)
        return rows

    async def close(self) -> None:
        for conn in self._free:
            conn.close()
        self._free = []


def _names(description: Any) -> list[str]:
    """The column names of a cursor's ``description``."""
    return [d[0] for d in description or ()]


def _fetchall(
    conn: sqlite3.Connection, where: str, sql: str, params: tuple[Any, ...], tuples: bool
) -> tuple[list[Any], list[str]]:
    """Rows of *sql* (``sqlite3.Row`` objects, or plain tuples with
    *tuples*) and its column names.

    Raises:
        DatabaseError: the file at *where* is damaged, or lacks what *sql* reads.
    """
    try:
        cur = conn.cursor()
        if tuples:
            cur.row_factory = None
        rows = cur.execute(sql, params).fetchall()
        return rows, _names(cur.description)
    except sqlite3.DatabaseError as exc:
        if filecheck.is_damage(exc):
            raise filecheck.damaged(Path(where), str(exc)) from None
        raise DatabaseError(f"{where} is damaged or incomplete ({exc})") from None


class SqliteWriter:
    """The store's two aiosqlite connections to a file: one writes (WAL), one
    reads (``query_only``)."""

    dialect: Dialect = SQLITE
    #: A failed statement undoes only itself in SQLite: no savepoint needed around one.
    statement_savepoints = False

    def __init__(
        self, write: aiosqlite.Connection, read: aiosqlite.Connection, file_id: tuple[int, int]
    ) -> None:
        self.write = write
        self.read = read
        self.file_id = file_id
        """(st_dev, st_ino) of the file the connections opened."""

    @classmethod
    async def connect(cls, path: Path) -> SqliteWriter:
        write = await aiosqlite.connect(path, isolation_level=None)
        try:
            textcells.tolerant(write)
            await write.execute("PRAGMA journal_mode=WAL")
            await write.execute("PRAGMA synchronous=NORMAL")
            await write.execute("PRAGMA busy_timeout=5000")
            read = await aiosqlite.connect(path)
        except BaseException:
            await write.close()
            raise
        try:
            textcells.tolerant(read)
            read.row_factory = textcells.row
            await read.execute("PRAGMA busy_timeout=5000")
            await read.execute("PRAGMA query_only=ON")
            st = os.stat(path)
        except BaseException:
            await read.close()
            await write.close()
            raise
        return cls(write, read, (st.st_dev, st.st_ino))

    async def begin(self) -> None:
        await self.write.execute("BEGIN")

    async def commit(self) -> None:
        await self.write.execute("COMMIT")

    async def rollback(self) -> None:
        await self.write.execute("ROLLBACK")

    async def savepoint(self, name: str) -> None:
        await self.write.execute(f"SAVEPOINT {name}")

    async def release(self, name: str) -> None:
        await self.write.execute(f"RELEASE {name}")

    async def rollback_to(self, name: str) -> None:
        await self.write.execute(f"ROLLBACK TO {name}")

    async def execute(self, sql: str, params: Sequence[Any]) -> tuple[int, Any]:
        """Run one statement; returns (rows changed, the first column of what
        ``RETURNING`` gave, else ``lastrowid``)."""
        cur = await self.write.execute(sql, params)
        if " RETURNING " in sql.upper():
            row = await cur.fetchone()
            return (1 if row is not None else 0), (row[0] if row is not None else None)
        return cur.rowcount, cur.lastrowid

    async def executemany(
        self, sql: str, rows: Sequence[Sequence[Any]], *, count: bool = False, typed: bool = False
    ) -> int | None:
        """Run *sql* with each of *rows*; returns the rows changed in all
        (*typed*, Postgres's hint, changes nothing here: SQLite stores what it is given)."""
        cur = await self.write.executemany(sql, rows)
        return cur.rowcount

    async def fetch_in_txn(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Rows of *sql* on the writing connection (inside its transaction)."""
        async with self.write.execute(sql, params) as cur:
            return list(await cur.fetchall())

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of *sql*; text that is not UTF-8 noted in the read in
        progress (:func:`gpuprofd.storage.unreadable.note_rows`)."""
        seen = textcells.seen()
        async with self.read.execute(sql, params) as cur:
            rows = list(await cur.fetchall())
        unreadable.note_rows(rows, seen)
        return rows

    async def fetchtuples(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """Rows of *sql* as plain tuples (no ``Row`` made per row), noted as
        :meth:`fetchall`'s."""
        seen = textcells.seen()
        async with self.read.cursor() as cur:
            cur.row_factory = None
            await cur.execute(sql, params)
            rows = list(await cur.fetchall())
            unreadable.note_rows(rows, seen, lambda: _names(cur.description))
        return rows

    async def close(self) -> None:
        for conn in (self.read, self.write):
            with contextlib.suppress(Exception):
                await conn.close()
