"""The rollups' rows: each ended run's GPU-hours (``run_costs``) and their
loss by finding (``run_cost_findings``), from :func:`gpuprof.gpuhours.run_cost`.

Written when a run ends (its summary stored) and again whenever a forwarded
batch touches an ended run (a late end, a new summary, a project set after
the fact): :func:`refresh` replaces a run's rows, so the rollups, summed by
SQL (:mod:`gpuprofd.storage.reads.rollups`), always match its summary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpuprof.gpuhours import run_cost
from gpuprofd.storage import unreadable
from gpuprofd.storage.writes.ops import Txn
from gpuprofd.storage.writes.store import Store

log = logging.getLogger(__name__)

_COLUMNS = (
    "id, run_name, user_name, project, node_id, host, start_wall_ns, "
    "end_wall_ns, gpu_count, summary"
)
#: Runs read per statement (well under SQLite's 32766 bound parameters).
_CHUNK = 500
_INSERT_COST = (
    "INSERT INTO run_costs (run_id, at_wall_ns, run_name, user_name, project, node, "
    "gpu_hours, usd, lost_gpu_hours, lost_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_FINDING = (
    "INSERT INTO run_cost_findings (run_id, rule, at_wall_ns, lost_gpu_hours, lost_usd, fix) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


async def refresh(txn: Txn, run_ids: Sequence[int]) -> int:
    """Replace the rollup rows of *run_ids* inside *txn*: an ended run with
    a summary gets its rows, any other (running, no summary) none.

    Returns:
        The runs that now have a row.
    """
    costs, findings, ids = [], [], sorted(set(run_ids))
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        await txn.execute(f"DELETE FROM run_costs WHERE run_id IN ({marks})", chunk)
        await txn.execute(f"DELETE FROM run_cost_findings WHERE run_id IN ({marks})", chunk)
        rows = await txn.fetch(
            f"SELECT {_COLUMNS} FROM runs WHERE id IN ({marks}) "
            "AND status <> 'running' AND summary IS NOT NULL",
            chunk,
        )
        for rid, name, user, project, node_id, host, start, end, gpus, text in rows:
            summary = unreadable.json_cell(text, "runs.summary", rid)
            run = {"start_wall_ns": start, "end_wall_ns": end, "gpu_count": gpus}
            cost = run_cost(run, summary)
            if cost is None:
                continue
            at = end if end is not None else start
            costs.append(
                (
                    rid,
                    at,
                    name,
                    user,
                    project,
                    node_id or host,
                    cost.gpu_hours,
                    cost.usd,
                    cost.lost_gpu_hours,
                    cost.lost_usd,
                )
            )
            rate = cost.usd / cost.gpu_hours if cost.usd is not None and cost.gpu_hours else None
            for rule, hours in cost.by_rule.items():
                usd = None if rate is None else hours * rate
                findings.append((rid, rule, at, hours, usd, cost.fixes.get(rule)))
    await txn.executemany(_INSERT_COST, costs)
    await txn.executemany(_INSERT_FINDING, findings)
    return len(costs)


async def refresh_runs(store: Store, run_ids: Sequence[int]) -> int:
    """:func:`refresh` in a transaction of its own (a node's run that ended)."""
    return int(await store.transaction(lambda txn: refresh(txn, run_ids), "run costs"))


async def refresh_all(store: Store, missing_only: bool = False) -> int:
    """:func:`refresh` every run (a rebuild); *missing_only*: only the ended
    runs with a summary and no row yet (a database upgraded to schema 16)."""
    sql = "SELECT id FROM runs"
    if missing_only:
        sql += (
            " WHERE status <> 'running' AND summary IS NOT NULL"
            " AND id NOT IN (SELECT run_id FROM run_costs)"
        )
    ids = [int(r[0]) for r in await store.fetchall(sql)]
    done = 0
    for i in range(0, len(ids), _CHUNK):
        done += await refresh_runs(store, ids[i : i + _CHUNK])
    return done


async def backfill(store: Store) -> int:
    """The rows of ended runs stored before schema 16 (a node's or a team
    server's database upgraded), made once at start; a failure is logged and
    the rollups then lack those runs. Returns the runs given rows."""
    try:
        made = await refresh_all(store, missing_only=True)
    except Exception:  # noqa: BLE001 - the daemon goes on; said in its log
        log.exception("the GPU-hours rows of older runs were not made")
        return 0
    if made:
        log.info("GPU-hours rows made for %d runs stored before", made)
    return made
