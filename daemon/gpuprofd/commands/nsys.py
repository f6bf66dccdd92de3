"""``gpuprofctl nsys-import REPORT.sqlite [--db DB] [--run ID]``: attach an
Nsight Systems export's per-kernel aggregates to a run, aligned with its steps."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import click

from gpuprofd.commands import nsys_report as nsys
from gpuprofd.commands.common import (
    echo_json,
    format_option,
    read_with,
    resolve_db,
    run_id_type,
)
from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import reads, schema
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import steprows
from gpuprofd.storage.writes import Op, runsdb


def _write(db: Path, run_id: int, windows: list[tuple[dict[str, Any], list[Any]]]) -> int:
    """Replace the run's ``nsys`` windows with *windows* in one transaction;
    return how many earlier ones were replaced."""
    schema.prepare(db)  # an older database gets the kernel tables first
    try:
        conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {db} for writing ({exc})") from None
    try:
        conn.execute("BEGIN IMMEDIATE")
        old_sql = "SELECT id FROM kernel_windows WHERE run_id = ? AND source = 'nsys'"
        old = [r[0] for r in conn.execute(old_sql, (run_id,))]
        conn.executemany("DELETE FROM kernel_stats WHERE window_id = ?", [(i,) for i in old])
        conn.execute("DELETE FROM kernel_windows WHERE run_id = ? AND source = 'nsys'", (run_id,))
        for window, rows in windows:
            ops: list[Op] = runsdb.kernel_window_ops(run_id, window, rows)
            conn.execute(ops[0].sql, ops[0].params)
            if len(ops) > 1:
                conn.executemany(ops[1].sql, [op.params for op in ops[1:]])
        conn.execute("COMMIT")
        return len(old)
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise DatabaseError(f"cannot write to {db} ({exc})") from None
    finally:
        conn.close()


async def _run_steps(db: Reader, run_id: int | None) -> tuple[dict[str, Any], list[nsys.Step]]:
    """The run (latest if None) and its timed steps, by t0."""
    run = await reads.get_run(db, run_id)
    steps = [
        nsys.Step(int(r[0]), int(r[1]), int(r[2]))
        for r in await steprows.rows(db, run["id"])
        if r[1] is not None and r[2] is not None
    ]
    return run, steps


def _nothing(msg: str, report: Path, run: dict[str, Any], fmt: str) -> None:
    """Say that nothing was attached (exit 0)."""
    if fmt == "json":
        echo_json(
            {
                "report": str(report),
                "run_id": run["id"],
                "windows": 0,
                "activities": 0,
                "aligned": None,
                "notes": [msg],
            }
        )
    else:
        click.echo(msg)


def _progress(done: int, total: int) -> None:
    click.echo(f"nsys-import: read {done:,} of {total:,} device activities", err=True)


NSYS_HELP = """Attach the per-kernel aggregates of an Nsight Systems report to a run.

\b
Example:
  gpuprofctl nsys-import report.sqlite --run 3

\b
REPORT.sqlite is what `nsys export --type sqlite REPORT.nsys-rep` writes
(read read-only). Kernels, copies and fills are summed per name and classed
(compute, comm = NCCL, memcpy, memset), one window per step of the run
(--run, default the latest run in --db) when the report's clock matches the
run's (the same host's CLOCK_MONOTONIC, or through the report's UTC session
start); otherwise one window for the whole report, and the output says so.
Importing again replaces the run's earlier nsys windows. A report with no
device activity attaches nothing and exits 0. See them with
`gpuprofctl kernels --source nsys`.
"""


@click.command(
    "nsys-import",
    help=NSYS_HELP,
    short_help="Attach an Nsight Systems export's kernels to a run.",
)
@click.argument("report", type=click.Path(path_type=Path))
@click.option(
    "--db",
    type=click.Path(path_type=Path),
    default=None,
    help="gpuprof database (default: GPUPROF_DB or ./gpuprof.db).",
)
@click.option(
    "--run",
    "run_id",
    type=run_id_type,
    default=None,
    help="Run id (default: the latest run).",
)
@click.option(
    "--device",
    type=click.IntRange(0),
    metavar="INDEX",
    default=None,
    help="Only this CUDA device's activity (a report of several GPUs).",
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@format_option
def nsys_import_cmd(
    report: Path, db: Path | None, run_id: int | None, device: int | None, quiet: bool, fmt: str
) -> None:
    path = resolve_db(db)
    run, steps = read_with(path, lambda reader: _run_steps(reader, run_id))
    rep = nsys.open_report(report)
    notes: list[str] = []
    try:
        if rep.total == 0:
            _nothing(
                f"{report}: no CUDA kernel, memcpy or memset activity (was it recorded "
                "with --trace=cuda?); nothing attached",
                report,
                run,
                fmt,
            )
            return
        devs = nsys.devices(rep)
        if device is None and len(devs) > 1:
            notes.append(
                f"the report holds activity of devices {devs}: all summed (--device N for one)"
            )
        span = nsys.time_range(rep, device)
        how = None
        if span is not None:
            how = nsys.choose_alignment(
                span,
                steps,
                run.get("start_wall_ns"),
                run.get("start_mono_ns"),
                rep.session_start_utc_ns,
            )
        progress = None if quiet or rep.total <= nsys.CHUNK_ROWS else _progress
        place_at = steps[0].t0 if steps else run.get("start_mono_ns")
        got = nsys.collect(rep, steps, how[1] if how else None, device, progress, place_at)
    finally:
        rep.close()
    if not got.activities:
        on = f" on device {device}" if device is not None else ""
        _nothing(f"{report}: no device activity{on}; nothing attached", report, run, fmt)
        return
    if how is None:
        why = (
            "the run has no steps"
            if not steps
            else (
                "the report's clock does not match the run's steps (another host, or another time)"
            )
        )
        notes.append(f"not aligned with steps: {why}; stored as one window")
    if got.outside:
        notes.append(f"{got.outside:,} activities outside the run's steps left out")
    if rep.bad_rows:
        notes.append(
            f"{rep.bad_rows:,} device activities with a negative or longer than "
            "7-day duration left out"
        )
    replaced = _write(path, run["id"], got.windows)
    if replaced:
        notes.append(f"replaced {replaced} earlier nsys window(s) of this run")
    step_ids = [s for w, _ in got.windows for s in w["steps"]]
    out = {
        "report": str(report),
        "db": str(path),
        "run_id": run["id"],
        "run_name": run["run_name"],
        "name_column": rep.name_column,
        "activities": got.activities,
        "kernels": rep.counts.get(nsys.KERNEL_TABLE, 0),
        "windows": len(got.windows),
        "aligned": how[0] if how else None,
        "steps": [min(step_ids), max(step_ids)] if step_ids else None,
        "notes": notes,
    }
    if fmt == "json":
        echo_json(out)
        return
    where = (
        f"{len(got.windows)} step window(s), steps {out['steps'][0]}-{out['steps'][1]} "
        f"(clocks matched by {how[0]})"
        if how and step_ids
        else "one window"
    )
    click.echo(
        f"imported {got.activities:,} device activities from {report} into run "
        f"{run['id']} ({run['run_name']}): {where}"
    )
    for n in notes:
        click.echo(f"note: {n}")
