"""The store: one writer task owns every write to SQLite; reads use a second
connection. (Past 500 lines as one job: the writer's queue, batching,
barrier and reopen share one connection's state; the ops it runs are in
:mod:`gpuprofd.storage.writes.ops`.)

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
import collections
import contextlib
import logging
import os
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import orjson

from gpuprofd.core.counters import DropCounter
from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import filecheck
from gpuprofd.storage.dialect import SQLITE, Dialect
from gpuprofd.storage.sqlite import SqliteWriter
from gpuprofd.storage.url import StorageUrl
from gpuprofd.storage.writes.ops import AtomicCheckError, Forward, Op, Part, Txn

#: Failed commits logged individually; after that one line per thousand
#: (a full or broken disk fails every commit).
_LOG_AT = frozenset({1, 2, 3, 10, 100})
log = logging.getLogger(__name__)

#: Ops committed in one transaction at most. Each commit costs a few thread round
#: trips on SQLite and network round trips on Postgres, so under a burst the
#: writer takes big batches (2,000 step rows: ~10 ms of SQLite work on this box).
BATCH_MAX_OPS = 2000
#: Characters of a failed commit's error kept for its runs' summaries (one note line).
ERROR_CHARS = 300
BATCH_MAX_S = 0.1
DEFAULT_QUEUE_SIZE = 20_000
#: A lost Postgres: first retry after this, doubling up to RETRY_MAX_S (seconds).
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 10.0
#: How long one batch is retried before it is counted lost (``store_unavailable``):
#: meanwhile the queue fills and new events are counted as ``store_backpressure``.
RETRY_BUDGET_S = 30.0
#: How long closing waits for the last commit (a lost server must not hold shutdown).
CLOSE_FLUSH_S = 10.0
SQLITE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error,)  # AtomicCheckError too

OUTBOX_INSERT_SQL = (
    "INSERT INTO outbox (kind, run_id, priority, body, n_rows, bytes, wall_ns) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
#: Bytes an outbox row costs beyond its body (its other columns, the index
#: entry and SQLite's page overhead, roughly): what the outbox bound counts.
OUTBOX_ROW_BYTES = 64


class Store:
    """Owns the daemon's database connections (see module doc): two aiosqlite
    connections on a file, an asyncpg pool on Postgres."""

    def __init__(
        self,
        target: Path | StorageUrl,
        drops: DropCounter,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        pool_size: int = 4,
    ) -> None:
        self.pool_size = pool_size
        """Postgres: connections at most (the writer's, reads', :meth:`transaction` s')."""
        self.url = target if isinstance(target, StorageUrl) else StorageUrl(SQLITE, path=target)
        self.path: Path | None = self.url.path
        """The database file (None on Postgres)."""
        self.dialect: Dialect = self.url.dialect
        self.where = self.url.display
        self.drops = drops
        self.queue: asyncio.Queue[Op] = asyncio.Queue(maxsize=queue_size)
        self.commits = 0
        """Transactions committed (tests read it to check batching)."""
        self._commit_failures = 0
        self._db: Any = None
        """The backend's writer: :class:`SqliteWriter` or
        :class:`gpuprofd.storage.postgres.PostgresWriter`; None when closed."""
        self._errors: tuple[type[BaseException], ...] = SQLITE_ERRORS
        self._is_lost: Callable[[BaseException], bool] = lambda exc: False
        """Is this error a lost server (retry the batch) rather than a bad statement?"""
        self._task: asyncio.Task[None] | None = None
        self._commit_lock = asyncio.Lock()
        """Held by each commit and by :meth:`reopen`, so no transaction spans two files."""
        self._retry = Backoff()
        self.lost_by_run: collections.Counter[int] = collections.Counter()
        """Ops of each run that could not be stored (:meth:`take_lost`)."""
        self.lost_error_by_run: dict[int, str] = {}
        """Why the newest of those failed, per run (:meth:`take_lost_error`)."""
        self._room = asyncio.Event()
        self.forwarding = False
        """Write each op's :attr:`Op.forward` events to the outbox (a node with a team server)."""
        self.outbox_written = 0
        """Outbox events written since start (a forwarder waits on :attr:`outbox_event`)."""
        self.outbox_event = asyncio.Event()
        """Set after each commit that wrote outbox events."""
        """Set each time the writer takes ops off the queue (:meth:`wait_for_room`)."""

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """The errors a statement on this backend may raise (the driver's and the server's)."""
        return self._errors

    def is_lost(self, exc: BaseException) -> bool:
        """Is *exc* a lost server (try again later) rather than a refused statement?"""
        return self._is_lost(exc)

    @property
    def _write(self) -> aiosqlite.Connection | None:
        return self._db.write if isinstance(self._db, SqliteWriter) else None

    @property
    def _read(self) -> aiosqlite.Connection | None:
        return self._db.read if isinstance(self._db, SqliteWriter) else None

    async def open(self) -> None:
        """Open the connections. On a file the schema must exist (see
        :func:`schema.prepare`); on Postgres it is created or upgraded here.

        Raises:
            DatabaseError: Postgres unreachable, not gpuprof's, or too new.
        """
        if self.path is not None:
            self._db = await SqliteWriter.connect(self.path)
            return
        from gpuprofd.storage import postgres

        pool = await postgres.create_pool(self.url, max_size=self.pool_size)
        try:
            await postgres.prepare(pool, self.url)
        except BaseException:
            await pool.close()
            raise
        self._db = postgres.PostgresWriter(pool)
        self._errors = postgres.ERRORS + (AtomicCheckError,)
        self._is_lost = postgres.is_connection_error

    @property
    def file_id(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of the database file open now; None on Postgres or with none open."""
        return self._db.file_id if isinstance(self._db, SqliteWriter) else None

    def file_state(self) -> str | None:
        """None while the path still names the open database file (and always
        on Postgres); else ``"deleted"`` (nothing at the path) or
        ``"replaced"`` (another file). One ``stat``: cheap enough for every hello."""
        if not isinstance(self._db, SqliteWriter) or self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "deleted"
        except OSError:
            return None  # unreadable for a moment (permissions, NFS): not proof of anything
        return None if (st.st_dev, st.st_ino) == self._db.file_id else "replaced"

    async def reopen(
        self,
        read_old: Callable[[aiosqlite.Connection], Awaitable[Any]],
        prepare: Callable[[], None],
        write_new: Callable[[aiosqlite.Connection, Any], Awaitable[None]],
    ) -> None:
        """Switch both connections to the database file now at :attr:`path`,
        between two commits: *read_old(old_write)* reads what is to be kept (it sees
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
            assert isinstance(self._db, SqliteWriter) and self.path is not None
            kept = await read_old(self._db.write)
            with contextlib.suppress(sqlite3.Error):
                await self._db.write.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            old, self._db = self._db, None
            await old.close()
            await asyncio.to_thread(prepare)
            self._db = await SqliteWriter.connect(self.path)
            await write_new(self._db.write, kept)

    def start(self) -> None:
        """Start the writer task."""
        self._task = asyncio.create_task(self._writer(), name="store-writer")

    async def close(self) -> None:
        """Commit everything queued, stop the writer, close the connections."""
        try:
            if self._task is not None:
                await asyncio.wait_for(self.flush(), CLOSE_FLUSH_S)
        except Exception:  # a failing disk or a lost server must not keep the daemon from exiting
            log.exception("store: final flush failed; unflushed rows are lost")
        finally:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
                self._task = None
            db, self._db = self._db, None
            if db is not None:
                with contextlib.suppress(Exception):
                    await db.close()

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

    def take_lost(self, run_id: int) -> int:
        """How many of *run_id*'s events could not be stored since the last call."""
        return self.lost_by_run.pop(run_id, 0)

    def take_lost_error(self, run_id: int) -> str | None:
        """Why *run_id*'s events last failed to commit (``writing /x/gpuprof.db
        failed: database disk image is malformed``), once; None when none did."""
        return self.lost_error_by_run.pop(run_id, None)

    def _lost(self, op: Op, exc: BaseException) -> None:
        """Count *op* lost to its run, with *exc*, the database's error, as why."""
        if op.run_id is not None:
            self.lost_by_run[op.run_id] += 1
            self.lost_error_by_run[op.run_id] = f"writing {self.where} failed: {exc}"[:ERROR_CHARS]

    async def wait_for_room(self, n: int, backlog: int | None = None) -> None:
        """Return once the queue has room for *n* more ops and, with
        *backlog*, holds fewer than that many (at once when it does).

        Ingest awaits this before queueing a message's events: while the
        writer catches up, messages wait in the data socket's buffer instead
        of being dropped here (past that buffer the training process drops
        and counts them, never waiting), and the loop is free for the
        writer's commits."""
        limit = self.queue.maxsize or None
        n = min(n, limit) if limit else n

        def full() -> bool:
            queued = self.queue.qsize()
            return (limit is not None and limit - queued < n) or (
                backlog is not None and queued >= backlog
            )

        while full():
            self._room.clear()
            await self._room.wait()

    async def submit(self, op: Op) -> None:
        """Queue *op*, waiting for space (for ops that must not be dropped)."""
        await self.queue.put(op)

    async def write(
        self,
        sql: str,
        params: Sequence[Any] = (),
        *,
        forward: tuple[Forward, ...] = (),
        run_id: int | None = None,
    ) -> int | None:
        """Queue one statement, wait for its commit; return the first column
        its ``RETURNING`` gave (or, on SQLite, ``lastrowid``). *forward*: its
        outbox events (:attr:`Op.forward`), about *run_id*."""
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        await self.queue.put(Op(sql, params, fut, run_id=run_id, forward=forward))
        return await fut

    async def write_atomic(self, parts: Sequence[Part], label: str = "atomic") -> None:
        """Queue *parts* as one op and wait for its commit: they run in order,
        inside one transaction, all or none (a failing or mismatched part
        undoes the others and raises). One queue item, so the writer never
        splits them across two commits."""
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        await self.queue.put(Op(f"-- {label}", (), fut, parts=tuple(parts)))
        await fut

    async def transaction(self, fn: Callable[[Txn], Awaitable[Any]], label: str = "txn") -> Any:
        """Run *fn(txn)* inside one transaction and wait for its commit; return
        what *fn* returned. *fn* reads and writes through the :class:`Txn`
        (it sees its own writes); whatever it raises undoes everything it did
        and is raised here.

        On SQLite it is one item of the writer's queue (the one writer: the
        writer never splits it across two commits). On Postgres it runs at once on a
        connection of its own, beside the writer and other transactions (so
        a team server applies several nodes' batches together); a lost server
        is raised (:meth:`is_lost` says so), not retried.

        Raises:
            DatabaseError: no database open.
        """
        if isinstance(self._db, SqliteWriter) or self._db is None:
            return await self._queued_transaction(fn, label)
        async with self._db.pool.acquire() as conn:
            async with conn.transaction():
                return await fn(Txn(self._db.bound(conn)))

    async def _queued_transaction(self, fn: Callable[[Txn], Awaitable[Any]], label: str) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.queue.put(Op(f"-- {label}", (), fut, txn=fn))
        return await fut

    async def flush(self) -> None:
        """Barrier: return once every op queued before this call is committed."""
        await self.write("SELECT 1")

    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            self._room.set()
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
            self._room.set()
            async with self._commit_lock:
                try:
                    await self._commit_retrying(batch)
                except Exception as exc:  # noqa: BLE001 - the writer must outlive any batch
                    log.exception("store: a batch failed unexpectedly; its ops are lost")
                    with contextlib.suppress(Exception):
                        if self._db is not None:
                            await self._db.rollback()
                    self._fail(batch, exc, reason="store_error")

    async def _commit_retrying(self, batch: list[Op]) -> None:
        """Commit *batch*; while the server is unreachable, retry it with
        capped, jittered backoff for up to :data:`RETRY_BUDGET_S`, then count
        it lost (``store_unavailable``) and go on with the next batch."""
        budget_end = asyncio.get_running_loop().time() + RETRY_BUDGET_S
        while True:
            exc = await self._commit(batch, final=False)
            if exc is None:
                self._retry.reset()
                return
            if not self._is_lost(exc):
                return
            delay = self._retry.next_delay()
            if asyncio.get_running_loop().time() + delay > budget_end:
                self._fail(batch, exc, reason="store_unavailable")
                self._retry.reset()  # the next batch starts with a short pause again
                return
            if self._retry.attempt in _LOG_AT:
                log.warning(
                    "store: %s unreachable (%s); retrying in %.1f s", self.where, exc, delay
                )
            await asyncio.sleep(delay)

    async def _commit(self, batch: list[Op], *, final: bool = True) -> BaseException | None:
        """One attempt at *batch*; returns the error that undid it (its ops
        already failed and counted, unless it is a connection error and not *final*)."""
        results: list[tuple[Op, int | None, BaseException | None]] = []
        db = self._db
        try:
            if db is None:  # a failed reopen left no database
                raise sqlite3.OperationalError(f"no database open at {self.where}")
            await db.begin()
            for group in _groups(batch):
                results.extend(await self._run_group(db, group))
            outbox = self._outbox_rows(results) if self.forwarding else []
            if outbox:
                await db.executemany(OUTBOX_INSERT_SQL, outbox)
            await db.commit()
            self.commits += 1
            if outbox:
                self.outbox_written += len(outbox)
                self.outbox_event.set()
        except (sqlite3.Error, *self._errors) as exc:
            with contextlib.suppress(Exception):
                if db is not None:
                    await db.rollback()
            if self._is_lost(exc) and not final:
                return exc
            self._fail(batch, exc, reason="store_error")
            return exc
        for op, rowid, err in results:
            if op.future is not None and not op.future.done():
                if err is None:
                    op.future.set_result(rowid)
                else:
                    op.future.set_exception(err)
        return None

    def _outbox_rows(self, results: Sequence[tuple[Op, Any, BaseException | None]]) -> list[Any]:
        """The outbox rows of the ops of *results* that were stored, in order.
        An event that cannot be encoded is counted (``forward_encode``), never
        a reason to lose the op itself."""
        rows: list[tuple[Any, ...]] = []
        now = time.time_ns()
        for op, value, err in results:
            if err is not None or not op.forward:
                continue
            for fwd in op.forward:
                try:
                    run_id, body, n_rows = fwd.encode(op, value)
                    text = None if body is None else orjson.dumps(body).decode()
                except Exception as exc:  # noqa: BLE001 - a bug here must not lose the op
                    self.drops.add("forward_encode", f"{fwd.kind}: {exc}"[:200])
                    continue
                size = OUTBOX_ROW_BYTES + (len(text) if text is not None else 0)
                rows.append((fwd.kind, run_id, fwd.priority, text, n_rows, size, now))
        return rows

    def _fail(self, batch: list[Op], exc: BaseException, *, reason: str) -> None:
        self._commit_failures += 1
        if self._commit_failures in _LOG_AT or self._commit_failures % 1000 == 0:
            log.error(
                "store commit failed (%d so far), %d ops lost: %s",
                self._commit_failures,
                len(batch),
                exc,
            )
        self.drops.add(reason, str(exc)[:200], n=len(batch))
        for op in batch:
            self._lost(op, exc)
            if op.future is not None and not op.future.done():
                op.future.set_exception(exc)

    async def _run_group(
        self, db: Any, group: list[Op]
    ) -> list[tuple[Op, int | None, BaseException | None]]:
        if group[0].parts:
            return [await self._run_atomic(db, group[0])]
        if group[0].txn is not None:
            return [await self._run_txn(db, group[0])]
        if len(group) > 1:
            # A savepoint undoes the rows executemany wrote before a bad one.
            await db.savepoint("grp")
            try:
                await db.executemany(group[0].sql, [op.params for op in group])
                await db.release("grp")
                return [(op, None, None) for op in group]
            except self._errors as exc:  # one bad row: redo one by one so the others are kept
                if self._is_lost(exc):
                    raise
                await db.rollback_to("grp")
                await db.release("grp")
        out: list[tuple[Op, int | None, BaseException | None]] = []
        guard = db.statement_savepoints
        for op in group:
            if guard:
                await db.savepoint("one")
            try:
                _, value = await db.execute(op.sql, op.params)
                if guard:
                    await db.release("one")
                out.append((op, value, None))
            except self._errors as exc:
                if self._is_lost(exc):
                    raise
                if guard:
                    await db.rollback_to("one")
                    await db.release("one")
                self.drops.add(op.drop_reason, str(exc)[:200])
                self._lost(op, exc)
                out.append((op, None, exc))
        return out

    async def _run_atomic(self, db: Any, op: Op) -> tuple[Op, int | None, BaseException | None]:
        """Run an atomic op's parts under a savepoint; undo them all on error."""
        await db.savepoint("atomic")
        try:
            for part in op.parts:
                if len(part.rows) == 1:
                    changed, _ = await db.execute(part.sql, part.rows[0])
                else:
                    changed = await db.executemany(
                        part.sql, part.rows, count=part.expect_rows is not None
                    )
                if part.expect_rows is not None and changed != part.expect_rows:
                    raise AtomicCheckError(
                        f"{op.sql}: {changed} rows changed, expected {part.expect_rows}"
                    )
            await db.release("atomic")
            return op, None, None
        except self._errors as exc:
            if self._is_lost(exc):
                raise
            await db.rollback_to("atomic")
            await db.release("atomic")
            if op.future is None:  # queued without waiting (a step with its buckets): count it
                self.drops.add(op.drop_reason, str(exc)[:200])
                self._lost(op, exc)
            return op, None, exc  # a caller who awaits it decides what it means

    async def _run_txn(self, db: Any, op: Op) -> tuple[Op, Any, BaseException | None]:
        """Run a transaction op's function under a savepoint; undo it on any error."""
        assert op.txn is not None
        await db.savepoint("txn")
        try:
            value = await op.txn(Txn(db))
            await db.release("txn")
            return op, value, None
        except Exception as exc:  # noqa: BLE001 - the caller gets it; the batch goes on
            if self._is_lost(exc):
                raise
            await db.rollback_to("txn")
            await db.release("txn")
            return op, None, exc

    # --- reading -------------------------------------------------------------

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run a read query (sees committed data only).

        Raises:
            DatabaseError: no database is open, or the server is unreachable.
        """
        return await self._fetch("fetchall", sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchtuples(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """Rows of a read query indexed by position only (see
        :meth:`gpuprofd.storage.reader.Reader.fetchtuples`).

        Raises:
            DatabaseError: as :meth:`fetchall`.
        """
        return await self._fetch("fetchtuples", sql, params)

    async def _fetch(self, method: str, sql: str, params: Sequence[Any]) -> Any:
        """The open database's read *method*; a lost connection is a DatabaseError."""
        if self._db is None:  # a failed reopen left no database
            raise DatabaseError(f"no database open at {self.where}")
        try:
            return await getattr(self._db, method)(sql, params)
        except self._errors as exc:
            if self.path is not None and filecheck.is_damage(exc):
                raise filecheck.damaged(self.path, str(exc)) from None
            if not self._is_lost(exc):
                raise
            raise DatabaseError(f"reading {self.where} failed ({exc})") from None


class Backoff:
    """Capped exponential backoff with full jitter, for a lost server:
    0.25 s, 0.5 s, … up to :data:`RETRY_MAX_S` (each a random share of that)."""

    def __init__(self) -> None:
        self.attempt = 0

    def reset(self) -> None:
        self.attempt = 0

    def next_delay(self) -> float:
        self.attempt += 1
        cap = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self.attempt - 1))
        return random.uniform(cap / 2, cap)


def _groups(batch: list[Op]) -> list[list[Op]]:
    """Split *batch* into runs of ops that can share one ``executemany``."""
    groups: list[list[Op]] = []
    for op in batch:
        if (
            groups
            and not op.urgent
            and not op.parts  # an atomic op runs alone (_run_group runs one)
            and op.txn is None
            and not groups[-1][-1].urgent
            and groups[-1][0].sql == op.sql
        ):
            groups[-1].append(op)
        else:
            groups.append([op])
    return groups
