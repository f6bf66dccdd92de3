"""The store: one writer task owns every write to SQLite; reads use a second
connection.

Writers anywhere in the daemon submit :class:`Op` s to a bounded queue. High
volume ops (steps, samples) use :meth:`Store.submit_nowait`, which drops and
counts when the queue is full, so ingest never blocks. Ops that need their
result (a new run id) or must be durable (run end) use :meth:`Store.write`,
which waits for queue space and for the commit. :meth:`Store.flush` is a
barrier: it returns once everything queued before it is committed.

The writer drains up to :data:`BATCH_MAX_OPS` ops or :data:`BATCH_MAX_S`
seconds into one transaction, and groups consecutive ops with the same SQL
into one ``executemany``.

The database file can be deleted or replaced under a running daemon (``rm
gpuprof.db*``): SQLite keeps writing into the open, now nameless, file.
:meth:`Store.file_state` tells (the path's inode against the one opened) and
:meth:`Store.reopen` switches both connections to the file now at the path
between two commits, carrying across what the caller asks for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite

from gpuprofd.counters import DropCounter
from gpuprofd.storage.dialect import SQLITE, Dialect

#: Failed commits logged individually; after that one line per thousand
#: (a full or broken disk fails every commit).
_LOG_AT = frozenset({1, 2, 3, 10, 100})
log = logging.getLogger(__name__)

BATCH_MAX_OPS = 500
BATCH_MAX_S = 0.1
DEFAULT_QUEUE_SIZE = 20_000


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

    @property
    def urgent(self) -> bool:
        """Someone awaits this op: commit without waiting for more."""
        return self.future is not None


class Store:
    """Owns the SQLite connections of the daemon (see module doc)."""

    def __init__(
        self, path: Path, drops: DropCounter, queue_size: int = DEFAULT_QUEUE_SIZE
    ) -> None:
        self.path = path
        self.dialect: Dialect = SQLITE
        self.where = str(path.absolute())
        self.drops = drops
        self.queue: asyncio.Queue[Op] = asyncio.Queue(maxsize=queue_size)
        self.commits = 0
        self._commit_failures = 0
        """Transactions committed (tests read it to check batching)."""
        self._write: aiosqlite.Connection | None = None
        self._read: aiosqlite.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._file_id: tuple[int, int] | None = None
        """(st_dev, st_ino) of the file the connections opened."""
        self._commit_lock = asyncio.Lock()
        """Held by each commit and by :meth:`reopen`, so no transaction spans two files."""

    async def open(self) -> None:
        """Open both connections (the schema must exist: see :func:`schema.prepare`)."""
        self._write, self._read, self._file_id = await self._connect()

    async def _connect(self) -> tuple[aiosqlite.Connection, aiosqlite.Connection, tuple[int, int]]:
        write = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await write.execute("PRAGMA journal_mode=WAL")
            await write.execute("PRAGMA synchronous=NORMAL")
            await write.execute("PRAGMA busy_timeout=5000")
            read = await aiosqlite.connect(self.path)
        except BaseException:
            await write.close()
            raise
        try:
            read.row_factory = aiosqlite.Row
            await read.execute("PRAGMA busy_timeout=5000")
            await read.execute("PRAGMA query_only=ON")
            st = os.stat(self.path)
        except BaseException:
            await read.close()
            await write.close()
            raise
        return write, read, (st.st_dev, st.st_ino)

    def file_state(self) -> str | None:
        """None while the path still names the open database file; else
        ``"deleted"`` (nothing at the path) or ``"replaced"`` (another file).
        One ``stat``: cheap enough for every hello."""
        if self._file_id is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "deleted"
        except OSError:
            return None  # unreadable for a moment (permissions, NFS): not proof of anything
        return None if (st.st_dev, st.st_ino) == self._file_id else "replaced"

    async def reopen(
        self,
        read_old: Callable[[aiosqlite.Connection], Awaitable[Any]],
        prepare: Callable[[], None],
        write_new: Callable[[aiosqlite.Connection, Any], Awaitable[None]],
    ) -> None:
        """Switch both connections to the database now at :attr:`path`, between
        two commits: *read_old(old_write)* reads what is to be kept (it sees
        every committed row); the old file's WAL is checkpointed and its
        connections closed (a replaced file's ``-wal``/``-shm`` at the path are
        still the old file's: the new file must not find frames in them);
        *prepare()* (in a thread) makes the schema at the path; the new
        connections open and *write_new(new_write, what_read_old_returned)*
        writes. Ops still queued are then committed to the new file.

        Raises:
            Exception: *read_old* failed (the store stays on the old file), or
            a later step did (the store then has no database: every write
            fails and is counted as ``store_error``).
        """
        async with self._commit_lock:
            assert self._write is not None
            kept = await read_old(self._write)
            with contextlib.suppress(sqlite3.Error):
                await self._write.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            for conn in (self._read, self._write):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            self._write = self._read = None
            self._file_id = None
            await asyncio.to_thread(prepare)
            write, read, file_id = await self._connect()
            self._write, self._read, self._file_id = write, read, file_id
            await write_new(write, kept)

    def start(self) -> None:
        """Start the writer task."""
        self._task = asyncio.create_task(self._writer(), name="store-writer")

    async def close(self) -> None:
        """Commit everything queued, stop the writer, close the connections."""
        try:
            if self._task is not None:
                await self.flush()
        except Exception:  # a failing disk must not keep the daemon from exiting
            log.exception("store: final flush failed; unflushed rows are lost")
        finally:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
                self._task = None
            for conn in (self._read, self._write):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            self._read = self._write = None

    # --- writing -------------------------------------------------------------

    def submit_nowait(self, op: Op) -> bool:
        """Queue *op* without waiting; on a full queue drop it and count
        ``store_backpressure``. Returns whether it was queued."""
        try:
            self.queue.put_nowait(op)
        except asyncio.QueueFull:
            self.drops.add("store_backpressure")
            return False
        return True

    def submit_all_nowait(self, ops: Sequence[Op]) -> bool:
        """Queue all of *ops*, in order and with nothing between them, or none
        (one ``store_backpressure`` drop) when the queue lacks room for all.
        Returns whether they were queued."""
        if self.queue.maxsize and self.queue.maxsize - self.queue.qsize() < len(ops):
            self.drops.add("store_backpressure")
            return False
        for op in ops:
            self.queue.put_nowait(op)
        return True

    async def submit(self, op: Op) -> None:
        """Queue *op*, waiting for space (for ops that must not be dropped)."""
        await self.queue.put(op)

    async def write(self, sql: str, params: Sequence[Any] = ()) -> int | None:
        """Queue one statement, wait for its commit; return ``lastrowid``."""
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        await self.queue.put(Op(sql, params, fut))
        return await fut

    async def write_atomic(self, parts: Sequence[Part], label: str = "atomic") -> None:
        """Queue *parts* as one op and wait for its commit: they run in order,
        inside one transaction, all or none (a failing or mismatched part
        undoes the others and raises). One queue item, so the writer never
        splits them across two commits."""
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        await self.queue.put(Op(f"-- {label}", (), fut, parts=tuple(parts)))
        await fut

    async def flush(self) -> None:
        """Barrier: return once every op queued before this call is committed."""
        await self.write("SELECT 1")

    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + BATCH_MAX_S
            while len(batch) < BATCH_MAX_OPS and not batch[-1].urgent:
                try:
                    batch.append(self.queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), remaining))
                except TimeoutError:
                    break
            async with self._commit_lock:
                await self._commit(batch)

    async def _commit(self, batch: list[Op]) -> None:
        results: list[tuple[Op, int | None, BaseException | None]] = []
        try:
            if self._write is None:  # a failed reopen left no database
                raise sqlite3.OperationalError(f"no database open at {self.path}")
            await self._write.execute("BEGIN")
            for group in _groups(batch):
                results.extend(await self._run_group(group))
            await self._write.execute("COMMIT")
            self.commits += 1
        except sqlite3.Error as exc:
            self._commit_failures += 1
            if self._commit_failures in _LOG_AT or self._commit_failures % 1000 == 0:
                log.error(
                    "store commit failed (%d so far), %d ops lost: %s",
                    self._commit_failures,
                    len(batch),
                    exc,
                )
            self.drops.add("store_error", str(exc), n=len(batch))
            try:
                if self._write is not None:
                    await self._write.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            results = [(op, None, exc) for op in batch]
        for op, rowid, exc in results:
            if op.future is not None and not op.future.done():
                if exc is None:
                    op.future.set_result(rowid)
                else:
                    op.future.set_exception(exc)

    async def _run_group(
        self, group: list[Op]
    ) -> list[tuple[Op, int | None, BaseException | None]]:
        assert self._write is not None
        if group[0].parts:
            return [await self._run_atomic(group[0])]
        if len(group) > 1:
            # A savepoint undoes the rows executemany wrote before a bad one.
            await self._write.execute("SAVEPOINT grp")
            try:
                await self._write.executemany(group[0].sql, [op.params for op in group])
                await self._write.execute("RELEASE grp")
                return [(op, None, None) for op in group]
            except sqlite3.Error:  # one bad row: redo one by one so the others are kept
                await self._write.execute("ROLLBACK TO grp")
                await self._write.execute("RELEASE grp")
        out: list[tuple[Op, int | None, BaseException | None]] = []
        for op in group:
            try:
                cur = await self._write.execute(op.sql, op.params)
                out.append((op, cur.lastrowid, None))
            except sqlite3.Error as exc:
                self.drops.add(op.drop_reason, str(exc))
                out.append((op, None, exc))
        return out

    async def _run_atomic(self, op: Op) -> tuple[Op, int | None, BaseException | None]:
        """Run an atomic op's parts under a savepoint; undo them all on error."""
        assert self._write is not None
        await self._write.execute("SAVEPOINT atomic")
        try:
            for part in op.parts:
                if len(part.rows) == 1:
                    cur = await self._write.execute(part.sql, part.rows[0])
                else:
                    cur = await self._write.executemany(part.sql, part.rows)
                if part.expect_rows is not None and cur.rowcount != part.expect_rows:
                    raise AtomicCheckError(
                        f"{op.sql}: {cur.rowcount} rows changed, expected {part.expect_rows}"
                    )
            await self._write.execute("RELEASE atomic")
            return op, None, None
        except sqlite3.Error as exc:
            await self._write.execute("ROLLBACK TO atomic")
            await self._write.execute("RELEASE atomic")
            if op.future is None:  # queued without waiting (a step with its buckets): count it
                self.drops.add(op.drop_reason, str(exc))
            return op, None, exc  # a caller who awaits it decides what it means

    # --- reading -------------------------------------------------------------

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        """Run a read query on the read connection (sees committed data only)."""
        if self._read is None:  # a failed reopen left no database
            raise sqlite3.OperationalError(f"no database open at {self.path}")
        async with self._read.execute(sql, params) as cur:
            return list(await cur.fetchall())

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> aiosqlite.Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None


def _groups(batch: list[Op]) -> list[list[Op]]:
    """Split *batch* into runs of ops that can share one ``executemany``."""
    groups: list[list[Op]] = []
    for op in batch:
        if (
            groups
            and not op.urgent
            and not op.parts  # an atomic op runs alone (_run_group runs one)
            and not groups[-1][-1].urgent
            and groups[-1][0].sql == op.sql
        ):
            groups[-1].append(op)
        else:
            groups.append([op])
    return groups
