"""What ``gpuprofctl`` and the HTTP API show of runs: the JSON builders both
use (a run's row in the runs list, its summary with kernels and MFU, a
group's report), over a :class:`~gpuprofd.storage.reader.Reader`. The
commands format these for a terminal; the web app sends them as JSON. One
definition of every figure."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuprof.comm import COMM_PHASE
from gpuprof.insights.gains import findings_gains_block, group_gains_block, ranked
from gpuprof.summary import comm_medians, make_summary, mfu_figures
from gpuprofd.core.errors import UnknownGroupError
from gpuprofd.storage import reads, unreadable
from gpuprofd.storage.reader import Reader
from gpuprofd.views import kerneltable

#: Keys of ``pct_of_iteration``, in table order, with their column headers.
COLUMNS = (
    ("loader_wait", "WAIT%"),
    ("forward", "FWD%"),
    ("backward", "BWD%"),
    ("comm", "COMM%"),
    ("optimizer", "OPT%"),
    ("other", "OTHER%"),
)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1)


def iteration_shares(agg: dict[str, Any]) -> dict[str, float | None]:
    """Shares (%) of iteration time, loader wait + step, over every step but
    the first (its wait covers start-up, as the dataloader-stall rule has it).

    ``loader_wait`` is the wait before each step plus the loader time inside
    steps (the ``data`` phase, between micro-batches); ``comm`` is the
    exposed collective time (the ``comm`` phase: DDP's gradient all-reduce not
    hidden under backward), None when the run timed no collectives; ``other``
    is the rest of the step (unlabelled time, custom phases), so the shares
    add up to 100 (to rounding). All None when no step is counted.
    """
    wait_ns = (agg.get("wait_ns") or 0) + (agg.get("data_ns") or 0)
    iteration_ns = (agg.get("wait_ns") or 0) + (agg.get("step_ns") or 0)
    if iteration_ns <= 0:
        return {key: None for key, _ in COLUMNS}
    out: dict[str, float | None] = {"loader_wait": _pct(wait_ns, iteration_ns)}
    for phase in ("forward", "backward", "optimizer"):
        out[phase] = _pct(agg.get(f"{phase}_ns") or 0, iteration_ns)
    out["comm"] = _pct(agg.get("comm_ns") or 0, iteration_ns) if agg.get("comm_steps") else None
    known = sum(v for v in out.values() if v is not None)
    out["other"] = round(max(100.0 - known, 0.0), 1)
    return out


def micro_per_step(agg: dict[str, Any]) -> float | None:
    """Mean micro-batches per step over the counted steps (every step but the
    first and the traced ones, as the shares), to 0.01; None when none is counted."""
    counted = agg.get("counted_steps") or 0
    return round((agg.get("micro") or 0) / counted, 2) if counted else None


def describe(
    run: dict[str, Any], median_ms: float | None, compute: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One run's row (see :func:`iteration_shares` for ``pct_of_iteration``).
    ``mfu`` / ``achieved_tflops``: the run record's (set at its end), else
    *compute*'s (:func:`gpuprof.summary.mfu_figures` of a live run)."""
    agg = run["agg"] or {}
    compute = compute or {}
    return {
        "id": run["id"],
        "run_name": run["run_name"],
        "status": run["status"],
        "group": run.get("group_id"),
        "rank": run.get("rank"),
        "local_rank": run.get("local_rank"),
        "world_size": run.get("world_size"),
        "local_world_size": run.get("local_world_size"),
        "host": run.get("host"),
        "node": run.get("node_id"),
        "user": run.get("user_name"),
        "project": run.get("project"),
        "tags": run.get("tags") or {},
        "steps": agg.get("steps", 0),
        "median_step_ms": median_ms,
        "pct_of_iteration": iteration_shares(agg),
        "steps_counted": agg.get("counted_steps") or 0,
        "micro_batches_per_step": micro_per_step(agg),
        "skipped_updates": int(agg.get("skipped_updates") or 0),
        "eval_s": round(((agg.get("eval_ns") or 0) + (run.get("trailing_eval_ns") or 0)) / 1e9, 3),
        "dropped_events": run.get("dropped_events") or 0,
        "store_dropped_events": run.get("store_dropped_events") or 0,
        "start_wall_ns": run.get("start_wall_ns"),
        "end_wall_ns": run.get("end_wall_ns"),
        "torch_peak_allocated_bytes": agg.get("mem_peak_bytes"),
        "torch_peak_reserved_bytes": agg.get("mem_reserved_max_bytes"),
        "mfu": run.get("mfu") if run.get("mfu") is not None else compute.get("mfu"),
        "achieved_tflops": run.get("achieved_tflops")
        if run.get("achieved_tflops") is not None
        else compute.get("achieved_tflops"),
    }


