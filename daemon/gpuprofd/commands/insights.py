"""``gpuprofctl insights [DB] [RUN]``: a run's summary with every insight's detail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuprof.summary import format_summary, insight_lines, size_text
from gpuprofd.commands.common import (
    db_argument,
    echo_json,
    format_option,
    read_with,
    resolve_target,
    run_ref_type,
    storage_url_option,
)
from gpuprofd.storage.reader import Reader
from gpuprofd.views.compare import resolve_run, run_ref
from gpuprofd.views.runs import (
    LIVE_NOTE,
    TOP_KERNELS,
    add_kernels_and_mfu,
    comm_missing,
    has_comm,
    load_group,
    load_summary,
    rank_comm,
)

__all__ = [
    "LIVE_NOTE",
    "TOP_KERNELS",
    "add_kernels_and_mfu",
    "comm_missing",
    "format_group",
    "has_comm",
    "load_group",
    "load_summary",
    "rank_comm",
]


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
            compute = summary.get("compute") or {}
            why = compute.get("mfu_unknown")
            if why:
                lines.append(f"  MFU: unknown ({why})")
            elif summary.get("top_kernels") or compute.get("peak_tflops") is not None:
                lines.append("  MFU: unknown (no FLOPs per step, or a GPU without a peak)")
            # else a CPU run with nothing declared: MFU is not a figure it has
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


def split_args(
    db: Path | str | None, run: int | str | None, names: bool = False
) -> tuple[Path | str | None, int | str | None]:
    """``insights 3``: a lone all-digits argument that names no file is the
    run's id; with *names* (``insights digits-mlp``), a lone argument that
    names no file and does not look like a database path (no folder, no
    ``.db``) is a run name."""
    if run is None and isinstance(db, Path) and not db.exists():
        text = str(db)
        if text.isascii() and text.isdigit():
            return None, int(text)
        if names and len(db.parts) == 1 and db.suffix not in DB_SUFFIXES:
            return None, run_ref(text)
    return db, run


#: File suffixes that say an argument is a database, even when it does not exist.
DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")


async def summary_of(reader: Reader, run: int | str | None) -> dict[str, Any]:
    """:func:`load_summary` of the run *run* names: an id, the latest run of a
    name, or None (the latest run)."""
    run_id = None if run is None else (await resolve_run(reader, run))["id"]
    return await load_summary(reader, run_id)


@click.command("insights", short_help="A run's summary, each finding with detail and fix.")
@db_argument
@click.argument("run", type=run_ref_type, required=False)
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
    db: Path | str | None,
    run: int | str | None,
    group: str | None,
    storage_url: str | None,
    fmt: str,
) -> None:
    """Show a run's insights (default: the latest run in DB).

    \b
    Example:
      gpuprofctl insights gpuprof.db 3

    DB defaults to GPUPROF_DB or ./gpuprof.db; --storage-url URL reads
    sqlite:///path.db or postgres://user@host/db instead. RUN is a run id
    (gpuprofctl runs lists them) or a run name, meaning its latest run; a lone
    argument that is not an existing file or a *.db path is RUN:
    `gpuprofctl insights 3`, `gpuprofctl insights digits-mlp`.

    Every field of --format json, one run's or a group's: docs/gpuprofctl.md.
    """
    db, run = split_args(db, run, names=True)
    target = resolve_target(db, storage_url)
    if group is not None:
        if run is not None:
            raise click.UsageError("give RUN_ID or --group, not both")
        data = read_with(target, lambda reader: load_group(reader, group))
        if fmt == "json":
            echo_json(data)
        else:
            click.echo(format_group(data))
        return
    summary = read_with(target, lambda reader: summary_of(reader, run))
    if fmt == "json":
        echo_json(summary)
    else:
        text = format_summary(summary, details=True)
        lines = text.split("\n")
        at = len(lines) - 1 if lines[-1].startswith("─") else len(lines)  # inside the box
        lines[at:at] = format_kernels_and_mfu(summary, text)
        click.echo("\n".join(lines))
