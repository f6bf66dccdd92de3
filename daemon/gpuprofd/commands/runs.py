"""``gpuprofctl runs [DB]``: one line per run with its time breakdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuprofd import dbread
from gpuprofd.commands.common import db_argument, echo_json, format_option, resolve_db

PHASES = ("forward", "backward", "optimizer")


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 1) if whole > 0 else None


def describe(run: dict[str, Any], median_ms: float | None) -> dict[str, Any]:
    """One run's row: phase shares are % of step time; loader wait is % of
    iteration time (wait + step), the first step excluded."""
    agg = run["agg"] or {}
    step_ns = agg.get("step_ns") or 0
    phase_pct: dict[str, float | None] = {p: _pct(agg.get(f"{p}_ns") or 0, step_ns) for p in PHASES}
    known = sum(v for v in phase_pct.values() if v is not None)
    phase_pct["other"] = round(max(100.0 - known, 0.0), 1) if step_ns > 0 else None
    wait_ns = agg.get("wait_ns") or 0
    return {
        "id": run["id"],
        "run_name": run["run_name"],
        "status": run["status"],
        "steps": agg.get("steps", 0),
        "median_step_ms": median_ms,
        "phase_pct": phase_pct,
        "loader_wait_pct": _pct(wait_ns, wait_ns + (agg.get("steady_step_ns") or 0)),
        "dropped_events": run.get("dropped_events") or 0,
        "start_wall_ns": run.get("start_wall_ns"),
    }


def list_runs(db: Path) -> list[dict[str, Any]]:
    conn = dbread.open_ro(db)
    try:
        out = []
        for run in dbread.runs_overview(conn):
            median_ms = run.get("median_step_ms")
            if median_ms is None and run["agg"]:  # still running: compute it now
                median_ms = dbread.run_context(conn, run).median_step_ms
                median_ms = round(median_ms, 3) if median_ms is not None else None
            out.append(describe(run, median_ms))
        return out
    finally:
        conn.close()


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ("ID", "NAME", "STATUS", "STEPS", "MEDIAN_MS", "FWD%", "BWD%", "OPT%", "OTHER%",
              "WAIT%", "DROPPED")  # fmt: skip
    lines = [header]
    for r in rows:
        p = r["phase_pct"]
        lines.append((
            str(r["id"]), r["run_name"][:40], r["status"], str(r["steps"]),
            _cell(r["median_step_ms"]), _cell(p["forward"]), _cell(p["backward"]),
            _cell(p["optimizer"]), _cell(p["other"]), _cell(r["loader_wait_pct"]),
            str(r["dropped_events"]),
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def fmt(line: tuple[str, ...]) -> str:  # text columns left, numbers right
        cells = zip(line, widths, strict=True)
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(cells))

    return "\n".join(fmt(line).rstrip() for line in lines)


@click.command("runs")
@db_argument
@format_option
def runs_cmd(db: Path | None, fmt: str) -> None:
    """List the runs in DB, newest first."""
    rows = list_runs(resolve_db(db))
    if fmt == "json":
        echo_json(rows)
    elif not rows:
        click.echo("no runs yet")
    else:
        click.echo(format_table(rows))
