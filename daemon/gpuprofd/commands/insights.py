"""``gpuprofctl insights [DB] [RUN_ID]``: a run's summary with every insight's detail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from gpuprof.comm import COMM_PHASE
from gpuprof.summary import comm_medians, format_summary, insight_lines, make_summary, size_text
from gpuprofd import kerneltable
from gpuprofd.commands.common import (
    db_argument,
    echo_json,
    format_option,
    read_with,
    resolve_target,
    storage_url_option,
)
from gpuprofd.storage import reads
from gpuprofd.storage.reader import Reader

LIVE_NOTE = "run in progress: insights as of the daemon's last live update"
#: Kernels listed under the summary.
TOP_KERNELS = 10


async def load_summary(db: Reader, run_id: int | None) -> dict[str, Any]:
    """The stored end-of-run summary, or one built from the stored insights,
    with the run's top kernels and MFU added where it lacks them
    (:func:`add_kernels_and_mfu`)."""
    run = await reads.get_run(db, run_id)
    summary: dict[str, Any] | None = None
    if run.get("summary"):
        try:
            summary = orjson.loads(run["summary"])
        except orjson.JSONDecodeError:
            pass  # damaged: rebuild below
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


def format_kernels_and_mfu(summary: dict[str, Any], shown: str) -> list[str]:
    """Text lines for what :func:`add_kernels_and_mfu` added (MFU only when
    *shown*, the summary's own text, does not give it)."""
    lines = []
    if "MFU" not in shown:
        mfu, tflops = summary.get("mfu"), summary.get("achieved_tflops")
        if mfu is not None:
            rate = f" ({tflops:.1f} TFLOP/s per GPU)" if tflops is not None else ""
            lines.append(f"  MFU: {100 * mfu:.1f} %{rate}")
        else:
            lines.append("  MFU: unknown (no FLOPs per step, or a GPU without a peak in the table)")
    top = summary.get("top_kernels") or []
    src = summary.get("kernels_source") or {}
    if top:
        where = f"{src.get('windows')} {src.get('source')} window(s)" if src else "kernel windows"
        lines.append(f"  Top kernels ({where}; share of device time, launches, mean):")
        for k in top:
            name = k["name"] if len(k["name"]) <= 70 else k["name"][:69] + "…"
            lines.append(
                f"    {100 * k['share']:5.1f} %  {k['count']:>7}  {k['mean_us']:>9.1f} µs  {name}"
            )
    return lines


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


async def load_group(db: Reader, group: str) -> dict[str, Any]:
    """A group's status (:func:`gpuprofd.storage.reads.group_status`), its findings
    (``insights``: those gpuprofd stored when the group ended, else
    :func:`gpuprof.insights.distributed.group_rules` over
    :func:`gpuprofd.storage.reads.group_context` now; ``insights_source`` says
    ``stored`` or ``computed``), ``runs`` (the group's runs) and ``runs_note``
    (:func:`gpuprofd.storage.reads.runs_note`: a rank has several runs, its latest
    is the one shown and compared), the ranks that never
    reported (``missing_ranks``, :func:`gpuprofd.storage.reads.missing_ranks`), the
    ranks without collective timings (``comm_missing``, :func:`comm_missing`) and,
    per rank (by rank, each rank's latest run), its run id, status, median step, collectives
    (``comm``, :func:`rank_comm`) and summary (:func:`load_summary`).

    Raises:
        click.ClickException: no run belongs to *group*.
    """
    every = await reads.group_runs(db, group)
    if not every:
        raise click.ClickException(await reads.unknown_group_message(db, group))
    runs = reads.latest_rank_runs(every)  # what the group rules compare
    status = reads.group_status([r["status"] for r in runs])
    found = await reads.stored_group_insights(db, group) if status["ended"] else []
    source = "stored" if found else "computed"
    if not found:
        _, found = await reads.group_insights_now(db, group)
    comm = {run["id"]: await rank_comm(db, run) for run in runs}
    ranks = []
    for run in runs:
        summary = await load_summary(db, run["id"])
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
        "insights_source": source,
        "runs": len(every),
        "runs_note": reads.runs_note(every),
        "missing_ranks": reads.missing_ranks(runs),
        "comm_missing": comm_missing(ranks),
        "ranks": ranks,
    }


def _comm_cell(comm: dict[str, Any] | None, rank: int | None = None) -> str:
    """``  comm median 1.2 ms/step exposed (3 % of step), 4 buckets, gradient
    bytes 25.1 MB/step, clock +5000.000 ± 0.050 ms`` (medians over steady steps, as the summary's
    comm line and ``comm_dominant``); ``none timed`` without collectives;
    the clock ``unknown`` when no clock event was stored, ``reference`` on
    the rank the others were aligned to (*rank*)."""
    comm = comm or {}
    parts = []
    if comm.get("median_exposed_ms") is not None:
        share = comm.get("median_share_of_step")
        of = f" ({100 * share:.0f} % of step)" if share is not None else ""
        parts.append(f"median {comm['median_exposed_ms']:.1f} ms/step exposed{of}")
    if comm.get("buckets_per_step") is not None:
        n = comm["buckets_per_step"]
        parts.append(f"{n:g} bucket{'' if n == 1 else 's'}")
        parts.append(f"gradient bytes {size_text(comm['bytes_per_step'])}/step")
    if not parts:
        parts.append("none timed")
    if comm.get("clock_offset_ns") is None:  # no clock event stored
        parts.append("clock unknown")
    elif rank is not None and comm.get("clock_reference_rank") == rank:
        parts.append("clock reference")  # offset 0 by definition, not measured
    else:
        unc = comm.get("clock_uncertainty_ns")
        pm = f" ± {unc / 1e6:.3f}" if unc is not None else ""
        parts.append(f"clock {comm['clock_offset_ns'] / 1e6:+.3f}{pm} ms")
    return "  comm " + ", ".join(parts)


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


