"""The team's GPU-hours for a period, summed by SQL over the rollup rows
(``run_costs``, ``run_cost_findings``: one row per ended run and per finding
of it, written when the run ends, :mod:`gpuprofd.storage.writes.costs`).

A run counts in the period its end falls in (``at_wall_ns``). Every figure
is a sum of those rows, so the page for 10,000 runs reads a few thousand
numbers, never a summary (``bench/rollups.py`` times it on both backends).
Hours are GPU-hours, dollars USD at the cost line's rate.
"""

from __future__ import annotations

from typing import Any

from gpuprofd.storage.reader import Reader

#: How a rollup can be grouped: name -> the run_costs column.
GROUPS = {"user": "user_name", "project": "project", "node": "node", "run": "run_name"}
#: ... and by finding (run_cost_findings.rule).
BY_FINDING = "finding"
#: One week, ns: the page's bars and the trend.
WEEK_NS = 7 * 86400 * 10**9
#: The worst runs a group's row links to.
WORST_RUNS = 3
#: The recurring findings listed.
TOP_FINDINGS = 10


def _f(x: Any) -> float:
    return float(x or 0.0)


def _money(x: Any) -> float | None:
    return None if x is None else float(x)


async def _totals(db: Reader, since_ns: int, until_ns: int) -> dict[str, Any]:
    row = await db.fetchone(
        "SELECT COUNT(*), SUM(gpu_hours), SUM(usd), SUM(lost_gpu_hours), SUM(lost_usd) "
        "FROM run_costs WHERE at_wall_ns >= ? AND at_wall_ns < ?",
        (since_ns, until_ns),
    )
    hours, lost = _f(row[1]), _f(row[3])
    return {
        "runs": int(row[0]),
        "gpu_hours": hours,
        "usd": _money(row[2]),
        "lost_gpu_hours": lost,
        "lost_usd": _money(row[4]),
        "lost_share": lost / hours if hours else None,
    }


async def _by_column(
    db: Reader, col: str, since_ns: int, until_ns: int, all_hours: float
) -> list[dict[str, Any]]:
    """Groups by a run_costs column, this period and the one before it (trend)."""
    prev = since_ns - (until_ns - since_ns)
    rows = await db.fetchall(
        f"SELECT {col} AS k, "
        "SUM(CASE WHEN at_wall_ns >= ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN at_wall_ns >= ? THEN gpu_hours ELSE 0 END), "
        "SUM(CASE WHEN at_wall_ns >= ? THEN usd END), "
        "SUM(CASE WHEN at_wall_ns >= ? THEN lost_gpu_hours ELSE 0 END), "
        "SUM(CASE WHEN at_wall_ns >= ? THEN lost_usd END), "
        "SUM(CASE WHEN at_wall_ns < ? THEN gpu_hours ELSE 0 END), "
        "SUM(CASE WHEN at_wall_ns < ? THEN lost_gpu_hours ELSE 0 END) "
        f"FROM run_costs WHERE at_wall_ns >= ? AND at_wall_ns < ? GROUP BY {col}",
        (*(since_ns,) * 7, prev, until_ns),
    )
    out = []
    for k, n, hours, usd, lost, lost_usd, prev_hours, prev_lost in rows:
        if not n:
            continue  # only the period before: shown by no row, counted in no trend
        hours, lost = _f(hours), _f(lost)
        out.append(
            {
                "key": k,
                "runs": int(n),
                "gpu_hours": hours,
                "usd": _money(usd),
                "lost_gpu_hours": lost,
                "lost_usd": _money(lost_usd),
                "share": hours / all_hours if all_hours else None,
                "lost_share": lost / hours if hours else None,
                "prev_gpu_hours": _f(prev_hours),
                "prev_lost_gpu_hours": _f(prev_lost),
                "trend": (hours - _f(prev_hours)) / _f(prev_hours) if prev_hours else None,
                "lost_trend": (lost - _f(prev_lost)) / _f(prev_lost) if prev_lost else None,
            }
        )
    out.sort(key=lambda g: (-g["gpu_hours"], str(g["key"])))
    return out


async def _worst_runs(
    db: Reader, col: str, since_ns: int, until_ns: int
) -> dict[Any, list[dict[str, Any]]]:
    """Each group's :data:`WORST_RUNS` runs that lost the most GPU-hours."""
    rows = await db.fetchall(
        "SELECT k, run_id, run_name, lost_gpu_hours, gpu_hours FROM ("
        f"SELECT {col} AS k, run_id, run_name, lost_gpu_hours, gpu_hours, ROW_NUMBER() OVER "
        f"(PARTITION BY {col} ORDER BY lost_gpu_hours DESC, run_id DESC) AS n "
        "FROM run_costs WHERE at_wall_ns >= ? AND at_wall_ns < ? AND lost_gpu_hours > 0"
        ") AS ranked WHERE n <= ? ORDER BY k, n",
        (since_ns, until_ns, WORST_RUNS),
    )
    out: dict[Any, list[dict[str, Any]]] = {}
    for k, rid, name, lost, hours in rows:
        out.setdefault(k, []).append(
            {"id": int(rid), "run_name": name, "lost_gpu_hours": _f(lost), "gpu_hours": _f(hours)}
        )
    return out


