"""``gpuprofctl kernels [DB] [RUN_ID] [--compare OTHER]``: a run's kernel
table, or two runs' tables side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuprof.kernels import SOURCES
from gpuprofd import kerneltable
from gpuprofd.commands.common import (
    db_argument,
    echo_json,
    format_option,
    read_with,
    resolve_target,
    storage_url_option,
)
from gpuprofd.commands.insights import split_args
from gpuprofd.storage import reads
from gpuprofd.storage.reader import Reader

_RUN_ID = click.IntRange(1, 2**63 - 1)


async def load_table(
    db: Reader, run: dict[str, Any], source: str | None, kind: str
) -> kerneltable.KernelTable:
    return kerneltable.build_table(await reads.kernel_windows(db, run["id"]), source, kind)


async def load_tables(
    db: Reader, run_id: int | None, other: int | None, source: str | None, kind: str
) -> tuple[
    dict[str, Any], kerneltable.KernelTable, dict[str, Any] | None, kerneltable.KernelTable | None
]:
    """RUN's table and, with *other*, OTHER's: (run, table, run_b, table_b);
    without *source*, both of a source both runs have."""
    run = await reads.get_run(db, run_id)
    table = await load_table(db, run, source, kind)
    if other is None:
        return run, table, None, None
    run_b = await reads.get_run(db, other)
    if source is None:  # compare like with like: a source both runs have
        wa = await reads.kernel_windows(db, run["id"])
        wb = await reads.kernel_windows(db, run_b["id"])
        shared = kerneltable.common_source(wa, wb, kind)
        table = kerneltable.build_table(wa, shared, kind) if shared else table
        table_b = kerneltable.build_table(wb, shared, kind)
    else:
        table_b = await load_table(db, run_b, source, kind)
    return run, table, run_b, table_b


def _label(run: dict[str, Any]) -> str:
    return f"run {run['id']} ({run['run_name']})"


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
@click.argument("run_id", type=_RUN_ID, required=False)
@click.option(
    "--compare",
    "other",
    type=_RUN_ID,
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
    run, table, run_b, table_b = read_with(
        target, lambda reader: load_tables(reader, run_id, other, source, kind)
    )
    if run_b is None or table_b is None:
        if fmt == "json":
            echo_json({"run_id": run["id"], "run_name": run["run_name"], **table.to_dict()})
        else:
            click.echo(f"{_label(run)}: " + kerneltable.format_table(table, top))
        return
    cmp = kerneltable.compare(table, table_b)
    cmp["a"].update(run_id=run["id"], run_name=run["run_name"])
    cmp["b"].update(run_id=run_b["id"], run_name=run_b["run_name"])
    if fmt == "json":
        echo_json(cmp)
    elif not table.lines and not table_b.lines:
        click.echo(f"no kernel data in {_label(run)} or {_label(run_b)}")
    else:
        click.echo(kerneltable.format_compare(cmp, _label(run), _label(run_b), top))
