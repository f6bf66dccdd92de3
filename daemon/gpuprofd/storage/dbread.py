"""Read-only access to a gpuprof database for gpuprofctl (stdlib sqlite3).

Opens with :func:`gpuprofd.storage.readonly.connect_ro` (``mode=ro``: reading
never creates or changes a file), and turns every way a file can be wrong
into one :class:`DatabaseError` line.
"""

from __future__ import annotations

import shlex
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from gpuprof.insights import Insight, RunContext, build_context
from gpuprof.insights.distributed import GroupContext, group_rules
from gpuprof.insights.gpu import GpuStats
from gpuprof.insights.group_context import RankRows, build_group_context, common_steps
from gpuprofd.errors import DatabaseError, UnknownRunError
from gpuprofd.sampling import rollup
from gpuprofd.storage import queries, schema
from gpuprofd.storage.readonly import connect_ro

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
    conn.row_factory = sqlite3.Row
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


def _query(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"the database is damaged or incomplete ({exc})") from None


#: Public name of :func:`_query` for the commands.
query = _query


def run_ids(conn: sqlite3.Connection) -> list[int]:
    """Every run id in the database, ascending."""
    return [int(r["id"]) for r in _query(conn, "SELECT id FROM runs ORDER BY id")]


def _id_ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` -> ``"1-3, 5, 7-8"``."""
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def get_run(conn: sqlite3.Connection, run_id: int | None, db: Path | None = None) -> dict[str, Any]:
    """Run *run_id*, or the latest run if None; *db* (the file *conn* reads)
    only names the database in the error message.

    Raises:
        UnknownRunError: no such run (or no runs at all), naming the database
            and the ids it does hold.
    """
    where = str(db.absolute()) if db is not None else "this database"
    if run_id is None:
        rows = _query(conn, "SELECT * FROM runs ORDER BY id DESC LIMIT 1")
        if not rows:
            raise UnknownRunError(f"no runs yet in {where} ({MISSING_HINT})")
    else:
        rows = _query(conn, "SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            ids = run_ids(conn)
            if not ids:
                raise UnknownRunError(
                    f"no run {run_id} in {where}: it has no runs yet ({MISSING_HINT})"
                )
            label = "run" if len(ids) == 1 else "runs"
            see = f"; see gpuprofctl runs {shlex.quote(where)}" if db is not None else ""
            raise UnknownRunError(f"no run {run_id} in {where} ({label} {_id_ranges(ids)}{see})")
    return queries.run_from_row(rows[0])


def run_context(conn: sqlite3.Connection, run: dict[str, Any]) -> RunContext:
    """Rebuild a run's :class:`RunContext` from its stored rows."""
    steps = [queries.step_from_row(r) for r in _query(conn, queries.STEPS_SQL, (run["id"],))]
    host: list[dict[str, Any]] = []
    end = run.get("end_mono_ns") or (steps[-1]["t1"] if steps else None)
    if run.get("start_mono_ns") is not None and end is not None:
        params = (run["start_mono_ns"], end, run.get("boot_id"))
        host = [dict(r) for r in _query(conn, queries.HOST_SQL, params)]
    history = [
        float(r["median_step_ms"])
        for r in _query(
            conn, queries.HISTORY_SQL, (run["run_name"], run["id"], queries.HISTORY_RUNS)
        )
    ]
    workers = [dict(r) for r in _query(conn, queries.WORKER_CPU_SQL, (run["id"],))]
    run_cpu = [dict(r) for r in _query(conn, queries.RUN_CPU_SQL, (run["id"],))]
    job = queries.job_cpu_params(run)
    job_cpu = [dict(r) for r in _query(conn, queries.JOB_CPU_SQL, job)] if job else []
    return build_context(
        run, steps, host, history, run_cpu=run_cpu, gpu=gpu_stats(conn, run, steps),
        workers=workers, kernel_windows=kernel_windows(conn, run["id"]),
        comm=comm_totals(conn, run["id"]), job_cpu=job_cpu,
    )


def comm_totals(
    conn: sqlite3.Connection, run_id: int, steps: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The run's timed gradient buckets summed (:data:`queries.COMM_TOTALS_SQL`);
    with *steps* ``(first, last)``, those of the steps in that range only."""
    if steps is None:
        rows = _query(conn, queries.COMM_TOTALS_SQL, (run_id,))
    else:
        sql = queries.COMM_TOTALS_SQL + " AND step BETWEEN ? AND ?"
        rows = _query(conn, sql, (run_id, *steps))
    return dict(rows[0]) if rows else {"steps": 0, "buckets": 0, "bytes": 0}


def gpu_stats(
    conn: sqlite3.Connection, run: dict[str, Any], steps: list[dict[str, Any]]
) -> GpuStats | None:
    """The run's GPU stats while it was in steps, from its per-second rollups."""
    window = queries.gpu_window(run.get("cuda_uuid"), steps, run.get("boot_id"))
    if window is None:
        return None
    return queries.gpu_stats_from_rollups(_query(conn, rollup.MERGED_SQL, window))


def kernel_windows(conn: sqlite3.Connection, run_id: int) -> list[queries.KernelWindow]:
    """The run's kernel windows with their rows (see
    :func:`queries.kernel_windows_from_rows`)."""
    return queries.kernel_windows_from_rows(
        _query(conn, queries.KERNEL_WINDOWS_SQL, (run_id,)),
        _query(conn, queries.KERNEL_STATS_SQL, (run_id,)),
    )


def stored_insights(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    return [queries.insight_from_row(r) for r in _query(conn, queries.INSIGHTS_SQL, (run_id,))]


#: Per-run step aggregates for ``gpuprofctl runs``. ``steps`` counts every
#: step; every other sum skips each run's first step (by t0), whose wait
#: covers start-up, as the dataloader-stall rule does, and the traced steps
#: (a profiler snapshot or FLOP count slowed them) (``counted_steps`` says
#: how many steps the sums cover), except ``skipped_updates`` and ``eval_ns``
#: (every step). ``data_ns`` is loader time inside steps
#: (the ``data`` phase, between micro-batches); ``comm_ns`` the exposed
#: collective time (the ``comm`` phase), ``comm_steps`` the counted steps that
#: carry one (0: the run timed no collectives). ``mem_peak_bytes`` and
#: ``mem_reserved_max_bytes``: the highest torch allocator figures any step
#: reported (NULL: none did).
_OVERVIEW_SQL = """
WITH numbered AS (
    SELECT run_id, t0_ns, t1_ns, wait_ns, phases, skipped, eval_ns, mem_peak_bytes,
           mem_reserved_bytes,
           (ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY t0_ns, rowid) > 1)
               AND NOT COALESCE(traced, 0) AS c
    FROM steps
)
SELECT run_id,
       COUNT(*) AS steps,
       TOTAL(skipped) AS skipped_updates,
       TOTAL(eval_ns) AS eval_ns,
       SUM(c) AS counted_steps,
       TOTAL(c * wait_ns) AS wait_ns,
       TOTAL(c * (t1_ns - t0_ns)) AS step_ns,
       TOTAL(c * COALESCE(json_extract(phases, '$.forward'), 0)) AS forward_ns,
       TOTAL(c * COALESCE(json_extract(phases, '$.backward'), 0)) AS backward_ns,
       TOTAL(c * COALESCE(json_extract(phases, '$.optimizer'), 0)) AS optimizer_ns,
       TOTAL(c * COALESCE(json_extract(phases, '$.data'), 0)) AS data_ns,
       TOTAL(c * COALESCE(json_extract(phases, '$.comm'), 0)) AS comm_ns,
       TOTAL(c * (json_extract(phases, '$.comm') IS NOT NULL)) AS comm_steps,
       MAX(mem_peak_bytes) AS mem_peak_bytes,
       MAX(mem_reserved_bytes) AS mem_reserved_max_bytes
FROM numbered
GROUP BY run_id
"""


#: :data:`_OVERVIEW_SQL` over one group's runs only.
_GROUP_OVERVIEW_SQL = _OVERVIEW_SQL.replace(
    "FROM steps\n)", "FROM steps WHERE run_id IN (SELECT id FROM runs WHERE group_id = ?)\n)"
)
assert _GROUP_OVERVIEW_SQL != _OVERVIEW_SQL


def group_runs(conn: sqlite3.Connection, group: str) -> list[dict[str, Any]]:
    """*group*'s runs (``group_id``), by rank, without step aggregates."""
    rows = _query(conn, "SELECT * FROM runs WHERE group_id = ? ORDER BY rank, id", (group,))
    return [queries.run_from_row(r) for r in rows]


def runs_overview(conn: sqlite3.Connection, group: str | None = None) -> list[dict[str, Any]]:
    """Every run with its step aggregates, newest first; with *group*, only
    that group's runs (``group_id``), by rank."""
    if group is None:
        agg = {r["run_id"]: dict(r) for r in _query(conn, _OVERVIEW_SQL)}
        rows = _query(conn, "SELECT * FROM runs ORDER BY id DESC")
        runs = [queries.run_from_row(r) for r in rows]
    else:
        agg = {r["run_id"]: dict(r) for r in _query(conn, _GROUP_OVERVIEW_SQL, (group,))}
        runs = group_runs(conn, group)
    for run in runs:
        run["agg"] = agg.get(run["id"])
    return runs


#: A group's rank statuses, in the order a group's own status picks them.
RANK_STATUSES = ("running", "failed", "lost", "finished")


def group_status(statuses: list[str]) -> dict[str, Any]:
    """A group's status from its ranks' run statuses: ``running`` while any
    rank runs; once all ended, ``failed`` if a rank failed, else ``lost`` if
    a rank was lost, else ``finished``. ``counts``: ranks per status."""
    counts = {s: statuses.count(s) for s in RANK_STATUSES if s in statuses}
    status = next((s for s in RANK_STATUSES if s in counts), "finished")
    return {"status": status, "ended": status != "running", "counts": counts}


#: The last common steps of a group the group rules read: bucket rows are
#: loaded for these only (a day of 500 ms steps with 280 buckets is 48 M rows).
GROUP_STEPS_MAX = 2000
#: ... and the last common steps whose bucket rows they read: every rank's
#: buckets of every step is ranks x buckets x steps timestamps compared in
#: Python (8 ranks of 280 buckets over 2,000 steps: ~30 s on a 2-core box,
#: 200 steps ~2 s); 100 steps are ~1 s there and plenty for "late on >= 60 %
#: of steps" (the rules fire on 30).
GROUP_BUCKET_STEPS = 100
#: Steps read per rank to find them: the last this many up to the index every
#: rank has reached (by the ``steps_run_step`` index, so the work is the same on
#: a day-long run); twice the window leaves room for steps one rank lacks
#: (dropped under back-pressure, traced).
GROUP_STEPS_READ = 2 * GROUP_STEPS_MAX


def latest_rank_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run per rank, by rank: a rank with several runs in the group (a
    restarted job reusing its id) is its latest (highest id). Runs of another
    world size than the newest run's belong to an earlier launch and are left
    out: a relaunch on fewer ranks (``--rdzv-id`` or ``group=`` reused) had its
    ranks compared with the old launch's higher ranks, steps of another run
    matched by index."""
    newest = max(runs, key=lambda r: r.get("id") or 0, default=None)
    world = None if newest is None else newest.get("world_size")
    latest: dict[Any, dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: r.get("id") or 0):
        if world is not None and run.get("world_size") not in (None, world):
            continue
        latest[run.get("rank")] = run
    return sorted(latest.values(), key=lambda r: (r.get("rank") is None, r.get("rank") or 0))


def group_context(conn: sqlite3.Connection, group: str) -> GroupContext:
    """The :class:`GroupContext` of *group*'s ranks (their latest runs) from
    their stored steps and bucket timings, over the last
    :data:`GROUP_STEPS_MAX` steps they all have, bucket timings over the
    last :data:`GROUP_BUCKET_STEPS` of them (see
    :mod:`gpuprof.insights.group_context` for what is kept and how clocks are
    aligned). Each rank's steps are read back from the highest index every
    rank has reached, :data:`GROUP_STEPS_READ` at most: bounded work however
    long the run. Empty (no ranks) for an unknown group.

    Used by ``gpuprofctl insights --group`` and, through
    :func:`group_findings`, by gpuprofd when a rank's run ends."""
    rows = _query(conn, "SELECT * FROM runs WHERE group_id = ? ORDER BY rank, id", (group,))
    runs = [r for r in latest_rank_runs([dict(r) for r in rows]) if r.get("rank") is not None]
    tops = [_query(conn, queries.MAX_STEP_SQL, (run["id"],))[0][0] for run in runs]
    top = min((t for t in tops if t is not None), default=None)
    ranks = []
    for run, own_top in zip(runs, tops, strict=True):
        steps: list[dict[str, Any]] = []
        if own_top is not None and top is not None:
            tail = _query(conn, queries.GROUP_TAIL_SQL, (run["id"], top, GROUP_STEPS_READ))
            steps = sorted((queries.group_step_from_row(r) for r in tail),
                           key=lambda s: (s["t0"] is None, s["t0"] or 0))  # fmt: skip
        ranks.append(
            RankRows(
                rank=int(run["rank"]), steps=steps, host=run.get("host"),
                clock_offset_ns=run.get("clock_offset_ns"),
                clock_reference_rank=run.get("clock_reference_rank"),
            )  # fmt: skip
        )
    common = common_steps(ranks)[-GROUP_STEPS_MAX:]
    if common:
        lo, hi = common[0], common[-1]
        b_lo = common[-GROUP_BUCKET_STEPS:][0]
        ranks = [
            RankRows(
                rank=r.rank, steps=[s for s in r.steps if lo <= s["step"] <= hi],
                buckets=[tuple(b) for b in _query(conn, queries.GROUP_BUCKETS_SQL,
                                                  (run["id"], b_lo, hi))],
                host=r.host, clock_offset_ns=r.clock_offset_ns,
                clock_reference_rank=r.clock_reference_rank,
            )
            for r, run in zip(ranks, runs, strict=True)
        ]  # fmt: skip
    return build_group_context(group, ranks)


def plain_insight(ins: Insight) -> dict[str, Any]:
    """*ins* as a dict the way JSON gives it back: the group rules key
    evidence by rank (int), JSON object keys are strings."""
    return orjson.loads(orjson.dumps(ins.to_dict(), option=orjson.OPT_NON_STR_KEYS, default=str))


#: Groups :func:`unknown_group_message` lists.
GROUPS_LISTED = 10


def unknown_group_message(conn: sqlite3.Connection, group: str) -> str:
    """``no runs in group 'x'; groups here, newest first: a, b`` (at most
    :data:`GROUPS_LISTED`, by their newest run), or ``...; no run here has a
    group``: what a ``--group`` naming no runs says."""
    rows = _query(conn, "SELECT group_id FROM runs WHERE group_id IS NOT NULL "
                        "GROUP BY group_id ORDER BY MAX(id) DESC LIMIT ?",
                  (GROUPS_LISTED + 1,))  # fmt: skip
    names = [shlex.quote(r["group_id"]) for r in rows]
    if not names:
        return f"no runs in group {group!r}; no run here has a group"
    more = ", ..." if len(names) > GROUPS_LISTED else ""
    return (f"no runs in group {group!r}; groups here, newest first: "
            f"{', '.join(names[:GROUPS_LISTED])}{more}")  # fmt: skip


def runs_note(runs: list[dict[str, Any]]) -> str | None:
    """``"4 runs of 2 ranks: each rank's latest run is compared; pass a new
    group= per launch"`` when *runs* (a group's runs) hold more runs than the
    ranks :func:`latest_rank_runs` keeps (a fixed ``group=`` or
    ``--rdzv-id`` reused across launches, or two ``profile()`` blocks in one
    launch); None when each rank has one run."""
    ranks = len(latest_rank_runs(runs))
    if len(runs) <= ranks:
        return None
    return (f"{len(runs)} runs of {ranks} rank{'' if ranks == 1 else 's'}: each rank's latest "
            "run is compared; pass a new group= per launch")  # fmt: skip


def ended_ranks(conn: sqlite3.Connection, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lost or failed ranks among *runs* (one per rank,
    :func:`latest_rank_runs`), by their stored status: each ``rank``,
    ``run_id``, ``status``, ``last_step`` (the highest step index it stored;
    None: none) and ``message`` (``"rank 1 lost at step ~20"``)."""
    out = []
    for run in runs:
        if run["status"] not in ("lost", "failed"):
            continue
        top = _query(conn, queries.MAX_STEP_SQL, (run["id"],))[0][0]
        at = f"at step ~{top}" if top is not None else "before its first step"
        out.append({
            "rank": run.get("rank"), "run_id": run["id"], "status": run["status"],
            "last_step": top, "message": f"rank {run.get('rank')} {run['status']} {at}",
        })  # fmt: skip
    return out


def group_findings(conn: sqlite3.Connection, group: str) -> dict[str, Any]:
    """The group rules over :func:`group_context`: ``group``, ``ranks`` (how
    many ranks they compared), ``insights`` (:func:`plain_insight` dicts),
    ``ended`` (every rank's latest run has ended, :func:`group_status`),
    ``lost_ranks`` (:func:`ended_ranks`: lost or failed so far),
    ``missing_ranks`` (:func:`missing_ranks`) and ``runs_note``
    (:func:`runs_note`)."""
    ctx = group_context(conn, group)
    found = [plain_insight(i) for i in group_rules(ctx)]
    runs = group_runs(conn, group)
    latest = latest_rank_runs(runs)
    ended = group_status([r["status"] for r in latest])["ended"]
    return {
        "group": group, "ranks": len(ctx.ranks), "insights": found, "ended": ended,
        "lost_ranks": ended_ranks(conn, latest), "missing_ranks": missing_ranks(latest),
        "runs_note": runs_note(runs),
    }  # fmt: skip


def stored_group_insights(conn: sqlite3.Connection, group: str) -> list[dict[str, Any]]:
    """The findings gpuprofd stored when *group* ended (empty: none stored,
    or none found), as ``Insight.to_dict()`` gives them."""
    return [queries.insight_from_row(r) for r in _query(conn, queries.GROUP_INSIGHTS_SQL, (group,))]


#: Why a rank has no run, said neutrally: most often it simply does not run
#: gpuprof (only rank 0 profiled), not that it was killed.
NEVER_REPORTED_WHY = "it did not run gpuprof.profile, or ended before its first message"


def missing_ranks(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks of a group that never reported, from its runs' ``rank``,
    ``local_rank``, ``local_world_size``, ``world_size`` and ``host``: per host,
    the local ranks below its ``local_world_size`` with no run; on a group
    that lives on one node (``world_size == local_world_size``) also named by
    global rank (one node: local rank = rank). Each: ``rank`` (global, None
    when unknown), ``local_rank``, ``host``, ``message`` ("rank 3 never
    reported: it did not run gpuprof.profile, or ended before its first
    message")."""
    by_host: dict[Any, list[dict[str, Any]]] = {}
    for run in runs:
        by_host.setdefault(run.get("host"), []).append(run)
    out = []
    for host, host_runs in sorted(by_host.items(), key=lambda kv: str(kv[0])):
        local_world = max((r.get("local_world_size") or 0 for r in host_runs), default=0)
        world = max((r.get("world_size") or 0 for r in host_runs), default=0)
        seen_local = {r.get("local_rank") for r in host_runs}
        seen = {r.get("rank") for r in host_runs}
        one_node = len(by_host) == 1 and world == local_world
        expected = range(world) if one_node else range(local_world)
        for i in expected:
            if (i in seen) if one_node else (i in seen_local):
                continue
            who = f"rank {i}" if one_node else f"local rank {i} on {host}"
            out.append({
                "rank": i if one_node else None, "local_rank": i,
                "host": host, "message": f"{who} never reported: {NEVER_REPORTED_WHY}",
            })  # fmt: skip
    return out
