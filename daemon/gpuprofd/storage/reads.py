"""Every read of a gpuprof database: one function per read, each
``async def f(db: Reader, ...)`` over a :class:`gpuprofd.storage.reader.Reader`
(the daemon's :class:`Store`, a read-only file for ``gpuprofctl``, a
Postgres pool), so the rules, ``gpuprofctl`` and the daemon read the same
way on SQLite and Postgres. The SQL is in the subset both engines run
(:mod:`gpuprofd.storage.dialect`); what differs goes through ``db.dialect``.

Opens with :func:`gpuprofd.storage.readonly.connect_ro` (``mode=ro``: reading
never creates or changes a file), and turns every way a file can be wrong
into one :class:`DatabaseError` line.
"""

from __future__ import annotations

import asyncio
import functools
import shlex
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from gpuprof.insights import Insight, RunContext, build_context
from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.distributed import GroupContext, group_rules
from gpuprof.insights.gains import attach_group, group_gains_block, rank_insights
from gpuprof.insights.group_context import RankRows, build_group_context, common_steps
from gpuprofd.errors import DatabaseError, UnknownRunError
from gpuprofd.sampling import rollup
from gpuprofd.storage import queries, schema, steptotals
from gpuprofd.storage.dialect import Dialect
from gpuprofd.storage.reader import Reader
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


async def find_run(
    db: Reader, *, run_id: int | None = None, run_key: str | None = None
) -> dict[str, Any] | None:
    """One run row as a dict (``options`` parsed), by id or key; None if none."""
    if run_id is not None:
        row = await db.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
    else:
        row = await db.fetchone("SELECT * FROM runs WHERE run_key = ?", (run_key,))
    return queries.run_from_row(row) if row is not None else None


async def runs_with_status(db: Reader, status: str) -> list[dict[str, Any]]:
    """The runs with *status*, by id."""
    rows = await db.fetchall("SELECT * FROM runs WHERE status = ? ORDER BY id", (status,))
    return [queries.run_from_row(r) for r in rows]


# --- one run's rows -------------------------------------------------------------


async def count_steps(db: Reader, run_id: int) -> int:
    """How many steps the run stored."""
    row = await db.fetchone("SELECT COUNT(*) AS n FROM steps WHERE run_id = ?", (run_id,))
    return int(row["n"]) if row else 0


async def last_step_end(db: Reader, run_id: int) -> int | None:
    """The latest ``t1`` (monotonic ns) of the run's steps; None without steps."""
    row = await db.fetchone("SELECT MAX(t1_ns) AS t1 FROM steps WHERE run_id = ?", (run_id,))
    return None if row is None or row["t1"] is None else int(row["t1"])


async def max_step(db: Reader, run_id: int) -> int | None:
    """The run's highest step index (:data:`queries.MAX_STEP_SQL`); None without steps."""
    row = await db.fetchone(queries.MAX_STEP_SQL, (run_id,))
    return None if row is None or row[0] is None else int(row[0])


