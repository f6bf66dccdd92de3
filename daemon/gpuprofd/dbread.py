"""Read-only access to a gpuprof database for gpuprofctl (stdlib sqlite3).

Opens with ``file:…?mode=ro`` so reading never creates or changes a file,
and turns every way a file can be wrong into one :class:`DatabaseError` line.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpuprof.insights import RunContext, build_context
from gpuprofd import queries, schema
from gpuprofd.errors import DatabaseError, UnknownRunError

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
        conn = sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {path} ({exc})") from None
    conn.row_factory = sqlite3.Row
    try:
        if not schema.check_connection(conn, path):
            raise DatabaseError(f"{path} is an empty database, not a gpuprof one")
    except DatabaseError:
        conn.close()
        raise
    return conn


def _query(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"the database is damaged or incomplete ({exc})") from None


def get_run(conn: sqlite3.Connection, run_id: int | None) -> dict[str, Any]:
    """Run *run_id*, or the latest run if None.

    Raises:
        UnknownRunError: no such run (or no runs at all).
    """
    if run_id is None:
        rows = _query(conn, "SELECT * FROM runs ORDER BY id DESC LIMIT 1")
        if not rows:
            raise UnknownRunError("the database has no runs yet")
    else:
        rows = _query(conn, "SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise UnknownRunError(f"no run with id {run_id} in this database")
    return queries.run_from_row(rows[0])


def run_context(conn: sqlite3.Connection, run: dict[str, Any]) -> RunContext:
    """Rebuild a run's :class:`RunContext` from its stored rows."""
    steps = [queries.step_from_row(r) for r in _query(conn, queries.STEPS_SQL, (run["id"],))]
    host: list[dict[str, Any]] = []
    end = run.get("end_mono_ns") or (steps[-1]["t1"] if steps else None)
    if run.get("start_mono_ns") is not None and end is not None:
        host = [dict(r) for r in _query(conn, queries.HOST_SQL, (run["start_mono_ns"], end))]
    history = [
        float(r["median_step_ms"])
        for r in _query(
            conn, queries.HISTORY_SQL, (run["run_name"], run["id"], queries.HISTORY_RUNS)
        )
    ]
    return build_context(run, steps, host, history)


def stored_insights(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    return [queries.insight_from_row(r) for r in _query(conn, queries.INSIGHTS_SQL, (run_id,))]


#: Per-run step aggregates for ``gpuprofctl runs``; the first step (by t0) is
#: excluded from the loader-wait share, as the dataloader rule does.
_OVERVIEW_SQL = """
WITH first AS (
    SELECT run_id, MIN(t0_ns) AS t0 FROM steps GROUP BY run_id
)
SELECT s.run_id AS run_id,
       COUNT(*) AS steps,
       SUM(s.t1_ns - s.t0_ns) AS step_ns,
       SUM(COALESCE(json_extract(s.phases, '$.forward'), 0)) AS forward_ns,
       SUM(COALESCE(json_extract(s.phases, '$.backward'), 0)) AS backward_ns,
       SUM(COALESCE(json_extract(s.phases, '$.optimizer'), 0)) AS optimizer_ns,
       SUM(CASE WHEN s.t0_ns = f.t0 THEN 0 ELSE s.wait_ns END) AS wait_ns,
       SUM(CASE WHEN s.t0_ns = f.t0 THEN 0 ELSE s.t1_ns - s.t0_ns END) AS steady_step_ns
FROM steps s JOIN first f ON f.run_id = s.run_id
GROUP BY s.run_id
"""


def runs_overview(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every run with its step aggregates, newest first."""
    agg = {r["run_id"]: dict(r) for r in _query(conn, _OVERVIEW_SQL)}
    out = []
    for r in _query(conn, "SELECT * FROM runs ORDER BY id DESC"):
        run = queries.run_from_row(r)
        run["agg"] = agg.get(run["id"])
        out.append(run)
    return out
