"""``gpuprofctl kernels [DB] [RUN_ID] [--compare OTHER]``: a run's kernel
table, or two runs' tables side by side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from gpuprof.kernels import SOURCES
from gpuprofd.commands.common import (
    db_argument,
    echo_json,
    format_option,
    read_with,
    resolve_target,
    run_id_type,
    storage_url_option,
)
from gpuprofd.commands.insights import split_args
from gpuprofd.storage import reads
from gpuprofd.storage.reader import Reader
from gpuprofd.views import kerneltable


@dataclass(frozen=True)
class Side:
    """One run of the command: the run, its kernel windows, the table shown."""

    run: dict[str, Any]
    windows: kerneltable.Windows
    table: kerneltable.KernelTable

    @property
    def label(self) -> str:
        return f"run {self.run['id']} ({self.run['run_name']})"


async def load_tables(
    db: Reader, run_id: int | None, other: int | None, source: str | None, kind: str
) -> tuple[Side, Side | None]:
    """RUN's table and, with *other*, OTHER's; without *source*, both of a
    source both runs have."""
    run = await reads.get_run(db, run_id)
    wa = await reads.kernel_windows(db, run["id"])
    a = Side(run, wa, kerneltable.build_table(wa, source, kind))
    if other is None:
        return a, None
    run_b = await reads.get_run(db, other)
    wb = await reads.kernel_windows(db, run_b["id"])
    if source is None:  # compare like with like: a source both runs have
        shared = kerneltable.common_source(wa, wb, kind)
        if shared:
            a = Side(run, wa, kerneltable.build_table(wa, shared, kind))
        return a, Side(run_b, wb, kerneltable.build_table(wb, shared, kind))
    return a, Side(run_b, wb, kerneltable.build_table(wb, source, kind))


def _no_data(a: Side, b: Side) -> str | None:
    """The text when two runs have nothing to compare (None: they have)."""
    if a.table.total_ns or b.table.total_ns:
        return None
    head = f"no {a.table.kind} data in {a.label} or {b.label}"
    if a.table.lines or b.table.lines:
        head = f"no device time in {a.label} or {b.label}: nothing to compare"
    lines = [head]
    for side in (a, b):
        if side.table.lines:
            lines.append(
                f"{side.label}: {side.table.kind}s without device time (a CPU-only run); "
                f"their FLOPs: gpuprofctl kernels {side.run['id']} --kind {side.table.kind}"
            )
        else:
            lines.append(f"{side.label}: {kerneltable.empty_reason(side.windows, side.table)}")
    return "\n".join(lines)


KERNELS_HELP = """Show a run's kernel table (default: the latest run in DB), or compare
two runs' tables with --compare OTHER_RUN.

\b
Example:
  gpuprofctl kernels 3 --compare 4

\b
The table sums the run's kernel windows of one source (snapshot,
continuous or nsys; default: continuous, else nsys, else snapshot):
SHARE% of device time, COUNT launches, MEAN_US per launch, and ms per
step (when the windows list their steps) or per window.
--compare: per kernel, its time per step (or per window) in RUN (A) and
OTHER_RUN (B), the delta B - A in ms and the ratio B / A, biggest change
first, with per-class totals (compute, comm, memcpy, memset, other).
DB defaults to GPUPROF_DB or ./gpuprof.db (--storage-url URL:
sqlite:///path.db or postgres://user@host/db instead); a lone all-digits
argument that is not an existing file is RUN_ID.
"""


@click.command(
    "kernels", help=KERNELS_HELP, short_help="A run's kernel table, or two runs' compared."
)
@db_argument
@click.argument("run_id", type=run_id_type, required=False)
@click.option(
    "--compare",
    "other",
    type=run_id_type,
    metavar="OTHER_RUN",
    help="Compare RUN (A) with this run (B).",
)
@click.option(
    "--source",
    type=click.Choice(SOURCES),
    default=None,
    help="Which windows to sum (default: see above).",
)
@click.option(
    "--kind",
    type=click.Choice(["kernel", "op"]),
    default="kernel",
    show_default=True,
    help="Device kernels, or framework operators (self device time + FLOPs).",
)
@click.option(
    "--top",
    type=click.IntRange(1),
    metavar="N",
    default=kerneltable.DEFAULT_TOP,
    show_default=True,
    help="Rows in text output (json: all).",
)
@storage_url_option
@format_option
def kernels_cmd(
    db: Path | None,
    run_id: int | None,
    other: int | None,
    source: str | None,
    kind: str,
    top: int,
    storage_url: str | None,
    fmt: str,
) -> None:
    db, run_id = split_args(db, run_id)
    target = resolve_target(db, storage_url)
    a, b = read_with(target, lambda reader: load_tables(reader, run_id, other, source, kind))
    if b is None:
        if fmt == "json":
            echo_json({"run_id": a.run["id"], "run_name": a.run["run_name"], **a.table.to_dict()})
        elif a.table.lines:
            click.echo(f"{a.label}: " + kerneltable.format_table(a.table, top))
        else:
            click.echo(f"{a.label}: " + kerneltable.empty_reason(a.windows, a.table))
        return
    cmp = kerneltable.compare(a.table, b.table)
    cmp["a"].update(run_id=a.run["id"], run_name=a.run["run_name"])
    cmp["b"].update(run_id=b.run["id"], run_name=b.run["run_name"])
    if fmt == "json":
        echo_json(cmp)
    else:
        click.echo(_no_data(a, b) or kerneltable.format_compare(cmp, a.label, b.label, top))
