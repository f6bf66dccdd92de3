"""The Postgres backend (asyncpg): connecting, the schema, reads, and the
writer's connection.

One pool per process. The schema is :data:`gpuprofd.storage.schema.SCHEMA_SQL`
in Postgres's types (:meth:`gpuprofd.storage.dialect.PostgresDialect.ddl`),
created and upgraded under a transaction-scoped advisory lock, so node
daemons and team-server replicas starting together create it once.

What is specific to a database *file* does not apply here: there is no file
to delete under the daemon, and several daemons may share one database (a
team that wants one), so no instance lock is taken on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from typing import Any, cast

from gpuprof.extras import install_hint
from gpuprofd.core.errors import DatabaseError
from gpuprofd.sampling import rollup
from gpuprofd.storage import commpack, schema
from gpuprofd.storage.dialect import POSTGRES, Dialect
from gpuprofd.storage.url import StorageUrl

try:
    import asyncpg
except ImportError:  # an optional extra: said when a postgres:// URL is used
    asyncpg = None  # type: ignore[assignment]

#: Advisory lock key (any 64-bit number; this one spells "gpuprof" in ASCII).
_SCHEMA_LOCK_KEY = 0x677075_70726F66
#: How long a connection attempt may take, seconds: a down server must be said
#: at once, not after the OS's TCP timeout.
CONNECT_TIMEOUT_S = 5.0
#: How long one statement may take, seconds: a server that stopped answering
#: (a network partition, not a refused connection) is then a lost server, its
#: batch retried and counted, instead of a writer waiting for ever. A batch of
#: 2,000 rows takes ~30 ms on this machine.
COMMAND_TIMEOUT_S = 30.0
#: How long creating or upgrading the schema may take, seconds: once per start,
#: possibly waiting for another daemon or replica that is creating it.
SCHEMA_TIMEOUT_S = 60.0
#: How long closing the pool waits for connections in use before cutting them.
CLOSE_TIMEOUT_S = 5.0

if asyncpg is not None:
    #: Every error of the driver and the server.
    ERRORS: tuple[type[BaseException], ...] = (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        OSError,
        TimeoutError,
    )
    _LOST: tuple[type[BaseException], ...] = (
        OSError,
        TimeoutError,
        asyncpg.PostgresConnectionError,
        asyncpg.CannotConnectNowError,
        asyncpg.ConnectionDoesNotExistError,
    )
else:  # pragma: no cover - asyncpg missing
    ERRORS = _LOST = (OSError, TimeoutError)


def is_connection_error(exc: BaseException) -> bool:
    """The server or the connection is gone (retry later), as opposed to a
    statement or a value the server or the driver refused (a bad row)."""
    if isinstance(exc, _LOST):
        return True
    # asyncpg says "connection is closed" with the base InterfaceError; its
    # subclasses (DataError: a value of the wrong type) are about the statement.
    return asyncpg is not None and type(exc) is asyncpg.InterfaceError


def _need_asyncpg() -> None:
    if asyncpg is None:
        raise DatabaseError("a postgres:// storage URL needs asyncpg: " + install_hint("postgres"))


async def _init(conn: Any) -> None:
    # SUM/AVG of BIGINT are numeric in Postgres: read them as floats, as SQLite gives them.
    await conn.set_type_codec(
        "numeric", encoder=str, decoder=float, schema="pg_catalog", format="text"
    )


async def _as_it_is(conn: Any) -> None:
    """A connection handed back to the pool is kept as it is: gpuprof leaves
    nothing on a session (no ``SET`` but ``SET LOCAL``, no ``LISTEN`` on a
    pooled connection, advisory locks only for a transaction), so asyncpg's
    reset (``RESET ALL``, ``UNLISTEN *``, ... after every use) would be one
    more round trip each time, and on a team server, before a group's
    batches are answered. An open transaction is still rolled back first
    (asyncpg does that itself)."""


async def create_pool(url: StorageUrl, *, min_size: int = 1, max_size: int = 4) -> Any:
    """A connection pool to *url* (a connection handed back is not reset:
    :func:`_as_it_is`).

    Raises:
        DatabaseError: asyncpg missing, the server unreachable, or the login
            refused; the message names the URL without its password and says
            what to do.
    """
    _need_asyncpg()
    assert url.dsn is not None
    try:
        return await asyncpg.create_pool(
            url.dsn,
            min_size=min_size,
            max_size=max_size,
            init=_init,
            reset=_as_it_is,
            timeout=CONNECT_TIMEOUT_S,
            command_timeout=COMMAND_TIMEOUT_S,
        )
    except ERRORS as exc:
        raise DatabaseError(
            f"cannot connect to Postgres at {url.display} ({_reason(exc)}): "
            "check that the server is running and the URL's host, port, user and database"
        ) from None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


async def prepare(pool: Any, url: StorageUrl) -> int:
    """Create or upgrade gpuprof's tables in the database of *pool*; returns
    the schema version found before (0: new).

    Raises:
        DatabaseError: another program's tables, or a newer schema than this code's.
    """
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK_KEY, timeout=SCHEMA_TIMEOUT_S
                )
                await _make_first_schema(conn, url)
                version = await _version(conn, url)
                if version:  # columns first: the script's indexes may name new ones
                    for table, column, decl in schema.added_since(version):
                        await conn.execute(
                            f"ALTER TABLE IF EXISTS {table} ADD COLUMN IF NOT EXISTS {column} "
                            f"{POSTGRES.column_decl(decl)}"
                        )
                if 0 < version < 23 and await _is_table(conn, "gpu_rollups"):
                    # its name is now the view's (schema 23)
                    await conn.execute("ALTER TABLE gpu_rollups RENAME TO gpu_rollups_21")
                await conn.execute(POSTGRES.ddl(schema.SCHEMA_SQL), timeout=SCHEMA_TIMEOUT_S)
                if 0 < version < 23:
                    await _narrow(conn)
                if version < schema.SCHEMA_VERSION:
                    await conn.executemany(
                        "INSERT INTO meta (key, value) VALUES ($1, $2) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        schema.meta_rows(),
                    )
        except asyncpg.PostgresError as exc:
            raise DatabaseError(
                f"cannot create gpuprof's tables in {url.display} ({_reason(exc)})"
            ) from None
    return version


#: Packed steps inserted per statement while upgrading to schema 23.
_NARROW_CHUNK = 1000


async def _is_table(conn: Any, name: str) -> bool:
    """Whether *name* (on the search path) is a table (not a view, not missing)."""
    kind = await conn.fetchval(
        "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", name
    )
    return kind in ("r", "p")


async def _narrow(conn: Any) -> None:
    """Schema 23 (in :func:`prepare`'s transaction): the ``gpu_rollups`` table
    (renamed ``gpu_rollups_21``) into ``gpus`` and ``gpu_seconds``, the
    ``comm_buckets`` rows packed into ``comm_steps`` (one row a step, its rows
    in the order stored); the old tables dropped."""
    if await _is_table(conn, "gpu_rollups_21"):
        for sql in rollup.copy_sql("SELECT * FROM gpu_rollups_21"):
            await conn.execute(sql, timeout=SCHEMA_TIMEOUT_S)
        await conn.execute("DROP TABLE gpu_rollups_21")
    if not await _is_table(conn, "comm_buckets"):
        return
    insert = POSTGRES.sql(commpack.INSERT_SQL)
    packed: list[tuple[Any, ...]] = []
    key: tuple[int, int] | None = None
    rows: list[tuple[Any, ...]] = []
    sql = (
        "SELECT run_id, step, bucket, start_ns, end_ns, bytes FROM comm_buckets "
        "ORDER BY run_id, step, rowid"
    )
    async for r in conn.cursor(sql):
        if (r[0], r[1]) != key:
            if key is not None:
                packed.append(commpack.step_row(*key, rows))
            key, rows = (r[0], r[1]), []
        rows.append(tuple(r[2:]))
        if len(packed) >= _NARROW_CHUNK:
            await conn.executemany(insert, packed)
            packed = []
    if key is not None:
        packed.append(commpack.step_row(*key, rows))
    await conn.executemany(insert, packed)
    await conn.execute("DROP TABLE comm_buckets")


async def _make_first_schema(conn: Any, url: StorageUrl) -> None:
    """Create the first schema of the search path if it is missing, so the
    tables go where the URL says (Postgres would put them in the next one
    that exists, ``public`` as a rule).

    Raises:
        DatabaseError: the search path names no schema to create tables in.
    """
    path = await conn.fetchval("SELECT current_setting('search_path')")
    first = _first_schema(path)
    if first is None:  # "$user", public: Postgres's own choice
        if await conn.fetchval("SELECT current_schema()") is None:
            raise DatabaseError(
                f"{url.display}: no schema to create tables in (search_path {path!r})"
            )
        return
    quoted = '"' + first.replace('"', '""') + '"'
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
    if await conn.fetchval("SELECT current_schema()") != first:
        raise DatabaseError(
            f"{url.display}: the tables would not go into schema {first!r} "
            f"(search_path {path!r}); name one schema in search_path"
        )


def _first_schema(search_path: str) -> str | None:
    """The first schema named in *search_path*, as Postgres reads it: a
    quoted name as written, another folded to lower case; None for ``$user``."""
    head = search_path.strip()
    if head.startswith('"'):
        end = 1
        while True:
            end = head.find('"', end)
            if end < 0:
                return None
            if head[end + 1 : end + 2] == '"':
                end += 2
                continue
            name = head[1:end].replace('""', '"')
            return None if not name or name == "$user" else name
    name = head.split(",", 1)[0].strip().lower()
    return None if not name or name.startswith("$") else name


async def _version(conn: Any, url: StorageUrl) -> int:
    """The schema version of the tables visible on *conn*'s search path (0: none)."""
    tables = {
        r["table_name"]
        for r in await conn.fetch(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = ANY (current_schemas(false))"
        )
    }
    if not tables:
        return 0
    if "meta" not in tables or "runs" not in tables:
        raise DatabaseError(f"{url.display} has tables but not gpuprof's")
    meta = {r["key"]: r["value"] for r in await conn.fetch("SELECT key, value FROM meta")}
    return schema.check_meta(meta, url.display)


class PostgresReader:
    """A :class:`gpuprofd.storage.reader.Reader` over a pool (``gpuprofctl
    --storage-url postgres://…``); :meth:`connect` checks the schema."""

    dialect: Dialect = POSTGRES

    def __init__(self, pool: Any, url: StorageUrl) -> None:
        self.pool = pool
        self.url = url
        self.where = url.display

    @classmethod
    async def connect(cls, url: StorageUrl) -> PostgresReader:
        """Connect and check that *url* holds gpuprof's tables, not newer than this code.

        Raises:
            DatabaseError: unreachable, empty, not gpuprof's, or too new.
        """
        pool = await create_pool(url, min_size=1, max_size=2)
        try:
            async with pool.acquire() as conn:
                version = await _version(conn, url)
        except BaseException:
            await pool.close()
            raise
        if not version:
            await pool.close()
            raise DatabaseError(
                f"{url.display} holds no gpuprof tables yet "
                "(point a gpuprofd at it with --storage-url first)"
            )
        return cls(pool, url)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return await self.pool.fetch(POSTGRES.sql(sql), *params)
        except ERRORS as exc:
            raise DatabaseError(f"reading {self.where} failed ({_reason(exc)})") from None

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchtuples(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """:meth:`fetchall`: asyncpg's records index by position already."""
        return await self.fetchall(sql, params)

    async def close(self) -> None:
        await close_pool(self.pool)


async def close_pool(pool: Any) -> None:
    """Close *pool*, cutting connections still busy after :data:`CLOSE_TIMEOUT_S`
    (a statement stuck on a silent server must not hold the daemon's exit)."""
    try:
        await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT_S)
    except (TimeoutError, *ERRORS):
        pool.terminate()


class PostgresWriter:
    """The store writer's side of a pool: one connection held per transaction."""

    dialect: Dialect = POSTGRES
    #: A failed statement aborts a Postgres transaction: each lone one runs under a savepoint.
    statement_savepoints = True
    errors = ERRORS

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._conn: Any = None
        self._shapes: dict[str, _Shape] = {}
        """Per statement: its parameter types and whether it returns rows."""

    def bound(self, conn: Any) -> PostgresWriter:
        """A writer over *conn* (a connection in a transaction the caller
        holds), sharing this one's statement shapes."""
        other = PostgresWriter(self.pool)
        other._conn = conn
        other._shapes = self._shapes
        return other

    async def begin(self) -> None:
        self._conn = await self.pool.acquire()
        try:
            await self._conn.execute("BEGIN")
        except BaseException:
            await self._release()
            raise

    async def commit(self) -> None:
        try:
            await self._conn.execute("COMMIT")
        finally:
            await self._release()

    async def rollback(self) -> None:
        if self._conn is None:
            return
        try:
            await self._conn.execute("ROLLBACK")
        finally:
            await self._release()

    async def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await self.pool.release(conn)
            except Exception:  # noqa: BLE001 - a broken connection is discarded by the pool
                conn.terminate()

    async def savepoint(self, name: str) -> None:
        await self._conn.execute(f"SAVEPOINT {name}")

    async def release(self, name: str) -> None:
        await self._conn.execute(f"RELEASE SAVEPOINT {name}")

    async def rollback_to(self, name: str) -> None:
        await self._conn.execute(f"ROLLBACK TO SAVEPOINT {name}")

    async def _shape(self, sql: str) -> _Shape:
        shape = self._shapes.get(sql)
        if shape is None:  # one Parse/Describe per statement for the writer's life
            stmt = await self._conn.prepare(POSTGRES.sql(sql))
            shape = _Shape(stmt.get_parameters(), bool(stmt.get_attributes()))
            self._shapes[sql] = shape
        return shape

    async def execute(self, sql: str, params: Sequence[Any]) -> tuple[int, Any]:
        """Run one statement; returns (rows changed, the first column of the
        first row a ``RETURNING`` gave, else None)."""
        shape = await self._shape(sql)
        values = shape.coerce(params)
        if shape.returns:  # RETURNING or SELECT
            row = await self._conn.fetchrow(POSTGRES.sql(sql), *values)
            return (1 if row is not None else 0), (row[0] if row is not None else None)
        status = await self._conn.execute(POSTGRES.sql(sql), *values)
        return _rowcount(status), None

    async def fetch_in_txn(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Rows of *sql* on the transaction's connection."""
        shape = await self._shape(sql)
        return await self._conn.fetch(POSTGRES.sql(sql), *shape.coerce(params))

    async def executemany(
        self, sql: str, rows: Sequence[Sequence[Any]], *, count: bool = False, typed: bool = False
    ) -> int | None:
        """Run *sql* with each of *rows* (pipelined); with *count*, one by one
        to return the rows changed in all (asyncpg's executemany does not say).
        *typed*: each of *rows* is a tuple whose values have their columns'
        types already (:meth:`_Shape.coerce_many` is skipped: a team server's
        ingest rows, checked when the batch was read)."""
        shape = await self._shape(sql)
        values = cast("list[tuple[Any, ...]]", rows) if typed else shape.coerce_many(rows)
        if count:
            total = 0
            for v in values:
                total += _rowcount(await self._conn.execute(POSTGRES.sql(sql), *v))
            return total
        plain = _PLAIN_INSERT.fullmatch(sql.strip())
        if plain and len(values) >= COPY_MIN_ROWS:
            # COPY: one round trip and no per-row statement
            columns = [c.strip() for c in plain.group(2).split(",")]
            try:
                await self._conn.copy_records_to_table(
                    plain.group(1), records=values, columns=columns
                )
            except (TypeError, ValueError, OverflowError) as exc:  # a value COPY cannot encode
                raise asyncpg.DataError(f"a row COPY cannot encode: {exc}") from exc
        else:
            await self._conn.executemany(POSTGRES.sql(sql), values)
        return None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return await self.pool.fetch(POSTGRES.sql(sql), *params)

    async def fetchtuples(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """:meth:`fetchall`: asyncpg's records index by position already."""
        return await self.fetchall(sql, params)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._release(), CLOSE_TIMEOUT_S)
        await close_pool(self.pool)


#: ``INSERT INTO t (a, b) VALUES (?, ?)`` with nothing else: rows that COPY can load.
_PLAIN_INSERT = re.compile(r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES \((\?(?:, ?\?)*)\)")
#: Fewer rows than this go through executemany (COPY's set-up costs a round trip).
COPY_MIN_ROWS = 8


def _rowcount(status: str) -> int:
    """Rows changed from a command tag (``UPDATE 3``, ``INSERT 0 1``)."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


_TUPLE = {tuple}
_INT_TYPES = frozenset({"int2", "int4", "int8"})
_FLOAT_TYPES = frozenset({"float4", "float8", "numeric"})
_WANTS: dict[str, type] = {"i": int, "f": float, "t": str}


class _Shape:
    """A statement's parameter types, and the values as asyncpg wants them:
    SQLite stores what it is given, asyncpg insists on the declared type
    (an ``int`` for a BIGINT, a ``str`` for a TEXT)."""

    def __init__(self, types: Sequence[Any], returns: bool) -> None:
        self.returns = returns
        self.kinds = tuple(
            "i" if t.name in _INT_TYPES else "f" if t.name in _FLOAT_TYPES else
            "t" if t.name == "text" else ""
            for t in types
        )  # fmt: skip
        self.wants = tuple(_WANTS.get(k) for k in self.kinds)

    def coerce_many(self, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """:meth:`coerce` of each of *rows*, looking at a column at a time
        first: rows whose every value has its column's type already (a
        team server's ingest batches, as a rule) are taken as they are."""
        out = (
            cast("list[tuple[Any, ...]]", rows)
            if type(rows) is list and set(map(type, rows)) == _TUPLE
            else [tuple(r) for r in rows]
        )
        for want, column in zip(self.wants, zip(*out, strict=False), strict=False):
            if want is None:
                continue
            found = set(map(type, column))  # C loops: no Python step per value
            found.discard(type(None))
            if found and found != {want}:
                return [self.coerce(r) for r in out]
        return out

    def coerce(self, params: Sequence[Any]) -> tuple[Any, ...]:
        out = tuple(params)
        for value, want in zip(out, self.wants, strict=False):
            if value is not None and want is not None and type(value) is not want:
                break
        else:  # every value already of its column's type (a batch's rows, as a rule)
            return out
        for j, (value, kind) in enumerate(zip(out, self.kinds, strict=False)):
            if value is None or not kind:
                continue
            cls = type(value)
            try:
                if kind == "i" and cls is not int:
                    fixed: Any = int(value) if cls is bool else round(value)
                elif kind == "f" and cls is not float:
                    fixed = float(value)
                elif kind == "t" and cls is not str:
                    fixed = str(value)
                else:
                    continue
            except (TypeError, ValueError, OverflowError):
                continue  # left as it is: asyncpg refuses the row (DataError), counted

            out = (*out[:j], fixed, *out[j + 1 :])
        return out
