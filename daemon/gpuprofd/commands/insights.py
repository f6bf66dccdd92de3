"""``gpuprofctl insights [DB] [RUN_ID]``: a run's summary with every insight's detail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from gpuprof.summary import format_summary, make_summary
from gpuprofd import dbread, kerneltable
from gpuprofd.commands.common import db_argument, echo_json, format_option, resolve_db

LIVE_NOTE = "run in progress: insights as of the daemon's last live update"
#: Kernels listed under the summary.
TOP_KERNELS = 10


def load_summary(db: Path, run_id: int | None) -> dict[str, Any]:
    """The stored end-of-run summary, or one built from the stored insights,
    with the run's top kernels and MFU added where it lacks them
    (:func:`add_kernels_and_mfu`)."""
    conn = dbread.open_ro(db)
    try:
        run = dbread.get_run(conn, run_id, db)
        summary: dict[str, Any] | None = None
        if run.get("summary"):
            try:
                summary = orjson.loads(run["summary"])
            except orjson.JSONDecodeError:
                pass  # damaged: rebuild below
        if not isinstance(summary, dict):
            ctx = dbread.run_context(conn, run)
            notes = [LIVE_NOTE] if run["status"] == "running" else []
            summary = make_summary(
                run["id"], ctx, dbread.stored_insights(conn, run["id"]), str(db.absolute()), notes,
                error=run.get("error"),
            )
        table = kerneltable.build_table(dbread.kernel_windows(conn, run["id"]))
        return add_kernels_and_mfu(summary, run, table)
    finally:
        conn.close()


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
            if table.lines else None
        )  # fmt: skip
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
            lines.append(f"    {100 * k['share']:5.1f} %  {k['count']:>7}  "
                         f"{k['mean_us']:>9.1f} µs  {name}")  # fmt: skip
    return lines


def load_group(db: Path, group: str) -> dict[str, Any]:
    """A group's status (:func:`gpuprofd.dbread.group_status`) and, per rank
    (by rank), its run id, status, median step and summary
    (:func:`load_summary`).

    Raises:
        click.ClickException: no run belongs to *group*.
    """
    conn = dbread.open_ro(db)
    try:
        runs = dbread.runs_overview(conn, group)
    finally:
        conn.close()
    if not runs:
        raise click.ClickException(f"no runs in group {group!r}")
    ranks = []
    for run in runs:
        summary = load_summary(db, run["id"])
        ranks.append({
            "rank": run.get("rank"), "run_id": run["id"], "status": run["status"],
            "host": run.get("host"), "median_step_ms": summary.get("median_step_ms"),
            "summary": summary,
        })  # fmt: skip
    return {"group": group, **dbread.group_status([r["status"] for r in ranks]), "ranks": ranks}


def format_group(data: dict[str, Any]) -> str:
    """The group's status, one line per rank, then each rank's summary."""
    counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items())
    lines = [f"group {data['group']}: {data['status']} ({len(data['ranks'])} ranks: {counts})"]
    for r in data["ranks"]:
        ms = r["median_step_ms"]
        median = "-" if ms is None else f"{ms:.1f} ms"
        n = len(r["summary"].get("insights") or [])
        lines.append(f"  rank {r['rank']}  run {r['run_id']}  {r['status']:<8}  "
                     f"median step {median}  {n} insight(s)")  # fmt: skip
    for r in data["ranks"]:
        lines.append("")
        lines.append(f"rank {r['rank']}:")
        lines.append(format_summary(r["summary"], details=True))
    return "\n".join(lines)


def split_args(db: Path | None, run_id: int | None) -> tuple[Path | None, int | None]:
    """``insights 3``: a lone all-digits argument that names no file is RUN_ID."""
    if run_id is None and db is not None and str(db).isascii() and str(db).isdigit():
        if not db.exists():
            return None, int(str(db))
    return db, run_id


@click.command("insights")
@db_argument
@click.argument("run_id", type=click.IntRange(1, 2**63 - 1), required=False)
@click.option(
    "--group",
    "group",
    default=None,
    metavar="NAME",
    help="A group's ranks instead of one run: its status, each rank's status and "
    "median step, then each rank's summary.",
)
@format_option
def insights_cmd(db: Path | None, run_id: int | None, group: str | None, fmt: str) -> None:
    """Show a run's insights (default: the latest run in DB).

    DB defaults to GPUPROF_DB or ./gpuprof.db. A lone all-digits argument
    that is not an existing file is RUN_ID: `gpuprofctl insights 3`.
    `--group NAME`: every rank of a torchrun group (JSON: group, status,
    ended, counts, ranks [{rank, run_id, status, host, median_step_ms, summary}]).
    """
    db, run_id = split_args(db, run_id)
    if group is not None:
        if run_id is not None:
            raise click.UsageError("give RUN_ID or --group, not both")
        data = load_group(resolve_db(db), group)
        if fmt == "json":
            echo_json(data)
        else:
            click.echo(format_group(data))
        return
    summary = load_summary(resolve_db(db), run_id)
    if fmt == "json":
        echo_json(summary)
    else:
        text = format_summary(summary, details=True)
        lines = text.split("\n")
        at = len(lines) - 1 if lines[-1].startswith("─") else len(lines)  # inside the box
        lines[at:at] = format_kernels_and_mfu(summary, text)
        click.echo("\n".join(lines))