async def run_steps(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's steps ordered by ``t0`` in :func:`build_context`'s shape."""
    rows = await db.fetchall(queries.STEPS_SQL, (run_id,))
    return [queries.step_from_row(r) for r in rows]


async def host_samples(
    db: Reader, start_mono_ns: int, end_mono_ns: int, boot_id: str | None = None
) -> list[dict[str, Any]]:
    """Host samples of boot *boot_id* with ``start <= mono_ns <= end``."""
    rows = await db.fetchall(queries.HOST_SQL, (start_mono_ns, end_mono_ns, boot_id))
    return [dict(r) for r in rows]


async def history_medians(db: Reader, run_id: int, run_name: str) -> list[float]:
    """Median step ms of up to :data:`queries.HISTORY_RUNS` earlier finished runs of
    *run_name*, newest first."""
    rows = await db.fetchall(queries.HISTORY_SQL, (run_name, run_id, queries.HISTORY_RUNS))
    return [float(r["median_step_ms"]) for r in rows]


async def run_cpu(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's process-tree CPU samples, ``mono_ns`` and ``cores`` each, in
    time order (:data:`queries.RUN_CPU_SQL`); none without samples."""
    return [dict(r) for r in await db.fetchall(queries.RUN_CPU_SQL, (run_id,))]


async def job_cpu(db: Reader, run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The CPU of *run*'s job on its node (its group's runs there summed) as
    one ``cores``/``ranks`` row (see :data:`queries.JOB_CPU_SQL`); none
    outside a group or without samples."""
    params = queries.job_cpu_params(run)
    if params is None:
        return []
    return [dict(r) for r in await db.fetchall(queries.JOB_CPU_SQL, params)]


async def worker_cpu(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's DataLoader workers' CPU rows (see :data:`queries.WORKER_CPU_SQL`)."""
    return [dict(r) for r in await db.fetchall(queries.WORKER_CPU_SQL, (run_id,))]


async def comm_totals(
    db: Reader, run_id: int, steps: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The run's timed gradient buckets summed (:data:`queries.COMM_TOTALS_SQL`);
    with *steps* ``(first, last)``, those of the steps in that range only."""
    if steps is None:
        row = await db.fetchone(queries.COMM_TOTALS_SQL, (run_id,))
    else:
        sql = queries.COMM_TOTALS_SQL + " AND step BETWEEN ? AND ?"
        row = await db.fetchone(sql, (run_id, *steps))
    return dict(row) if row is not None else {"steps": 0, "buckets": 0, "bytes": 0}


async def gpu_stats(
    db: Reader, run: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]
) -> GpuStats | None:
    """The run's GPU stats while it was in steps, from its per-second rollups."""
    window = queries.gpu_window(run.get("cuda_uuid"), steps, run.get("boot_id"))
    if window is None:
        return None
    return queries.gpu_stats_from_rollups(await db.fetchall(rollup.MERGED_SQL, window))


async def kernel_windows(db: Reader, run_id: int) -> list[queries.KernelWindow]:
    """The run's kernel windows with their rows, by ``t0`` (see
    :func:`queries.kernel_windows_from_rows`)."""
    windows = await db.fetchall(queries.KERNEL_WINDOWS_SQL, (run_id,))
    stats = await db.fetchall(queries.KERNEL_STATS_SQL, (run_id,))
    return queries.kernel_windows_from_rows(windows, stats)


async def stored_insights(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's stored findings, in the order found, as ``Insight.to_dict()``."""
    rows = await db.fetchall(queries.INSIGHTS_SQL, (run_id,))
    return [queries.insight_from_row(r) for r in rows]


async def run_context(
    db: Reader,
    run: Mapping[str, Any],
    *,
    gpu_rate_usd_per_hour: float | None = None,
    now_mono_ns: int | None = None,
) -> RunContext:
    """A run's :class:`RunContext` from its stored rows: what the daemon's
    rules (live and at the run's end) and ``gpuprofctl`` read, one definition.

    Host samples cover the run's start to its end; a run not ended yet
    (no ``end_mono_ns``) to *now_mono_ns* (the daemon's clock), else to its
    last step's end. :func:`build_context` runs in a worker thread (a day of
    steps takes a while)."""
    run_id = run["id"]
    got = await run_steps(db, run_id)
    host: list[dict[str, Any]] = []
    start = run.get("start_mono_ns")
    end = run.get("end_mono_ns") or now_mono_ns or (got[-1]["t1"] if got else None)
    if start is not None and end is not None:
        host = await host_samples(db, start, end, run.get("boot_id"))
    history = await history_medians(db, run_id, run["run_name"])
    cpu = await run_cpu(db, run_id)
    job = await job_cpu(db, run)
    workers = await worker_cpu(db, run_id)
    gpu = await gpu_stats(db, run, got)
    windows = await kernel_windows(db, run_id)
    comm = await comm_totals(db, run_id)
    return await asyncio.to_thread(
        build_context,
        run,
        got,
        host,
        history,
        gpu_rate_usd_per_hour,
        cpu,
        gpu=gpu,
        workers=workers,
        kernel_windows=windows,
        comm=comm,
        job_cpu=job,
    )


# --- every run ------------------------------------------------------------------


#: Per-run step aggregates for ``gpuprofctl runs``: see
#: :mod:`gpuprofd.storage.steptotals` for what each is. ``data_ns`` is loader
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
    (:mod:`gpuprofd.storage.steptotals`), or, for a run without blocks (a
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
    row = await db.fetchone(
        "SELECT MAX(it) AS m FROM (SELECT COALESCE(wait_ns, 0) + t1_ns - t0_ns AS it "
        "FROM steps WHERE run_id = ? AND COALESCE(traced, 0) = 0 AND t1_ns IS NOT NULL "
        "ORDER BY t0_ns LIMIT ? OFFSET ?) AS s",
        (run_id, 2**62, skip),
    )
    return None if row is None or row["m"] is None else int(row["m"])


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


async def group_tail(db: Reader, run_id: int, top: int) -> list[dict[str, Any]]:
    """A group rank's last :data:`GROUP_STEPS_READ` steps up to index *top*
    (:data:`queries.GROUP_TAIL_SQL`), by ``t0`` (None last)."""
    rows = await db.fetchall(queries.GROUP_TAIL_SQL, (run_id, top, GROUP_STEPS_READ))
    return sorted(
        (queries.group_step_from_row(r) for r in rows),
        key=lambda s: (s["t0"] is None, s["t0"] or 0),
    )


async def group_context(db: Reader, group: str) -> GroupContext:
    """The :class:`GroupContext` of *group*'s ranks (their latest runs) from
    their stored steps and bucket timings, over the last
    :data:`GROUP_STEPS_MAX` steps they all have, bucket timings over the
    last :data:`GROUP_BUCKET_STEPS` of them (see
    :mod:`gpuprof.insights.group_context` for what is kept and how clocks are
    aligned). Each rank's steps are read back from the highest index every
    rank has reached, :data:`GROUP_STEPS_READ` at most: bounded work however
    long the run. Empty (no ranks) for an unknown group. The context is
    built in a worker thread (ranks x buckets x steps timestamps).

    Used by ``gpuprofctl insights --group`` and, through
    :func:`group_findings`, by gpuprofd when a rank's run ends."""
    every = await group_runs(db, group)
    runs = [r for r in latest_rank_runs(every) if r.get("rank") is not None]
    tops = [await max_step(db, run["id"]) for run in runs]
    top = min((t for t in tops if t is not None), default=None)
    ranks = []
    for run, own_top in zip(runs, tops, strict=True):
        steps: list[dict[str, Any]] = []
        if own_top is not None and top is not None:
            steps = await group_tail(db, run["id"], top)
        ranks.append(
            RankRows(
                rank=int(run["rank"]),
                steps=steps,
                host=run.get("host"),
                clock_offset_ns=run.get("clock_offset_ns"),
                clock_reference_rank=run.get("clock_reference_rank"),
            )
        )
    common = common_steps(ranks)[-GROUP_STEPS_MAX:]
    if common:
        lo, hi = common[0], common[-1]
        b_lo = common[-GROUP_BUCKET_STEPS:][0]
        bucketed = []
        for r, run in zip(ranks, runs, strict=True):
            rows = await db.fetchall(queries.GROUP_BUCKETS_SQL, (run["id"], b_lo, hi))
            bucketed.append(
                RankRows(
                    rank=r.rank,
                    steps=[s for s in r.steps if lo <= s["step"] <= hi],
                    buckets=[tuple(b) for b in rows],
                    host=r.host,
                    clock_offset_ns=r.clock_offset_ns,
                    clock_reference_rank=r.clock_reference_rank,
                )
            )
        ranks = bucketed
    return await asyncio.to_thread(build_group_context, group, ranks)


def plain_insight(ins: Insight) -> dict[str, Any]:
    """*ins* as a dict the way JSON gives it back: the group rules key
    evidence by rank (int), JSON object keys are strings."""
    return orjson.loads(orjson.dumps(ins.to_dict(), option=orjson.OPT_NON_STR_KEYS, default=str))


async def group_insights_now(db: Reader, group: str) -> tuple[GroupContext, list[dict[str, Any]]]:
    """:func:`group_context` and the group rules over it (:func:`plain_insight`
    dicts), the rules run in a worker thread."""
    ctx = await group_context(db, group)
    found = await asyncio.to_thread(
        lambda: [plain_insight(i) for i in rank_insights(attach_group(ctx, group_rules(ctx)))]
    )
    return ctx, found


#: Groups :func:`unknown_group_message` lists.
GROUPS_LISTED = 10


async def unknown_group_message(db: Reader, group: str) -> str:
    """``no runs in group 'x'; groups here, newest first: a, b`` (at most
    :data:`GROUPS_LISTED`, by their newest run), or ``...; no run here has a
    group``: what a ``--group`` naming no runs says."""
    rows = await db.fetchall(
        "SELECT group_id FROM runs WHERE group_id IS NOT NULL "
        "GROUP BY group_id ORDER BY MAX(id) DESC LIMIT ?",
        (GROUPS_LISTED + 1,),
    )
    names = [shlex.quote(r["group_id"]) for r in rows]
    if not names:
        return f"no runs in group {group!r}; no run here has a group"
    more = ", ..." if len(names) > GROUPS_LISTED else ""
    return (
        f"no runs in group {group!r}; groups here, newest first: "
        f"{', '.join(names[:GROUPS_LISTED])}{more}"
    )


def runs_note(runs: list[dict[str, Any]]) -> str | None:
    """``"4 runs of 2 ranks: each rank's latest run is compared; pass a new
    group= per launch"`` when *runs* (a group's runs) hold more runs than the
    ranks :func:`latest_rank_runs` keeps (a fixed ``group=`` or
    ``--rdzv-id`` reused across launches, or two ``profile()`` blocks in one
    launch); None when each rank has one run."""
    ranks = len(latest_rank_runs(runs))
    if len(runs) <= ranks:
        return None
    return (
        f"{len(runs)} runs of {ranks} rank{'' if ranks == 1 else 's'}: each rank's latest "
        "run is compared; pass a new group= per launch"
    )


async def ended_ranks(db: Reader, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lost or failed ranks among *runs* (one per rank,
    :func:`latest_rank_runs`), by their stored status: each ``rank``,
    ``run_id``, ``status``, ``last_step`` (the highest step index it stored;
    None: none) and ``message`` (``"rank 1 lost at step ~20"``)."""
    out = []
    for run in runs:
        if run["status"] not in ("lost", "failed"):
            continue
        top = await max_step(db, run["id"])
        at = f"at step ~{top}" if top is not None else "before its first step"
        out.append(
            {
                "rank": run.get("rank"),
                "run_id": run["id"],
                "status": run["status"],
                "last_step": top,
                "message": f"rank {run.get('rank')} {run['status']} {at}",
            }
        )
    return out


async def group_findings(db: Reader, group: str) -> dict[str, Any]:
    """The group rules over :func:`group_context`: ``group``, ``ranks`` (how
    many ranks they compared), ``insights`` (:func:`plain_insight` dicts, ranked by gain), ``gains``
    (:func:`gpuprof.insights.gains.group_gains_block`),
    ``ended`` (every rank's latest run has ended, :func:`group_status`),
    ``lost_ranks`` (:func:`ended_ranks`: lost or failed so far),
    ``missing_ranks`` (:func:`missing_ranks`) and ``runs_note``
    (:func:`runs_note`)."""
    ctx, found = await group_insights_now(db, group)
    runs = await group_runs(db, group)
    latest = latest_rank_runs(runs)
    ended = group_status([r["status"] for r in latest])["ended"]
    return {
        "group": group,
        "ranks": len(ctx.ranks),
        "insights": found,
        "gains": group_gains_block(ctx, found),
        "ended": ended,
        "lost_ranks": await ended_ranks(db, latest),
        "missing_ranks": missing_ranks(latest),
        "runs_note": runs_note(runs),
    }


async def stored_group_insights(db: Reader, group: str) -> list[dict[str, Any]]:
    """The findings gpuprofd stored when *group* ended (empty: none stored,
    or none found), as ``Insight.to_dict()`` gives them."""
    rows = await db.fetchall(queries.GROUP_INSIGHTS_SQL, (group,))
    return [queries.insight_from_row(r) for r in rows]


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
            out.append(
                {
                    "rank": i if one_node else None,
                    "local_rank": i,
                    "host": host,
                    "message": f"{who} never reported: {NEVER_REPORTED_WHY}",
                }
            )
    return out