def tag_matches(tags: Mapping[str, str], tag: str) -> bool:
    """Does a run with *tags* pass the filter *tag*: ``key=value`` (that
    value, exactly) or ``key`` (any value)?"""
    key, eq, value = tag.partition("=")
    return key in tags and (not eq or tags[key] == value)


def run_matches(
    run: dict[str, Any],
    *,
    name: str | None = None,
    status: str | None = None,
    node: str | None = None,
    user: str | None = None,
    from_ns: int | None = None,
    to_ns: int | None = None,
    now_ns: int = 0,
    project: str | None = None,
    tag: str | None = None,
) -> bool:
    """Does *run* (a runs row) pass every filter given (None: any)?

    *name*: a substring of its name (case-sensitive); *status*: its status;
    *node*: the node it came from, by its id (a team server's ``node_id``)
    or its host name, exactly; *user*: who trained (the login name the
    shim sent), exactly; *project*: its project, exactly; *tag*: see
    :func:`tag_matches`; *from_ns* / *to_ns* (wall ns): it ran at some
    moment between them, from its start to its end (a running run: to
    *now_ns*; one that ended without an end time: its start). A run with no
    start time passes no time filter."""
    if name is not None and name not in run["run_name"]:
        return False
    if status is not None and run["status"] != status:
        return False
    if node is not None and node not in (run.get("node_id"), run.get("host")):
        return False
    if user is not None and run.get("user_name") != user:
        return False
    if project is not None and run.get("project") != project:
        return False
    if tag is not None and not tag_matches(run.get("tags") or {}, tag):
        return False
    if from_ns is None and to_ns is None:
        return True
    start = run.get("start_wall_ns")
    if start is None:
        return False
    end = run.get("end_wall_ns")
    if end is None:
        end = max(now_ns, start) if run["status"] == "running" else start
    return (to_ns is None or start <= to_ns) and (from_ns is None or end >= from_ns)


async def list_runs(
    db: Reader,
    group: str | None = None,
    *,
    name: str | None = None,
    status: str | None = None,
    node: str | None = None,
    user: str | None = None,
    from_ns: int | None = None,
    to_ns: int | None = None,
    limit: int | None = None,
    project: str | None = None,
    tag: str | None = None,
) -> list[dict[str, Any]]:
    """Every run, newest first; with *group*, that group's runs by rank;
    only those that pass the filters (:func:`run_matches`), the first
    *limit* of them (a running run's median is computed only for the runs
    listed).

    Raises:
        UnknownGroupError: *group* given and no run belongs to it.
    """
    out = []
    now = time.time_ns()
    shown = []
    for run in await reads.runs_rows(db, group):
        if not run_matches(
            run,
            name=name,
            status=status,
            node=node,
            user=user,
            project=project,
            tag=tag,
            from_ns=from_ns,
            to_ns=to_ns,
            now_ns=now,
        ):
            continue
        if limit is not None and len(shown) >= limit:
            break
        shown.append(run)
    await reads.add_step_aggregates(db, shown)  # only the shown runs' steps are read
    for run in shown:
        median_ms = run.get("median_step_ms")
        compute = None
        if median_ms is None and run["agg"]:  # still running: compute it now
            ctx = await reads.run_context(db, run)
            median_ms = ctx.median_step_ms
            median_ms = round(median_ms, 3) if median_ms is not None else None
            compute = mfu_figures(ctx)
        out.append(describe(run, median_ms, compute))
    unfiltered = all(v is None for v in (name, status, node, user, project, tag, from_ns, to_ns))
    if group is not None and not out and unfiltered:
        raise UnknownGroupError(await reads.unknown_group_message(db, group))
    return out


def phase_means_ms(agg: dict[str, Any] | None) -> dict[str, float | None]:
    """Mean ms per step of each phase over the steps :func:`iteration_shares`
    covers (``steps_counted``), keyed as its shares are: ``loader_wait`` (wait
    + the ``data`` phase), ``forward``, ``backward``, ``comm`` (None when the
    run timed none), ``optimizer``, ``other`` (the rest of the step). All
    None when no step is counted."""
    agg = agg or {}
    n = agg.get("counted_steps") or 0
    if not n:
        return {key: None for key, _ in COLUMNS}

    def ms(ns: float) -> float:
        return round(ns / n / 1e6, 4)

    out: dict[str, float | None] = {
        "loader_wait": ms((agg.get("wait_ns") or 0) + (agg.get("data_ns") or 0))
    }
    named = agg.get("data_ns") or 0
    for phase in ("forward", "backward", "comm", "optimizer"):
        named += agg.get(f"{phase}_ns") or 0
        out[phase] = ms(agg.get(f"{phase}_ns") or 0)
    if not agg.get("comm_steps"):
        out["comm"] = None
    out["other"] = ms(max((agg.get("step_ns") or 0) - named, 0))
    return {key: out[key] for key, _ in COLUMNS}


