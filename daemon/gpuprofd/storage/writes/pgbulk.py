"""A team server's GPU rollups upserted on Postgres in one statement per table.

A group of 250 ingest batches (a quarter second of a thousand 8-GPU nodes)
carries 2,000 GPU seconds and names 2,000 GPUs, each GPU already stored as a
rule. Upserted a row at a time (:data:`gpuprofd.sampling.rollup.GPU_SQL` and
:data:`~gpuprofd.sampling.rollup.INSERT_SQL` through asyncpg's executemany),
each row is an execution of its own in Postgres, and each ``gpus`` row,
conflicting, is locked (written) although nothing of it changes. Here each
table's rows go in one ``INSERT ... SELECT ... FROM unnest(arrays) ON
CONFLICT`` with the same merge, and a ``gpus`` row that holds what the batch
says already is left alone (not locked).

One statement cannot upsert the same row twice: GPUs are taken once each (the
first max SM clock given, as the row-by-row upserts keep), and a second sent
again within the group (a resend beside its first) is merged after the bulk
statement by the row's own upsert, in the order sent, as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpuprofd.sampling import rollup
from gpuprofd.storage import schema
from gpuprofd.storage.writes.ops import Txn

#: ``gpus`` rows (uuid, boot key, max SM clock MHz) as three arrays; a row
#: stored with a clock already, or given none, is not touched.
GPUS_SQL = (
    "INSERT INTO gpus (uuid, boot_id, sm_limit_mhz) SELECT u.uuid, u.boot_id, u.lim "
    "FROM unnest(?::text[], ?::text[], ?::float8[]) AS u(uuid, boot_id, lim) "
    "WHERE NOT EXISTS (SELECT 1 FROM gpus g WHERE g.uuid = u.uuid AND g.boot_id = u.boot_id "
    "AND (g.sm_limit_mhz IS NOT NULL OR u.lim IS NULL)) "
    "ON CONFLICT (uuid, boot_id) DO UPDATE SET sm_limit_mhz = excluded.sm_limit_mhz "
    "WHERE gpus.sm_limit_mhz IS NULL AND excluded.sm_limit_mhz IS NOT NULL"
)


def _column_types(table: str, columns: Sequence[str]) -> list[str]:
    """Postgres array element types of *table*'s *columns*, from the schema
    script (``INTEGER``: ``int8``, ``REAL``: ``float8``, ``TEXT``: ``text``)."""
    one_line = rf"^CREATE TABLE IF NOT EXISTS {table} \(([^\n]*)\);$"
    m = re.search(one_line, schema.SCHEMA_SQL, re.M) or re.search(
        rf"CREATE TABLE IF NOT EXISTS {table} \((.*?)\n\);", schema.SCHEMA_SQL, re.S
    )
    assert m is not None, table
    body = re.sub(r"--[^\n]*", "", m.group(1))
    declared = dict(re.findall(r"(\w+) (INTEGER|REAL|TEXT)\b", body))
    names = {"INTEGER": "int8", "REAL": "float8", "TEXT": "text"}
    return [names[declared[c]] for c in columns]


_SECONDS_TYPES = _column_types("gpu_seconds", rollup.SECONDS_COLUMNS)
_CONFLICT = rollup.INSERT_SQL[rollup.INSERT_SQL.index(" ON CONFLICT") :]
#: ``gpu_seconds`` rows (:func:`gpuprofd.sampling.rollup.insert_params`: the
#: GPU's uuid and boot key, then the columns) as arrays, merged into a second
#: stored already as :data:`~gpuprofd.sampling.rollup.INSERT_SQL` merges.
SECONDS_SQL = (
    f"INSERT INTO gpu_seconds (gpu, {', '.join(rollup.SECONDS_COLUMNS)}) "
    "SELECT (SELECT id FROM gpus g WHERE g.uuid = u.uuid AND g.boot_id = u.boot_id), "
    f"{', '.join(f'u.{c}' for c in rollup.SECONDS_COLUMNS)} FROM unnest(?::text[], ?::text[], "
    f"{', '.join(f'?::{t}[]' for t in _SECONDS_TYPES)}) AS u(uuid, boot_id, "
    f"{', '.join(rollup.SECONDS_COLUMNS)}){_CONFLICT}"
)
_SECONDS_KINDS = ("text", "text", *_SECONDS_TYPES)
_SEC = 2  # sec_ns in insert_params' rows


def gpus_once(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """:data:`~gpuprofd.sampling.rollup.GPU_SQL` rows, each GPU once: its
    first max SM clock given (what upserting them one by one keeps)."""
    out: dict[tuple[Any, Any], Any] = {}
    for uuid, boot, limit in rows:
        if out.get((uuid, boot)) is None:
            out[uuid, boot] = limit
    return [(*key, limit) for key, limit in out.items()]


def split_repeats(
    rows: Sequence[Sequence[Any]],
) -> tuple[list[Sequence[Any]], list[Sequence[Any]]]:
    """*rows* (``insert_params`` rows) as the first of each GPU second, and
    the seconds sent again after it (in the order sent)."""
    seen: set[tuple[Any, Any, Any]] = set()
    first: list[Sequence[Any]] = []
    again: list[Sequence[Any]] = []
    for r in rows:
        key = (r[0], r[1], r[_SEC])
        if key in seen:
            again.append(r)
        else:
            seen.add(key)
            first.append(r)
    return first, again


def arrays(rows: Sequence[Sequence[Any]], kinds: Sequence[str]) -> list[list[Any] | None]:
    """*rows* as one list per column, each value of its column's type
    (``int8``: an int, ``float8``: a float, ``text``: a str; None kept),
    for a multi-array ``unnest`` in a ``FROM``. A column with no value at
    all (but the first) is None, a NULL array: ``unnest`` pads it with
    NULLs to the others' length, and asyncpg, which checks each element of
    an array parameter in Python (~0.25 us a value), has none to check (a
    GPU second has ~36 columns, many without a value in a whole group)."""
    if not rows:
        return [[] for _ in kinds]
    out: list[list[Any] | None] = []
    for kind, column in zip(kinds, zip(*rows, strict=True), strict=True):
        want = _WANTS[kind]
        found = set(map(type, column))
        found.discard(type(None))
        if not found and out:
            out.append(None)
        elif found and found != {want}:
            out.append([None if v is None else _as(want, v) for v in column])
        else:
            out.append(list(column))
    return out


_WANTS: dict[str, type] = {"int8": int, "float8": float, "text": str}


def _as(want: type, v: Any) -> Any:
    if want is int and type(v) is not bool:
        return round(v)
    return want(v)


class StoredGpus:
    """The GPUs a team server replica has seen stored (committed), so a
    group's ``gpus`` upsert (:data:`GPUS_SQL`) leaves out those it would not
    change: a ``gpus`` row is never deleted and never loses its max SM clock,
    so a GPU stored with its clock stays so, and one stored without stays
    stored. A node sends its 8 GPUs every second, stored since its first:
    ~35 us of the replica's and Postgres's CPU a batch less
    (``docs/benchmarks.md``)."""

    def __init__(self) -> None:
        self._clock: dict[tuple[Any, Any], bool] = {}  # (uuid, boot key) -> a clock stored

    def unknown(self, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """*rows* (:func:`gpus_once`'s), less each GPU stored with its clock,
        or stored and given none."""
        out = []
        for row in rows:
            clock = self._clock.get(row[:2])
            if clock is None or not (clock or row[2] is None):
                out.append(row)
        return out

    def learn(self, rows: Sequence[Sequence[Any]]) -> None:
        """*rows* (:data:`GPUS_SQL`'s) were upserted, and their transaction committed."""
        for uuid, boot, limit in rows:
            self._clock[uuid, boot] = self._clock.get((uuid, boot), False) or limit is not None

    def forget(self) -> None:
        """Forget every GPU (a transaction failed: the database may be another
        now, a GPU left out gone; the next upserts name every GPU again)."""
        self._clock.clear()


async def upsert_gpus(txn: Txn, rows: Sequence[Sequence[Any]]) -> None:
    """Upsert ``gpus`` rows (:func:`gpuprofd.sampling.rollup.gpu_rows`) in one statement."""
    once = gpus_once(rows)
    if once:
        await txn.execute(GPUS_SQL, arrays(once, ("text", "text", "float8")))


async def upsert_seconds(txn: Txn, rows: Sequence[Sequence[Any]]) -> None:
    """Upsert ``gpu_seconds`` rows (:func:`gpuprofd.sampling.rollup.insert_params`)
    in one statement, a second sent again merged after it row by row."""
    first, again = split_repeats(rows)
    if first:
        await txn.execute(SECONDS_SQL, arrays(first, _SECONDS_KINDS))
    for r in again:
        await txn.execute(rollup.INSERT_SQL, r)


_PLAIN_INSERT = re.compile(r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES \((\?(?:, ?\?)*)\)")


def appended(sql: str) -> tuple[str, tuple[str, ...]]:
    """A plain ``INSERT INTO t (a, b) VALUES (?, ?)`` as the same insert of
    many rows from arrays (one per column: ``INSERT ... SELECT * FROM
    unnest(?::int8[], ?::float8[])``), to be a ``WITH`` part of another
    statement; and the arrays' element types (for :func:`arrays`)."""
    m = _PLAIN_INSERT.fullmatch(sql.strip())
    assert m is not None, sql
    table, columns = m.group(1), [c.strip() for c in m.group(2).split(",")]
    kinds = tuple(_column_types(table, columns))
    marks = ", ".join(f"?::{k}[]" for k in kinds)
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({marks})", kinds


#: Per row-by-row statement of :mod:`gpuprofd.storage.writes.ingest`: its bulk upsert.
BULK = {rollup.GPU_SQL: upsert_gpus, rollup.INSERT_SQL: upsert_seconds}
