"""The one read path of a run's steps, wherever they are stored: its recent
steps as ``steps`` rows, its older ones packed per block into ``step_packs``
(:mod:`gpuprofd.storage.upkeep.steppack`, :mod:`gpuprofd.storage.stepcodec`).
Every reader of steps (the rules' context, the charts, ``gpuprofctl``, the
upkeep passes) reads through here, so none sees a run half packed otherwise
than the others: a block is packed in one transaction (its rows inserted
packed and deleted as rows together), and a step arriving for a packed block
later stays a row, read beside the pack.

Rows are tuples in :data:`COLUMNS`' order (``phases`` a dict, None where
NULL; ``optimizers`` its JSON text), ordered by ``t0_ns`` (NULL first) then
insertion, as ``ORDER BY t0_ns, rowid`` orders rows. A ``phases`` that is
not a JSON object reads as None, and a packed block whose bytes are damaged
is left out, each counted (:mod:`gpuprofd.storage.unreadable`).

SQL over ``steps`` rows is left only where no step can be packed: the
per-block tiers (``step_rollups``, ``step_totals``) roll blocks not yet
written, and a block is packed only once both hold it; the charts' buckets
go through :func:`rows` wherever :func:`packed_in` says a window holds a
packed block; a run's last :data:`gpuprofd.storage.upkeep.steppack.STEPS_RAW_KEPT`
steps are never packed, so its latest step is a row.

:func:`columns` reads a run's steps as numpy columns
(:class:`gpuprofd.storage.stepcodec.Columns`) for the readers that compute
over every step (the rules' context: a day's 172,800 steps), without a
Python object per packed step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpuprofd.storage import unreadable
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.stepcodec import COLUMNS, PHASES, Columns, unpack

__all__ = [
    "BY_NAME_SQL",
    "COLUMNS",
    "Columns",
    "columns",
    "TOTAL_SQL",
    "count",
    "count_after",
    "last_rows",
    "latest_t1",
    "max_step",
    "packed_end",
    "packed_in",
    "rows",
]

#: Steps per packed block, by index (``block = step / STEP_PACK``): ten
#: ``step_rollups`` blocks, ~17 min of 1 s steps.
STEP_PACK = 1000
_COLS = ", ".join(COLUMNS)
_NONE = 2**62
#: A run's packed blocks (``k`` 0: ``data``) and its rows (``k`` 1: the
#: columns) with indices ``BETWEEN ? AND ?`` in one statement, so one
#: snapshot: a block packed meanwhile is read either packed or as rows, never
#: both or neither. Blocks by index, rows by ``t0`` (NULL first), then
#: insertion. ``{packs}`` / ``{rows}``: a time condition or nothing.
_READ_SQL = (
    "SELECT 0 AS k, block AS b, data, "
    + ", ".join(f"NULL AS {c}" for c in COLUMNS)
    + ", 0 AS r FROM step_packs WHERE run_id = ? AND last_step >= ? AND first_step <= ? {packs} "
    "UNION ALL SELECT 1, CASE WHEN t0_ns IS NULL THEN 0 ELSE 1 END, NULL, "
    + _COLS
    + ", rowid FROM steps WHERE run_id = ? AND step >= ? AND step <= ? {rows} "
    "ORDER BY k, b, t0_ns, r"
)
_WHOLE_SQL = _READ_SQL.format(packs="", rows="")
_TIMED_SQL = _READ_SQL.format(
    packs="AND t0_max_ns >= ? AND t0_min_ns < ?", rows="AND t0_ns >= ? AND t0_ns < ?"
)
_NCOLS = len(COLUMNS)
_COUNT_SQL = (
    "SELECT (SELECT COUNT(*) FROM steps WHERE run_id = ?) AS raw, "
    "(SELECT SUM(n) FROM step_packs WHERE run_id = ?) AS packed"
)
_MAX_STEP_SQL = (
    "SELECT (SELECT MAX(step) FROM steps WHERE run_id = ?) AS raw, "
    "(SELECT MAX(last_step) FROM step_packs WHERE run_id = ?) AS packed"
)
_LATEST_T1_SQL = (
    "SELECT (SELECT MAX(t1_ns) FROM steps WHERE run_id = ?) AS raw, "
    "(SELECT MAX(t1_max_ns) FROM step_packs WHERE run_id = ?) AS packed"
)
#: Every run's steps stored, packed or not (one row: ``n``), for tools that
#: count a whole database's.
TOTAL_SQL = (
    "SELECT (SELECT COUNT(*) FROM steps) + COALESCE((SELECT SUM(n) FROM step_packs), 0) AS n"
)
#: ... and per run name (``run_name``, ``n``).
BY_NAME_SQL = (
    "SELECT r.run_name AS run_name, SUM((SELECT COUNT(*) FROM steps s WHERE s.run_id = r.id) "
    "+ COALESCE((SELECT SUM(n) FROM step_packs p WHERE p.run_id = r.id), 0)) AS n "
    "FROM runs r GROUP BY r.run_name"
)
_PACKED_END_SQL = "SELECT MAX(block) AS b FROM step_packs WHERE run_id = ?"


def _t0(row: Sequence[Any]) -> int:
    t0 = row[1]
    return -_NONE if t0 is None else t0


def _parsed(row: Sequence[Any], run_id: int) -> tuple[Any, ...]:
    row = tuple(row)  # a database row's slices cost more than a tuple's
    phases = row[PHASES]
    if phases is None:
        return row
    got = unreadable.json_cell(phases, "steps.phases", run_id, row[0], empty=unreadable.null)
    return row[:PHASES] + (got,) + row[PHASES + 1 :]


def _phases(texts: Sequence[Any], run_id: int, step: Callable[[int], Any]) -> list[Any]:
    """The ``phases`` texts of rows as dicts, None where NULL or unreadable
    (counted, the *i*-th named by ``step(i)``)."""
    return unreadable.json_cells(texts, "steps.phases", run_id, step, empty=unreadable.null)


def _blocks(packs: Sequence[tuple[int, Any]], run_id: int) -> list[Columns]:
    """The ``(block, data)`` *packs* as columns: a damaged one left out, a
    ``phases`` that is not an object read as None (each counted)."""
    out = []
    for b, data in packs:
        cols = unreadable.block(data, unpack, "step_packs", run_id, b)
        if cols is None:
            continue
        dicts = cols.phase_dicts  # kept as stored where not all flat objects
        if dicts is not None and not all(d is None or type(d) is dict for d in dicts):
            steps = cols.column("step")
            cols.set_phases(
                [
                    unreadable.shaped(d, "steps.phases", run_id, steps[i], empty=unreadable.null)
                    if d is not None
                    else None
                    for i, d in enumerate(dicts)
                ]
            )
        out.append(cols)
    return out


async def rows(
    db: Reader,
    run_id: int,
    *,
    first_step: int = -_NONE,
    last_step: int = _NONE,
    t0_from: int | None = None,
    t0_before: int | None = None,
    parsed: bool = True,
) -> list[Sequence[Any]]:
    """The run's steps with ``first_step <= step <= last_step`` (and, if
    given, ``t0_from <= t0_ns < t0_before``, ns: a row without ``t0`` is then
    left out), packed or not, in :data:`COLUMNS`' order, by ``t0`` (NULL
    first) then insertion. *parsed* False: the ``phases`` of the steps stored
    as rows as they are (JSON text; a packed step's is a dict), for a
    converter that parses them itself (:func:`queries.step_from_row`).

    Raises:
        DatabaseError: unreadable.
    """
    timed = t0_from is not None or t0_before is not None
    lo = -_NONE if t0_from is None else t0_from
    hi = _NONE if t0_before is None else t0_before
    packs, raw = await _read(db, run_id, first_step, last_step, (lo, hi) if timed else None)
    packed = [r for cols in _blocks(packs, run_id) for r in cols.rows()]
    if packed:
        packed = [
            r
            for r in packed
            if first_step <= r[0] <= last_step
            and (not timed or (r[1] is not None and lo <= r[1] < hi))
        ]
    rows_: list[Sequence[Any]] = [_parsed(r, run_id) for r in raw] if parsed else raw
    if not packed:
        return rows_
    out = packed + rows_
    out.sort(key=_t0)  # stable: packed rows (inserted first) before raw ones of one t0
    return out


async def _read(
    db: Reader, run_id: int, first: int, last: int, times: tuple[int, int] | None
) -> tuple[list[tuple[int, Any]], list[tuple[Any, ...]]]:
    """(the packed blocks' ``(block, data)``, the rows) of :data:`_READ_SQL`; of the rows
    alone, by the index, where the run had no pack before or after reading
    them (packs are only ever added: none was added meanwhile)."""
    if await packed_end(db, run_id) is None:
        nulls = " NULLS FIRST" if db.dialect.name == "postgres" else ""  # SQLite's way
        timed = "" if times is None else "AND t0_ns >= ? AND t0_ns < ? "
        sql = (
            f"SELECT {_COLS} FROM steps WHERE run_id = ? AND step >= ? AND step <= ? "
            f"{timed}ORDER BY t0_ns{nulls}, rowid"
        )
        got = await db.fetchtuples(sql, (run_id, first, last, *(times or ())))
        if await packed_end(db, run_id) is None:
            return [], got
    if times is None:
        got = await db.fetchtuples(_WHOLE_SQL, (run_id, first, last, run_id, first, last))
    else:
        got = await db.fetchtuples(
            _TIMED_SQL, (run_id, first, last, *times, run_id, first, last, *times)
        )
    packs = [(r[1], r[2]) for r in got if r[0] == 0]
    raw = [tuple(r[3 : 3 + _NCOLS]) for r in got if r[0] == 1]
    return packs, raw


async def columns(db: Reader, run_id: int) -> Columns:
    """Every step of the run, packed or not, as numpy columns
    (:class:`gpuprofd.storage.stepcodec.Columns`), in :func:`rows`' order:
    packed blocks are not made rows on the way (a day of steps is 172,800).

    Raises:
        DatabaseError: unreadable.
    """
    packs, raw = await _read(db, run_id, -_NONE, _NONE, None)
    parts = _blocks(packs, run_id)
    parts.append(Columns.from_rows(raw, lambda t: _phases(t, run_id, lambda i: raw[i][0])))
    cols = Columns.concat(parts)
    if not parts[:-1] or "t0_ns" in cols.objects:
        return cols  # rows only (by t0 already), or t0s that are not integers: as stored
    t0 = cols.ints["t0_ns"]
    nulls = cols.nulls.get("t0_ns")
    key = t0 if nulls is None else np.where(nulls, np.iinfo(np.int64).min, t0)
    if len(key) > 1 and bool((key[1:] >= key[:-1]).all()):
        return cols  # in order already (as a run's steps are, as a rule)
    return cols.take(np.argsort(key, kind="stable"))


async def last_rows(
    db: Reader, run_id: int, limit: int, *, last_step: int = _NONE, by_step: bool = False
) -> list[tuple[Any, ...]]:
    """The run's last *limit* steps with an index up to *last_step*, newest
    last: by ``t0`` (then insertion), or by index with *by_step*. Reads the
    ``steps`` rows first and packed blocks only where those are too few."""
    order = "step DESC, rowid DESC" if by_step else "t0_ns DESC, rowid DESC"
    got = await db.fetchtuples(
        f"SELECT {_COLS} FROM steps WHERE run_id = ? AND step <= ? ORDER BY {order} LIMIT ?",
        (run_id, last_step, limit),
    )
    newest = [_parsed(r, run_id) for r in reversed(got)]
    if len(newest) >= limit or await packed_end(db, run_id) is None:
        return newest
    every = await rows(db, run_id, last_step=last_step)
    if by_step:
        every.sort(key=lambda r: r[0])
    return every[-limit:]


async def packed_in(
    db: Reader, run_id: int, t0_from: int | None = None, t0_before: int | None = None
) -> bool:
    """Whether any of the run's packed blocks has a step starting in
    [*t0_from*, *t0_before*) (ns; None: unbounded): whether a read of that
    window must go through :func:`rows` rather than SQL over ``steps``."""
    lo = -_NONE if t0_from is None else t0_from
    hi = _NONE if t0_before is None else t0_before
    row = await db.fetchone(
        "SELECT 1 AS x FROM step_packs WHERE run_id = ? AND (t0_max_ns IS NULL OR "
        "(t0_max_ns >= ? AND t0_min_ns < ?)) LIMIT 1",
        (run_id, lo, hi),
    )
    return row is not None


async def count_after(db: Reader, run_id: int, step: int) -> tuple[int, int | None]:
    """(the run's steps with an index above *step*, packed or not, the
    highest index; None: none): packed blocks wholly above counted by their
    ``n``, the one *step* falls in read."""
    row = await db.fetchone(
        "SELECT (SELECT COUNT(*) FROM steps WHERE run_id = ?1 AND step > ?2) AS raw, "
        "(SELECT SUM(n) FROM step_packs WHERE run_id = ?1 AND first_step > ?2) AS packed",
        (run_id, step),
    )
    n = 0 if row is None else int(row["raw"] or 0) + int(row["packed"] or 0)
    cut = await db.fetchall(
        "SELECT block, data FROM step_packs WHERE run_id = ? AND first_step <= ? AND last_step > ?",
        (run_id, step, step),
    )
    blocks = _blocks([(b, data) for b, data in cut], run_id)
    n += sum(1 for cols in blocks for i in cols.column("step") if i > step)
    return n, (await max_step(db, run_id) if n else None)


async def count(db: Reader, run_id: int) -> int:
    """How many steps the run stored, packed or not."""
    row = await db.fetchone(_COUNT_SQL, (run_id, run_id))
    return 0 if row is None else int(row["raw"] or 0) + int(row["packed"] or 0)


async def max_step(db: Reader, run_id: int) -> int | None:
    """The run's highest step index; None without steps."""
    row = await db.fetchone(_MAX_STEP_SQL, (run_id, run_id))
    got = [] if row is None else [int(v) for v in (row["raw"], row["packed"]) if v is not None]
    return max(got) if got else None


async def latest_t1(db: Reader, run_id: int) -> int | None:
    """The latest ``t1_ns`` of the run's steps; None without one."""
    row = await db.fetchone(_LATEST_T1_SQL, (run_id, run_id))
    got = [] if row is None else [int(v) for v in (row["raw"], row["packed"]) if v is not None]
    return max(got) if got else None


async def packed_end(db: Reader, run_id: int) -> int | None:
    """The index after the run's last packed block (every step below it may
    be packed); None: nothing packed."""
    row = await db.fetchone(_PACKED_END_SQL, (run_id,))
    return None if row is None or row["b"] is None else (int(row["b"]) + 1) * STEP_PACK