async def _findings(
    db: Reader, since_ns: int, until_ns: int, all_hours: float, limit: int | None
) -> list[dict[str, Any]]:
    """Lost GPU-hours by finding, the costliest first, with a fix each."""
    prev = since_ns - (until_ns - since_ns)
    rows = await db.fetchall(
        "SELECT rule, "
        "SUM(CASE WHEN at_wall_ns >= ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN at_wall_ns >= ? THEN lost_gpu_hours ELSE 0 END), "
        "SUM(CASE WHEN at_wall_ns >= ? THEN lost_usd END), "
        "SUM(CASE WHEN at_wall_ns < ? THEN lost_gpu_hours ELSE 0 END) "
        "FROM run_cost_findings WHERE at_wall_ns >= ? AND at_wall_ns < ? GROUP BY rule",
        (since_ns, since_ns, since_ns, since_ns, prev, until_ns),
    )
    out = []
    for rule, n, lost, usd, prev_lost in rows:
        if not n:
            continue
        lost = _f(lost)
        out.append(
            {
                "key": rule,
                "rule": rule,
                "runs": int(n),
                "lost_gpu_hours": lost,
                "lost_usd": _money(usd),
                "share": lost / all_hours if all_hours else None,
                "prev_lost_gpu_hours": _f(prev_lost),
                "lost_trend": (lost - _f(prev_lost)) / _f(prev_lost) if prev_lost else None,
            }
        )
    out.sort(key=lambda f: (-f["lost_gpu_hours"], f["rule"]))
    out = out[:limit] if limit is not None else out
    for f in out:  # the newest run's finding of the rule says what to do
        fix = await db.fetchone(
            "SELECT fix FROM run_cost_findings WHERE rule = ? AND fix IS NOT NULL "
            "ORDER BY at_wall_ns DESC LIMIT 1",
            (f["rule"],),
        )
        f["fix"] = fix[0] if fix is not None else None
    return out


async def _weeks(db: Reader, since_ns: int, until_ns: int) -> list[dict[str, Any]]:
    """Lost GPU-hours by finding per week, oldest first; week 0 ends at *until_ns*."""
    rows = await db.fetchall(
        "SELECT (CAST(? AS BIGINT) - 1 - at_wall_ns) / CAST(? AS BIGINT) AS w, rule, "
        "SUM(lost_gpu_hours) FROM run_cost_findings WHERE at_wall_ns >= ? AND at_wall_ns < ? "
        "GROUP BY 1, 2",
        (until_ns, WEEK_NS, since_ns, until_ns),
    )
    n = max(1, -(-(until_ns - since_ns) // WEEK_NS))
    weeks = [
        {"start_ns": until_ns - (n - i) * WEEK_NS, "lost": {}} for i in range(n)
    ]  # oldest first
    for w, rule, lost in rows:
        i = n - 1 - int(w)
        if 0 <= i < n:
            weeks[i]["lost"][rule] = _f(lost)
    return weeks


async def rollup(db: Reader, by: str, since_ns: int, until_ns: int) -> dict[str, Any]:
    """The team's GPU-hours from *since_ns* to *until_ns* (wall ns), grouped
    *by* one of :data:`GROUPS` or :data:`BY_FINDING`.

    Returns:
        ``totals`` (runs, gpu_hours, usd, lost_gpu_hours, lost_usd,
        lost_share), ``groups`` (per key: those, its ``share`` of all
        GPU-hours, the period before's figures and ``trend`` /
        ``lost_trend``: the change over it, a fraction, None when it had
        none; ``worst_runs``), ``findings`` (the costliest, with a ``fix``),
        ``weeks`` (lost GPU-hours by finding per week, oldest first).

    Raises:
        ValueError: an unknown *by*, or an empty period.
    """
    if by not in GROUPS and by != BY_FINDING:
        raise ValueError(f"by must be one of {', '.join([*GROUPS, BY_FINDING])}, got {by!r}")
    if until_ns <= since_ns:
        raise ValueError("the period is empty: since must be before until")
    totals = await _totals(db, since_ns, until_ns)
    hours = totals["gpu_hours"]
    findings = await _findings(db, since_ns, until_ns, hours, None)
    if by == BY_FINDING:
        groups = findings
    else:
        col = GROUPS[by]
        groups = await _by_column(db, col, since_ns, until_ns, hours)
        worst = await _worst_runs(db, col, since_ns, until_ns)
        for g in groups:
            g["worst_runs"] = worst.get(g["key"], [])
    return {
        "by": by,
        "since_ns": since_ns,
        "until_ns": until_ns,
        "totals": totals,
        "groups": groups,
        "findings": findings[:TOP_FINDINGS],
        "weeks": await _weeks(db, since_ns, until_ns),
    }


async def all_time_by_project(db: Reader) -> list[tuple[str | None, float, float]]:
    """Every project's (project, GPU-hours, lost GPU-hours) over all stored
    runs, the project first seen (its first run's end) first: what
    ``/metrics`` counts (a project keeps its place as others come)."""
    rows = await db.fetchall(
        "SELECT project, SUM(gpu_hours), SUM(lost_gpu_hours), MIN(at_wall_ns) AS first "
        "FROM run_costs GROUP BY project ORDER BY first, project"
    )
    return [(r[0], _f(r[1]), _f(r[2])) for r in rows]


async def all_time_lost_by_rule(db: Reader) -> list[tuple[str | None, str, float]]:
    """(project, finding, lost GPU-hours) over all stored runs."""
    rows = await db.fetchall(
        "SELECT c.project, f.rule, SUM(f.lost_gpu_hours) FROM run_cost_findings f "
        "JOIN run_costs c ON c.run_id = f.run_id GROUP BY c.project, f.rule"
    )
    return [(r[0], str(r[1]), _f(r[2])) for r in rows]