LIVE_NOTE = "run in progress: insights as of the daemon's last live update"
#: Kernels listed under the summary.
TOP_KERNELS = 10


async def load_summary(
    db: Reader, run_id: int | None, live: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The stored end-of-run summary; for a run without one, *live* (the
    summary of the daemon's latest live pass over a running run) or else one
    built now from the stored rows and insights (a whole-run pass: seconds
    on a day-long run); with the run's top kernels and MFU added where it
    lacks them (:func:`add_kernels_and_mfu`)."""
    run = await reads.get_run(db, run_id)
    summary: dict[str, Any] | None = None
    if run.get("summary"):  # not a JSON object (counted): built again below
        summary = unreadable.json_cell(
            run["summary"], "runs.summary", run["id"], empty=unreadable.null
        )
    elif live is not None and run["status"] == "running":
        summary = live
    if not isinstance(summary, dict):
        ctx = await reads.run_context(db, run)
        notes = [LIVE_NOTE] if run["status"] == "running" else []
        summary = make_summary(
            run["id"],
            ctx,
            await reads.stored_insights(db, run["id"]),
            db.where,
            notes,
            error=run.get("error"),
        )
        if run.get("group_id"):
            summary["group_id"] = run["group_id"]
    table = kerneltable.build_table(await reads.kernel_windows(db, run["id"]))
    return add_kernels_and_mfu(summary, run, table)


def add_kernels_and_mfu(
    summary: dict[str, Any], run: dict[str, Any], table: kerneltable.KernelTable
) -> dict[str, Any]:
    """Set ``top_kernels`` (the run's :data:`TOP_KERNELS` kernels by device
    time: name, class, share of device time 0-1, count, mean µs, ms per step
    or window; ``kernels_source`` says which windows) and ``mfu`` (0-1) /
    ``achieved_tflops`` (per GPU) from the run record, each only where the
    summary does not carry it already."""
    if "top_kernels" not in summary:
        summary["top_kernels"] = table.to_dict(TOP_KERNELS)["kernels"] if table.lines else []
        summary["kernels_source"] = (
            {"source": table.source, "windows": table.windows, "steps": table.steps}
            if table.lines
            else None
        )
    for key in ("mfu", "achieved_tflops"):
        if summary.get(key) is None:
            summary[key] = run.get(key)
    return summary


async def rank_comm(db: Reader, run: dict[str, Any]) -> dict[str, Any] | None:
    """One rank's collectives for the group report: ``median_exposed_ms`` (the
    ``comm`` phase per step) and ``median_share_of_step`` (0-1, comm / step
    time per step), medians over the steady steps of its last
    :data:`gpuprofd.storage.reads.GROUP_STEPS_MAX` untraced steps
    (:func:`gpuprof.summary.comm_medians`: the definition of its summary's
    comm line and of ``comm_dominant``; None when it timed no collective),
    ``buckets_per_step`` and ``bytes_per_step`` (gradient bytes; means over
    its last :data:`gpuprofd.storage.reads.GROUP_BUCKET_STEPS` steps with timed
    buckets; None without), ``clock_offset_ns`` / ``clock_uncertainty_ns``
    (its clock against the reference rank's; None when not measured),
    ``clock_reference_rank`` (the rank it was aligned to). None
    when the run has none of these. Bounded reads, by index: a day-long run
    costs what a short one does."""
    top = await reads.max_step(db, run["id"])
    tail = [] if top is None else await reads.group_tail(db, run["id"], top)
    timed = [s for s in tail if not s["traced"] and s["t0"] is not None and s["t1"] is not None]
    timed = timed[-reads.GROUP_STEPS_MAX :]
    exposed = share = None
    if any(COMM_PHASE in s["phases"] for s in timed):
        exposed, share = comm_medians(
            [(s["t1"] - s["t0"]) / 1e6 for s in timed],
            [s["phases"].get(COMM_PHASE, 0) / 1e6 for s in timed],
        )
    span = None
    if tail:
        indices = sorted(s["step"] for s in tail)
        span = (indices[-reads.GROUP_BUCKET_STEPS :][0], indices[-1])
    totals = await reads.comm_totals(db, run["id"], span) if span else {"steps": 0}
    n = totals.get("steps") or 0
    out = {
        "median_exposed_ms": round(exposed, 3) if exposed is not None else None,
        "median_share_of_step": round(share, 4) if share is not None else None,
        "buckets_per_step": round(totals["buckets"] / n, 2) if n else None,
        "bytes_per_step": round(totals["bytes"] / n) if n else None,
        "clock_offset_ns": run.get("clock_offset_ns"),
        "clock_uncertainty_ns": run.get("clock_uncertainty_ns"),
        "clock_reference_rank": run.get("clock_reference_rank"),
    }
    return out if any(v is not None for v in out.values()) else None


async def load_group(
    db: Reader, group: str, live: Callable[[int], dict[str, Any] | None] | None = None
) -> dict[str, Any]:
    """A group's status (:func:`gpuprofd.storage.reads.group_status`), its findings
    (``insights``: those gpuprofd stored when the group ended, else
    :func:`gpuprof.insights.distributed.group_rules` over
    :func:`gpuprofd.storage.reads.group_context` now; ``insights_source`` says
    ``stored`` or ``computed``; ranked by gain), ``gains`` (the job's
    iteration and what fixing them all is worth:
    :func:`gpuprof.insights.gains.group_gains_block`, or for stored findings
    :func:`gpuprof.insights.gains.findings_gains_block`), ``runs`` (the
    group's runs) and ``runs_note``
    (:func:`gpuprofd.storage.reads.runs_note`: a rank has several runs, its latest
    is the one shown and compared), the ranks that never
    reported (``missing_ranks``, :func:`gpuprofd.storage.reads.missing_ranks`), the
    ranks without collective timings (``comm_missing``, :func:`comm_missing`) and,
    per rank (by rank, each rank's latest run), its run id, status, median step, collectives
    (``comm``, :func:`rank_comm`) and summary (:func:`load_summary`; *live*: a
    running run's summary of the daemon's latest live pass, by run id).

    Raises:
        UnknownGroupError: no run belongs to *group*.
    """
    every = await reads.group_runs(db, group)
    if not every:
        raise UnknownGroupError(await reads.unknown_group_message(db, group))
    runs = reads.latest_rank_runs(every)  # what the group rules compare
    status = reads.group_status([r["status"] for r in runs])
    stored = await reads.stored_group_insights(db, group) if status["ended"] else None
    source = "stored" if stored is not None else "computed"
    if stored is not None:
        found, gains = stored, findings_gains_block(stored)
    else:
        ctx, found = await reads.group_insights_now(db, group)
        gains = group_gains_block(ctx, found)
    found = [dict(i) for i in ranked(found)]
    comm = {run["id"]: await rank_comm(db, run) for run in runs}
    ranks = []
    for run in runs:
        summary = await load_summary(db, run["id"], live(run["id"]) if live else None)
        ranks.append(
            {
                "rank": run.get("rank"),
                "run_id": run["id"],
                "status": run["status"],
                "host": run.get("host"),
                "median_step_ms": summary.get("median_step_ms"),
                "comm": comm[run["id"]],
                "summary": summary,
            }
        )
    return {
        "group": group,
        **status,
        "insights": found,
        "gains": gains,
        "insights_source": source,
        "runs": len(every),
        "runs_note": reads.runs_note(every),
        "missing_ranks": reads.missing_ranks(runs),
        "comm_missing": comm_missing(ranks),
        "ranks": ranks,
    }


def has_comm(comm: dict[str, Any] | None) -> bool:
    """Whether :func:`rank_comm` found any collective timing (exposed comm or
    timed buckets)."""
    return bool(comm) and (
        comm.get("median_exposed_ms") is not None or comm.get("buckets_per_step") is not None
    )


def comm_missing(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ranks with no collective timings (:func:`has_comm`) and what that
    leaves of the group rules: ``{"ranks": [...], "message": ...}``, None when
    every rank has some."""
    without = [r["rank"] for r in ranks if not has_comm(r.get("comm"))]
    if not without:
        return None
    who = f"rank{'' if len(without) == 1 else 's'} {', '.join(map(str, without))}"
    why = "(comm hook registered before gpuprof.profile, or time_comm=False)"
    if len(without) == len(ranks):
        what = "straggler_rank, bucket_skew and comm_dominant cannot run; rank_skew only"
    else:
        what = "straggler_rank, bucket_skew and comm_dominant compare the other ranks only"
    return {"ranks": without, "message": f"no collective timings from {who} {why}: {what}"}
