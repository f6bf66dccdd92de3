"""Which runs a database holds: one run by id or key (:func:`get_run`, with
an error naming the ids there are), the runs list with each run's step
aggregates (:func:`runs_overview`, from the ``step_totals`` tier of
:mod:`gpuprofd.storage.reads.steptotals`), the nodes runs came from.

Each read is ``async def f(db: Reader, ...)`` over a
:class:`gpuprofd.storage.reader.Reader`; the SQL is in the subset both
engines run (:mod:`gpuprofd.storage.dialect`), what differs goes through
``db.dialect``.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Sequence
from typing import Any

from gpuprof.protocol import clean_run_name
from gpuprofd.core.errors import UnknownRunError
from gpuprofd.storage.dialect import Dialect
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import queries, steprows, steptotals
from gpuprofd.storage.sqlite import MISSING_HINT

# --- runs ---------------------------------------------------------------------


async def run_ids(db: Reader) -> list[int]:
    """Every run id in the database, ascending."""
    return [int(r["id"]) for r in await db.fetchall("SELECT id FROM runs ORDER BY id")]


def _id_ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` -> ``"1-3, 5, 7-8"``."""
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _runs_command(where: str) -> str:
    """``gpuprofctl runs WHERE`` for a file, ``... --storage-url URL`` for a server."""
    if "://" in where:
        return f"gpuprofctl runs --storage-url {shlex.quote(where)}"
    return f"gpuprofctl runs {shlex.quote(where)}"


async def get_run(db: Reader, run_id: int | None) -> dict[str, Any]:
    """Run *run_id*, or the latest run if None.

    Raises:
        UnknownRunError: no such run (or no runs at all), naming the database
            (``db.where``) and the ids it does hold.
    """
    where = db.where
    if run_id is None:
        row = await db.fetchone("SELECT * FROM runs ORDER BY id DESC LIMIT 1")
        if row is None:
            raise UnknownRunError(f"no runs yet in {where} ({MISSING_HINT})")
    else:
        row = await db.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
        if row is None:
            ids = await run_ids(db)
            if not ids:
                raise UnknownRunError(
                    f"no run {run_id} in {where}: it has no runs yet ({MISSING_HINT})"
                )
            label = "run" if len(ids) == 1 else "runs"
            see = f"{label} {_id_ranges(ids)}; see {_runs_command(where)}"
            raise UnknownRunError(f"no run {run_id} in {where} ({see})")
    return queries.run_from_row(row)


#: Run names an unknown name's message lists (the newest).
NAMES_LISTED = 10
#: Characters of the unknown name itself that message repeats (one line, not
#: a 200-character name back).
NAME_SHOWN_CHARS = 60


async def find_run_named(db: Reader, name: str) -> dict[str, Any] | None:
    """The latest run (highest id) of the name *name* as stored (cleaned:
    :func:`clean_run_name`); None if none is."""
    row = await db.fetchone(
        "SELECT * FROM runs WHERE run_name = ? ORDER BY id DESC LIMIT 1", (clean_run_name(name),)
    )
    return None if row is None else queries.run_from_row(row)


async def latest_run_named(db: Reader, name: str) -> dict[str, Any]:
    """The latest run (highest id) of the name *name*, as the run stored it:
    cleaned as ``gpuprof.profile`` names are (:func:`clean_run_name`:
    control characters as spaces, cut to 200 characters), so the name the
    training script gave finds its run.

    Raises:
        UnknownRunError: no run has that name, naming the database and the
            latest :data:`NAMES_LISTED` names it does hold.
    """
    run = await find_run_named(db, name)
    if run is not None:
        return run
    rows = await db.fetchall(
        "SELECT run_name FROM runs GROUP BY run_name ORDER BY MAX(id) DESC LIMIT ?",
        (NAMES_LISTED + 1,),
    )
    names = [shlex.quote(r["run_name"][:60]) for r in rows]
    asked = repr(name if len(name) <= NAME_SHOWN_CHARS else name[: NAME_SHOWN_CHARS - 1] + "…")
    if not names:
        raise UnknownRunError(f"no run named {asked} in {db.where}: it has no runs yet")
    more = ", ..." if len(names) > NAMES_LISTED else ""
    raise UnknownRunError(
        f"no run named {asked} in {db.where} (names here, newest first: "
        f"{', '.join(names[:NAMES_LISTED])}{more}; see {_runs_command(db.where)})"
    )


async def find_run(
    db: Reader, *, run_id: int | None = None, run_key: str | None = None
) -> dict[str, Any] | None:
    """One run row as a dict (``options`` parsed), by id or key; None if none."""
    if run_id is not None:
        row = await db.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
    else:
        row = await db.fetchone("SELECT * FROM runs WHERE run_key = ?", (run_key,))
    return queries.run_from_row(row) if row is not None else None


async def stored_seq(db: Reader, run_id: int) -> int:
    """The highest shim sequence number committed for run *run_id* (0: none)."""
    row = await db.fetchone("SELECT shim_seq FROM runs WHERE id = ?", (run_id,))
    return int(row[0] or 0) if row is not None else 0


async def runs_with_status(db: Reader, status: str) -> list[dict[str, Any]]:
    """The runs with *status*, by id."""
    rows = await db.fetchall("SELECT * FROM runs WHERE status = ? ORDER BY id", (status,))
    return [queries.run_from_row(r) for r in rows]


# --- every run ------------------------------------------------------------------