def format_group(data: dict[str, Any]) -> str:
    """The group's status, the ranks that never reported, the group's
    findings with their detail and fix, one line per rank, then each rank's
    summary."""
    counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items())
    n = len(data["ranks"])
    lines = [f"group {data['group']}: {data['status']} ({n} rank{'' if n == 1 else 's'}: {counts})"]
    if data.get("runs_note"):
        lines.append(f"  {data['runs_note']}")
    for m in data.get("missing_ranks") or []:
        lines.append(f"  {m['message']}")
    if data.get("comm_missing"):
        lines.append(f"  {data['comm_missing']['message']}")
    found = data.get("insights") or []
    lines.append(f"  Group insights ({len(found)}):")
    lines.extend(insight_lines(found, details=True))
    for r in data["ranks"]:
        ms = r["median_step_ms"]
        median_ms = "-" if ms is None else f"{ms:.1f} ms"
        n = len(r["summary"].get("insights") or [])
        comm = _comm_cell(r.get("comm"), r["rank"])
        lines.append(
            f"  rank {r['rank']}  run {r['run_id']}  {r['status']:<8}  "
            f"median step {median_ms}  {n} insight(s){comm}"
        )
    for r in data["ranks"]:
        lines.append("")
        lines.append(f"rank {r['rank']}:")  # the group's findings are above: not again
        rank_summary = {k: v for k, v in r["summary"].items() if k != "group"}
        lines.append(format_summary(rank_summary, details=True))
    return "\n".join(lines)


def split_args(db: Path | None, run_id: int | None) -> tuple[Path | None, int | None]:
    """``insights 3``: a lone all-digits argument that names no file is RUN_ID."""
    if run_id is None and db is not None and str(db).isascii() and str(db).isdigit():
        if not db.exists():
            return None, int(str(db))
    return db, run_id


@click.command("insights", short_help="A run's summary, each finding with detail and fix.")
@db_argument
@click.argument("run_id", type=click.IntRange(1, 2**63 - 1), required=False)
@click.option(
    "--group",
    "group",
    default=None,
    metavar="NAME",
    help="A group's ranks instead of one run: its status, the group's findings "
    "(straggler, bucket skew, comm share, rank skew), each rank's status, median step "
    "and collectives, then each rank's summary.",
)
@storage_url_option
@format_option
def insights_cmd(
    db: Path | None, run_id: int | None, group: str | None, storage_url: str | None, fmt: str
) -> None:
    """Show a run's insights (default: the latest run in DB).

    \b
    Example:
      gpuprofctl insights gpuprof.db 3

    DB defaults to GPUPROF_DB or ./gpuprof.db; --storage-url URL reads
    sqlite:///path.db or postgres://user@host/db instead. A lone all-digits
    argument that is not an existing file is RUN_ID: `gpuprofctl insights 3`.
    `--group NAME`: every rank of a torchrun group (JSON: group, status,
    ended, counts, insights [the group's findings: stored when the group
    ended, else computed now], insights_source [stored | computed], runs [the
    group's runs], runs_note ["4 runs of 2 ranks: each rank's latest run is
    compared; pass a new group= per launch", or null], missing_ranks [{rank,
    local_rank, host, message}], comm_missing [{ranks, message}: the ranks
    with no collective timings and which group rules that rules out, or
    null], ranks [{rank, run_id, status, host,
    median_step_ms, comm {median_exposed_ms, median_share_of_step [medians
    over steady steps, as comm_dominant], buckets_per_step, bytes_per_step
    [gradient bytes: the buckets' sizes, not bytes on the wire],
    clock_offset_ns, clock_uncertainty_ns, clock_reference_rank} or null,
    summary}]).
    """
    db, run_id = split_args(db, run_id)
    target = resolve_target(db, storage_url)
    if group is not None:
        if run_id is not None:
            raise click.UsageError("give RUN_ID or --group, not both")
        data = read_with(target, lambda reader: load_group(reader, group))
        if fmt == "json":
            echo_json(data)
        else:
            click.echo(format_group(data))
        return
    summary = read_with(target, lambda reader: load_summary(reader, run_id))
    if fmt == "json":
        echo_json(summary)
    else:
        text = format_summary(summary, details=True)
        lines = text.split("\n")
        at = len(lines) - 1 if lines[-1].startswith("─") else len(lines)  # inside the box
        lines[at:at] = format_kernels_and_mfu(summary, text)
        click.echo("\n".join(lines))
