"""``gpuprofctl stop``: ask a gpuprofd to exit (an auto-started one, above all)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from gpuprof import config
from gpuprofd.commands.client import request
from gpuprofd.commands.common import (
    echo_json,
    format_option,
    resolve_socket_dir,
    socket_dir_option,
    timeout_option,
)
from gpuprofd.commands.status import no_daemon_message
from gpuprofd.core.errors import EXIT_OK, GpuprofdError, NoDaemonError

#: How long to wait for an exiting daemon's control socket to go, seconds.
EXIT_WAIT_S = 10.0


@click.command("stop", short_help="Stop this database's gpuprofd once its runs end.")
@socket_dir_option(
    "The daemon's socket directory [default: GPUPROF_SOCKET, or the per-user "
    "daemon of GPUPROF_DB / ./gpuprof.db]."
)
@click.option(
    "--now",
    is_flag=True,
    help="Exit at once; open runs stay 'running' and the next daemon re-adopts "
    "them while their processes live (their events meanwhile are lost).",
)
@click.argument("db", type=click.Path(path_type=Path), required=False)
@timeout_option
@format_option
def stop_cmd(
    db: Path | None, socket_dir: Path | None, now: bool, timeout_s: float, fmt: str
) -> int:
    """Stop the gpuprofd of this database (exit 3 if none answers).

    \b
    Example:
      gpuprofctl stop --now
      gpuprofctl stop gpuprof-demo.db

    The daemon stopped is the one of DB, else GPUPROF_DB or ./gpuprof.db, or
    the one on --socket-dir DIR or GPUPROF_SOCKET.

    With no open run it exits at once. Otherwise it takes no new runs (their
    gpuprof.profile() runs unprofiled and says why) and exits when its open
    runs have ended; --now exits at once. A later run starts a fresh daemon.
    """
    where = resolve_socket_dir(socket_dir, db)
    try:
        reply = request(where, {"type": "stop", "now": now}, timeout_s)
    except NoDaemonError:
        mine = db if socket_dir is None else None
        raise NoDaemonError(no_daemon_message(where, timeout_s, mine)) from None
    if not reply.get("ok"):
        raise GpuprofdError(f"gpuprofd did not stop: {reply.get('error', 'refused')}")
    pid, open_runs = reply.get("pid"), int(reply.get("open_runs") or 0)
    exited = False
    if reply.get("exiting"):
        control = where / config.CONTROL_SOCKET_NAME
        deadline = time.monotonic() + EXIT_WAIT_S
        while control.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        exited = not control.exists()
    if fmt == "json":
        echo_json(
            {
                "pid": pid,
                "socket_dir": str(where),
                "exiting": bool(reply.get("exiting")),
                "exited": exited,
                "open_runs": open_runs,
            }
        )
    elif not reply.get("exiting"):
        click.echo(
            f"gpuprofd pid {pid} takes no new runs and exits once its {open_runs} open "
            f"run{'' if open_runs == 1 else 's'} end (gpuprofctl status lists them; "
            "gpuprofctl stop --now exits at once)"
        )
    elif exited:
        left = f"; {open_runs} open run(s) left 'running' for the next daemon" if open_runs else ""
        click.echo(f"gpuprofd pid {pid} stopped{left}")
    else:
        click.echo(f"gpuprofd pid {pid} is stopping (still there after {EXIT_WAIT_S:g} s)")
    return EXIT_OK
