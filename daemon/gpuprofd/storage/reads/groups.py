"""A group's reads: its ranks (each rank's latest run, :func:`latest_rank_runs`),
their :class:`GroupContext` over the last steps they all have
(:func:`group_context`), the group rules over it (:func:`group_findings`),
its status, and the ranks lost, failed or never reported.

Each read is ``async def f(db: Reader, ...)`` over a
:class:`gpuprofd.storage.reader.Reader`.
"""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

import orjson

from gpuprof.insights import Insight
from gpuprof.insights.distributed import GroupContext, group_rules
from gpuprof.insights.gains import attach_group, group_gains_block, rank_insights
from gpuprof.insights.group_context import RankRows, build_group_context, common_steps
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import queries, steprows
from gpuprofd.storage.reads.context import comm_buckets, max_step
from gpuprofd.storage.reads.runs import group_runs

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
    (by index, :func:`steprows.last_rows`), by ``t0`` (None last)."""
    rows = await steprows.last_rows(db, run_id, GROUP_STEPS_READ, last_step=top, by_step=True)
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
            rows = await comm_buckets(db, run["id"], b_lo, hi)
            bucketed.append(
                RankRows(
                    rank=r.rank,
                    steps=[s for s in r.steps if lo <= s["step"] <= hi],
                    buckets=rows,  # (step, bucket, start, end, bytes) rows
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


async def stored_group_insights(db: Reader, group: str) -> list[dict[str, Any]] | None:
    """The findings gpuprofd stored when *group* ended, as
    ``Insight.to_dict()`` gives them: empty when its rules found nothing;
    None when they never ran on it ended (not ended yet, or stored by a
    gpuprof older than schema 21 that found nothing: compute them)."""
    rows = await db.fetchall(queries.GROUP_INSIGHTS_SQL, (group,))
    if rows:
        return [
            queries.insight_from_row(r, which=(group, i), table="group_insights")
            for i, r in enumerate(rows)
        ]
    checked = await db.fetchone(queries.GROUP_CHECKED_SQL, (group,))
    return [] if checked is not None else None


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
