"""``gpuprofctl status``: is a daemon answering, and what is it doing?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuprof import config
from gpuprofd.client import ping
from gpuprofd.commands.common import echo_json, format_option


def format_status(reply: dict[str, Any]) -> str:
    lines = [
        f"gpuprofd pid {reply['pid']}",
        f"  socket dir: {reply['socket_dir']}",
        f"  database:   {reply['db']}",
        f"  received:   {reply.get('received', 0)} events",
    ]
    live = reply.get("live_runs") or []
    lines.append(f"  live runs:  {len(live)}")
    for r in live:
        lines.append(f"    #{r['run_id']} {r['run_name']} (pid {r['pid']}, {r['steps']} steps)")
    dropped = reply.get("dropped") or {}
    if dropped:
        lines.append("  dropped:    " + ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())))
    else:
        lines.append("  dropped:    none")
    return "\n".join(lines)


@click.command("status")
@click.option("--socket-dir", type=click.Path(path_type=Path), default=None,
              help="The daemon's socket directory [default: GPUPROF_SOCKET, ...].")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.05), default=1.0,
              show_default=True, help="Seconds to wait for the daemon's answer.")
@format_option
def status_cmd(socket_dir: Path | None, timeout_s: float, fmt: str) -> None:
    """Ping the node's gpuprofd (exit 3 if none answers)."""
    reply = ping((socket_dir or config.socket_dir()).expanduser().absolute(), timeout_s)
    if fmt == "json":
        echo_json(reply)
    else:
        click.echo(format_status(reply))
