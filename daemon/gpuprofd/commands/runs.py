"""``gpuprofctl runs [DB]``: one line per run with its time breakdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.cells import cell_len

from gpuprof.summary import seconds_text
from gpuprofd.commands.common import (
    db_argument,
    echo_json,
    format_option,
    read_with,
    resolve_target,
    storage_url_option,
)
from gpuprofd.commands.termtext import fit, safe
from gpuprofd.storage import reads
from gpuprofd.views.runs import COLUMNS, describe, iteration_shares, list_runs

__all__ = ["COLUMNS", "describe", "format_table", "group_line", "iteration_shares", "list_runs"]


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


#: Terminal cells of a run's name in the runs table (then "…").
NAME_CELLS = 40
#: Characters of a group name in the runs table (then "…"): torchrun's UUID
#: run ids are 36; ``gpuprofctl runs --group`` takes the whole name.
GROUP_CHARS = 12


def _group_cell(group: str | None) -> str:
    return fit(safe(group), GROUP_CHARS + 1) if group else "-"


def format_table(rows: list[dict[str, Any]], ranks: bool = False, groups: bool = False) -> str:
    """The runs table; *ranks*: with a RANK column (``--group``); *groups*:
    with GROUP (shortened to :data:`GROUP_CHARS` characters and "…"; - for a
    run of no group) and RANK columns (plain ``runs`` when a run has a group)."""
    lead = ("ID", "GROUP", "RANK") if groups else ("ID", "RANK") if ranks else ("ID",)
    header = (
        *lead,
        "NAME",
        "STATUS",
        "STEPS",
        "MICRO",
        "MEDIAN_STEP_MS",
        *(h for _, h in COLUMNS),
        "SKIPPED",
        "EVAL",
        "DROPPED",
    )
    lines = [header]
    for r in rows:
        pct = r["pct_of_iteration"]
        rank = "-" if r["rank"] is None or not (ranks or r["group"]) else str(r["rank"])
        first: tuple[str, ...] = (str(r["id"]),)
        if groups:
            first = (str(r["id"]), _group_cell(r["group"]), rank)
        elif ranks:
            first = (str(r["id"]), rank)
        lines.append(
            (
                *first,
                fit(safe(r["run_name"]), NAME_CELLS),
                r["status"],
                str(r["steps"]),
                "-" if r["micro_batches_per_step"] is None else f"{r['micro_batches_per_step']:g}",
                _cell(r["median_step_ms"]),
                *(_cell(pct[key]) for key, _ in COLUMNS),
                str(r["skipped_updates"]),
                seconds_text(r["eval_s"]) if r["eval_s"] else "-",
                str(r["dropped_events"] + r.get("store_dropped_events", 0)),
            )
        )
    widths = [max(cell_len(line[i]) for line in lines) for i in range(len(header))]
    text_cols = {len(lead), len(lead) + 1} | ({1} if groups else set())  # NAME, STATUS, GROUP

    def fmt(line: tuple[str, ...]) -> str:  # text columns left, numbers right
        out = []
        for i, (c, w) in enumerate(zip(line, widths, strict=True)):
            pad = " " * (w - cell_len(c))  # terminal cells: a wide character takes two
            out.append(c + pad if i in text_cols or i == 0 else pad + c)
        return "  ".join(out)

    return "\n".join(fmt(line).rstrip() for line in lines)


#: Where the columns and every ``--format json`` field are explained in full.
DOCS_PAGE = "docs/gpuprofctl.md"

RUNS_HELP = f"""List the runs in DB (default: GPUPROF_DB or ./gpuprof.db), newest first.

\b
Example:
  gpuprofctl runs gpuprof.db

--storage-url URL reads sqlite:///path.db or postgres://user@host/db
instead. --group NAME lists one group's runs by rank, the group's status
first.

\b
Columns (each in full, and every --format json field: {DOCS_PAGE}):
  ID NAME STATUS  the run's id (for insights and kernels), name and status
  GROUP RANK      a run's group (first {GROUP_CHARS} characters) and global rank
  STEPS           steps recorded
  MICRO           micro-batches per step (gradient accumulation)
  MEDIAN_STEP_MS  median of wait + time between steps + step, warm-up excluded
  WAIT%           loader wait: the shares of iteration time add up to 100
  FWD% BWD% OPT%  forward, backward, optimizer
  COMM%           collectives not hidden under backward
  OTHER%          the rest of the step
  SKIPPED         optimizer updates skipped (inf/NaN gradients)
  EVAL            time in evaluation outside steps (ms below 1 s)
  DROPPED         events lost (not sent, or not stored)
"""


def group_line(group: str, rows: list[dict[str, Any]]) -> str:
    """``group NAME: finished (2 ranks: 2 finished)`` over each rank's latest
    run (:func:`reads.latest_rank_runs`, what the group rules compare), then
    ``; 4 runs of 2 ranks: ...`` when a rank has several runs
    (:func:`reads.runs_note`) and ``; rank 3 never reported: ...`` for each
    rank that never did (:func:`reads.missing_ranks`)."""
    latest = reads.latest_rank_runs(rows)
    st = reads.group_status([r["status"] for r in latest])
    counts = ", ".join(f"{n} {s}" for s, n in st["counts"].items())
    n = len(latest)
    line = f"group {group}: {st['status']} ({n} rank{'' if n == 1 else 's'}: {counts})"
    note = reads.runs_note(rows)
    missing = [m["message"] for m in reads.missing_ranks(latest)]
    return "; ".join([line, *([note] if note else []), *missing])


@click.command(
    "runs", help=RUNS_HELP, short_help="Every run: steps, median step, phase split, loader wait."
)
@db_argument
@click.option(
    "--group",
    "group",
    default=None,
    metavar="NAME",
    help="Only this group's runs (torchrun's run id or profile(group=...)).",
)
@storage_url_option
@format_option
def runs_cmd(db: Path | None, group: str | None, storage_url: str | None, fmt: str) -> None:
    rows = read_with(resolve_target(db, storage_url), lambda reader: list_runs(reader, group))
    if fmt == "json":
        echo_json(rows)
    elif not rows:
        click.echo("no runs yet")
    elif group is not None:
        click.echo(group_line(group, rows))
        click.echo(format_table(rows, ranks=True))
    else:
        click.echo(format_table(rows, groups=any(r["group"] for r in rows)))