#: Per-run step aggregates for ``gpuprofctl runs``: see
#: :mod:`gpuprofd.storage.reads.steptotals` for what each is. ``data_ns`` is loader
#: time inside steps (the ``data`` phase, between micro-batches); ``comm_ns``
#: the exposed collective time (the ``comm`` phase), ``comm_steps`` the counted
#: steps that carry one (0: the run timed no collectives); ``micro`` the
#: micro-batches of the counted steps (a step stored without a count is 1).
#: *where* picks the runs (whole runs: ``WHERE run_id ...``).
@functools.cache
def overview_sql(d: Dialect, where: str = "") -> str:
    numbered = steptotals.numbered_sql(where)
    return (
        f"WITH numbered AS ({numbered}) SELECT run_id, {steptotals.aggregates_sql(d)} "
        "FROM numbered GROUP BY run_id"
    )


#: Runs whose steps one aggregate query reads (a page of the runs list is 100).
_AGG_CHUNK = 200


def _ids_in(n: int) -> str:
    return f"WHERE run_id IN ({', '.join('?' * n)})"


async def step_aggregates(db: Reader, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Run id -> its step aggregates (:func:`overview_sql`'s columns) for the
    runs *run_ids*; runs without steps are left out. Each is the sum of its
    ``step_totals`` blocks and of its steps after them
    (:mod:`gpuprofd.storage.reads.steptotals`), or, for a run without blocks (a
    running run's first block still filling, a database not rolled yet),
    computed from its steps (by the steps index: only these runs' steps)."""
    out: dict[int, dict[str, Any]] = {}
    tail_sql = steptotals.tail_sql(db.dialect)
    for first in range(0, len(run_ids), _AGG_CHUNK):
        part = list(run_ids[first : first + _AGG_CHUNK])
        blocks = await db.fetchall(steptotals.sum_sql(_ids_in(len(part))), part)
        rolled = {b["run_id"] for b in blocks}
        rest = [i for i in part if i not in rolled]
        if rest:
            sql = overview_sql(db.dialect, _ids_in(len(rest)))
            out.update((r["run_id"], dict(r)) for r in await db.fetchall(sql, rest))
        for b in blocks:
            head = await db.fetchone(steptotals.FIRST_SQL, (b["run_id"],))
            end = (b["last_block"] + 1) * steptotals.STEP_BLOCK
            tail = await db.fetchone(tail_sql, (head["r"], b["run_id"], end))
            out[b["run_id"]] = steptotals.combine(b, tail)
    return out


async def run_nodes(db: Reader) -> list[dict[str, Any]]:
    """The nodes runs came from, by host name: ``node`` (a team server's
    ``node_id``; None on a node's own database), ``host``, ``runs`` (how
    many) and ``last_start_wall_ns`` (its latest run's start)."""
    rows = await db.fetchall(
        "SELECT node_id AS node, host, COUNT(*) AS runs, MAX(start_wall_ns) AS last_start_wall_ns "
        "FROM runs GROUP BY node_id, host ORDER BY host, node_id"
    )
    return [dict(r) for r in rows]


async def group_runs(db: Reader, group: str) -> list[dict[str, Any]]:
    """*group*'s runs (``group_id``), by rank, without step aggregates."""
    rows = await db.fetchall("SELECT * FROM runs WHERE group_id = ? ORDER BY rank, id", (group,))
    return [queries.run_from_row(r) for r in rows]


async def runs_overview(db: Reader, group: str | None = None) -> list[dict[str, Any]]:
    """Every run with its step aggregates (``agg``, :func:`overview_sql`),
    newest first; with *group*, only that group's runs (``group_id``), by rank."""
    runs = await runs_rows(db, group)
    await add_step_aggregates(db, runs)
    return runs


async def runs_rows(db: Reader, group: str | None = None) -> list[dict[str, Any]]:
    """Every run row, newest first (with *group*: its runs, by rank), without
    their step aggregates (:func:`add_step_aggregates` adds them to those shown)."""
    if group is not None:
        return await group_runs(db, group)
    rows = await db.fetchall("SELECT * FROM runs ORDER BY id DESC")
    return [queries.run_from_row(r) for r in rows]


async def add_step_aggregates(db: Reader, runs: list[dict[str, Any]]) -> None:
    """Set each of *runs*' ``agg`` (:func:`step_aggregates`; None: no steps),
    reading only those runs' rows."""
    agg = await step_aggregates(db, [r["id"] for r in runs])
    for run in runs:
        run["agg"] = agg.get(run["id"])


async def run_overview(db: Reader, run_id: int) -> dict[str, Any]:
    """Run *run_id* with its step aggregates (``agg``) as :func:`runs_overview`
    gives each run.

    Raises:
        UnknownRunError: no such run.
    """
    run = await get_run(db, run_id)
    run["agg"] = (await step_aggregates(db, [run_id])).get(run_id)
    return run


async def insights_computed_ns(db: Reader, run_id: int) -> int | None:
    """When the run's stored findings were computed (wall ns); None: none stored."""
    row = await db.fetchone(
        "SELECT MAX(created_wall_ns) AS t FROM insights WHERE run_id = ?", (run_id,)
    )
    return None if row is None or row["t"] is None else int(row["t"])


async def worst_iteration_ns(db: Reader, run_id: int, skip: int) -> int | None:
    """The run's slowest iteration (loader wait + step, ns) among its
    untraced steps after its first *skip* (by ``t0``); None without any."""
    got = [
        (r[3] or 0) + r[2] - r[1]
        for r in await steprows.rows(db, run_id)
        if not r[13] and r[2] is not None
    ]
    return max(got[skip:], default=None)
