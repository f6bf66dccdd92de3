"""``gpuprofctl rollup``: the team's GPU-hours for a period, by user,
project, node, run name or finding (what the "GPU-hours" page shows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuprofd.commands.common import (
    db_argument,
    echo_json,
    read_with,
    resolve_target,
    storage_url_option,
)
from gpuprofd.commands.termtext import safe
from gpuprofd.views.rollups import BY_CHOICES, team_rollup, to_csv

ROLLUP_HELP = """The team's GPU-hours in DB (or --storage-url) for a period, grouped.

\b
Example:
  gpuprofctl rollup --storage-url postgres://gpuprof@db/gpuprof --by project --since 7d

\b
Columns:
  RUNS        runs that ended in the period
  GPU_H       GPU-hours (wall time x GPUs)
  USD         at the cost line's rate (GPUPROF_GPU_RATE or the price table); - unpriced
  LOST_GPU_H  GPU-hours fixing every finding would save (each run's lost time once)
  SHARE       of all the period's GPU-hours
  TREND       GPU-hours against the period before, of the same length
Then the costliest findings across all runs, with their fix.
"""


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.0f}%" if signed else f"{x * 100:.0f}%"


def _money(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def format_rollup(out: dict[str, Any]) -> str:
    """The rollup as text: a totals line, the groups' table, the top findings."""
    t = out["totals"]
    lines = [
        f"{t['runs']} runs, {t['gpu_hours']:.1f} GPU-hours (${_money(t['usd'])}), "
        f"{t['lost_gpu_hours']:.1f} lost ({_pct(t['lost_share'])})"
    ]
    head = (out["by"].upper(), "RUNS", "GPU_H", "USD", "LOST_GPU_H", "SHARE", "TREND")
    rows = [head]
    for g in out["groups"]:
        hours = g.get("gpu_hours")
        rows.append(
            (
                safe("-" if g["key"] is None else g["key"])[:40],
                str(g["runs"]),
                "-" if hours is None else f"{hours:.1f}",
                _money(g.get("usd", g.get("lost_usd"))),
                f"{g['lost_gpu_hours']:.1f}",
                _pct(g["share"]),
                _pct(g.get("trend", g.get("lost_trend")), signed=True),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    if out["findings"]:
        lines.append("")
        lines.append("costliest findings:")
        for f in out["findings"][:3]:
            fix = f" — {safe(f['fix'])}" if f.get("fix") else ""
            lines.append(
                f"  {f['rule']}: {f['lost_gpu_hours']:.1f} GPU-hours lost in {f['runs']} runs{fix}"
            )
    return "\n".join(lines)


@click.command(
    "rollup", help=ROLLUP_HELP, short_help="GPU-hours and lost GPU-hours by user, project, ..."
)
@db_argument
@storage_url_option
@click.option(
    "--by", "by", type=click.Choice(BY_CHOICES), default="project", show_default=True,
    help="Group by user, project, node, run name or finding.",
)  # fmt: skip
@click.option(
    "--since", "since", default="7d", show_default=True, metavar="WHEN",
    help="The period's start: 24h, 7d, 30d, 2w back, or unix seconds.",
)  # fmt: skip
@click.option(
    "--until", "until", type=float, default=None, metavar="UNIX_S",
    help="The period's end (unix seconds; default now).",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "csv"]), default="text",
    show_default=True, help="Output format.",
)  # fmt: skip
def rollup_cmd(
    db: Path | None, storage_url: str | None, by: str, since: str, until: float | None, fmt: str
) -> None:
    try:
        out = read_with(resolve_target(db, storage_url), lambda r: team_rollup(r, by, since, until))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since / --until") from None
    if fmt == "json":
        echo_json(out)
    elif fmt == "csv":
        click.echo(to_csv(out), nl=False)
    else:
        click.echo(format_rollup(out))
