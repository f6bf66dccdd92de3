"""``gpuprofctl status``: is a daemon answering, and what is it doing?"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from gpuprof import config
from gpuprofd.commands.client import ping
from gpuprofd.commands.common import (
    echo_json,
    format_option,
    resolve_socket_dir,
    socket_dir_option,
    timeout_option,
)
from gpuprofd.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_NO_DAEMON,
    EXIT_OK,
    BadInputError,
    NoDaemonError,
)
from gpuprofd.storage.url import redact


def format_status(reply: dict[str, Any]) -> str:
    lines = [
        f"gpuprofd pid {reply['pid']}",
        f"  socket dir: {reply['socket_dir']}",
        f"  database:   {reply['db']}",
        f"  dashboard:  {_dashboard(reply)}",
        *_log_line(reply),
        f"  received:   {reply.get('received', 0)} events",
    ]
    live = reply.get("live_runs") or []
    lines.append(f"  live runs:  {len(live)}")
    for r in live:
        lines.append(f"    #{r['run_id']} {r['run_name']} (pid {r['pid']}, {r['steps']} steps)")
    gpu = reply.get("gpu_sampling") or {}
    if gpu.get("on"):
        fast, slow = gpu.get("fast") or {}, gpu.get("slow") or {}
        lines.append(
            f"  GPU sampling: {gpu.get('gpus', 0)} GPU(s) ({gpu.get('backend')}), {_hz(fast)} "
            f"({fast.get('missed_ticks', 0)} slots missed), slow loop {_hz(slow)}"
        )
    elif gpu:
        lines.append(f"  GPU sampling: off ({gpu.get('why')})")
    lines.extend(forward_lines(reply.get("forward")))
    dropped = reply.get("dropped") or {}
    if dropped:
        lines.append("  dropped:    " + ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())))
    else:
        lines.append("  dropped:    none")
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _age(wall_ns: int | None, now_ns: int) -> str:
    if wall_ns is None:
        return "-"
    s = max(0.0, (now_ns - wall_ns) / 1e9)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def forward_lines(fwd: dict[str, Any] | None, now_ns: int | None = None) -> list[str]:
    """The forwarding lines of ``gpuprofctl status``: the server, the backlog
    (events, bytes, oldest age), the last error, dead letters and what a full
    outbox gave up; nothing when the daemon does not forward."""
    if not fwd:
        return ["  forwarding: off (gpuprofd --server URL, or GPUPROF_SERVER)"]
    now_ns = time.time_ns() if now_ns is None else now_ns
    state = fwd.get("state", "?")
    lines = [f"  forwarding: to {fwd.get('server')} ({state})"]
    box = fwd.get("outbox")
    if box is None:
        lines.append(f"    backlog:  unknown ({fwd.get('outbox_error')})")
    else:
        lines.append(
            f"    backlog:  {box['events']} events, {_size(box['bytes'])}, oldest "
            f"{_age(box['oldest_wall_ns'], now_ns)} old (bound {_size(fwd.get('max_bytes', 0))})"
        )
    acked = fwd.get("last_ack_wall_ns")
    lines.append(
        f"    sent:     {fwd.get('sent_events', 0)} events in {fwd.get('sent_batches', 0)} "
        "batches, "
        + (f"last acknowledged {_age(acked, now_ns)} ago" if acked else "none acknowledged yet")
    )
    if fwd.get("last_error") and state != "ok":
        lines.append(
            f"    error:    {fwd['last_error']} ({_age(fwd.get('last_error_wall_ns'), now_ns)} ago)"
        )
    if box is not None and box["dead_events"]:
        lines.append(
            f"    refused:  {box['dead_events']} events dead-lettered (not sent again); "
            f"latest: {box['dead_reason']}"
        )
    if box is not None and box["given_up_events"]:
        lines.append(
            f"    given up: {box['given_up_events']} events ({_size(box['given_up_bytes'])}) "
            "over the outbox bound (--forward-max-mb), not forwarded"
        )
    return lines


def _dashboard(reply: dict[str, Any]) -> str:
    """The dashboard's URL, or why there is none."""
    if "dashboard_url" not in reply:
        return "none (this gpuprofd predates the dashboard: gpuprofctl stop, then start it again)"
    return reply["dashboard_url"] or "none (gpuprofd was started with --http off)"


def _log_line(reply: dict[str, Any]) -> list[str]:
    """Where an auto-started daemon logs (systemd's goes to the journal)."""
    log = Path(reply["socket_dir"]) / config.LOG_NAME
    return [f"  log:        {log}"] if log.exists() else []


def _hz(loop: dict[str, Any]) -> str:
    achieved = loop.get("achieved_hz")
    got = "-" if achieved is None else f"{achieved:.1f}"
    return f"{got} of {loop.get('requested_hz', 0):g} Hz"


#: How long ``status`` and ``stop`` wait for each other daemon to say which
#: database it serves (all are asked at once), seconds.
OTHER_DAEMON_TIMEOUT_S = 0.5


def other_daemons(socket_dir: Path) -> list[str]:
    """Socket directories of other per-user daemons (other databases) beside
    *socket_dir* that hold a control socket."""
    base = config.socket_base_dir()
    if socket_dir.parent != base.absolute():
        return []
    return sorted(
        str(p.parent)
        for p in base.glob(f"*/{config.CONTROL_SOCKET_NAME}")
        if p.parent != socket_dir
    )


def _database_of(socket_dir: str, timeout_s: float) -> str | None:
    """The database the daemon on *socket_dir* serves, as its ping says it
    (a storage URL's password masked); None when it does not answer."""
    try:
        db = ping(Path(socket_dir), timeout_s).get("db")
    except (NoDaemonError, BadInputError):
        return None
    if not isinstance(db, str) or not db:
        return None
    return redact(db) if "://" in db else db  # the daemon masks it; an older one may not


def describe_other_daemons(socket_dir: Path, timeout_s: float) -> list[str]:
    """Each of :func:`other_daemons` as ``DATABASE (--socket-dir DIR)``, its
    database asked of it (all at once, waiting at most *timeout_s*);
    ``a daemon not answering (--socket-dir DIR)`` for one that does not say."""
    dirs = other_daemons(socket_dir)
    if not dirs:
        return []
    wait_s = min(timeout_s, OTHER_DAEMON_TIMEOUT_S)
    with ThreadPoolExecutor(max_workers=min(len(dirs), 32)) as pool:  # stale ones wait it out
        dbs = list(pool.map(lambda d: _database_of(d, wait_s), dirs))
    return [
        f"{db or 'a daemon not answering'} (--socket-dir {d})"
        for d, db in zip(dirs, dbs, strict=True)
    ]


def no_daemon_message(socket_dir: Path, timeout_s: float, db: Path | None = None) -> str:
    """Why no daemon answered on *socket_dir* (that of the database *db*, when
    given), and what to do about it."""
    others = describe_other_daemons(socket_dir, timeout_s)
    if others:
        which = f"for {db}" if db is not None else "for this database (GPUPROF_DB or ./gpuprof.db)"
        return (
            f"no gpuprofd {which} on {socket_dir}; "
            f"daemons of other databases: {'; '.join(others)} "
            "(see one with its --socket-dir DIR)"
        )
    if (socket_dir / config.CONTROL_SOCKET_NAME).exists():
        return (
            f"no gpuprofd answered on {socket_dir} within {timeout_s:g} s: its control socket "
            "is there, so a daemon is busy or stuck, or one died and left it; retry with "
            "--timeout, or run `gpuprofd` (see systemd/gpuprofd.service)"
        )
    return (
        f"no gpuprofd answering on {socket_dir}: one starts by itself when a script enters "
        "gpuprof.profile(), or run `gpuprofd` (see systemd/gpuprofd.service)"
    )


@click.command("status", short_help="Is this database's gpuprofd running? Its live runs.")
@socket_dir_option(
    "The daemon's socket directory [default: GPUPROF_SOCKET, or the per-user "
    "daemon of GPUPROF_DB / ./gpuprof.db]."
)
@click.argument("db", type=click.Path(path_type=Path), required=False)
@timeout_option
@format_option
def status_cmd(db: Path | None, socket_dir: Path | None, timeout_s: float, fmt: str) -> int:
    """Ping the gpuprofd of this database (exit 3 if none answers): its pid,
    socket directory, database, live runs, GPU sampling and drops.

    \b
    Example:
      gpuprofctl status
      gpuprofctl status gpuprof-demo.db

    The daemon asked is the one of DB, else GPUPROF_DB or ./gpuprof.db (each database
    gets its own auto-started daemon), or the one on --socket-dir DIR or
    GPUPROF_SOCKET (a node-wide daemon under systemd: /run/gpuprof).

    With --format json and no daemon, prints {"running": false, "socket_dir":
    ..., "error": ...} and still exits 3.
    """
    where = resolve_socket_dir(socket_dir, db)
    try:
        reply = ping(where, timeout_s)
    except BadInputError as exc:
        if fmt != "json":
            raise
        echo_json({"running": False, "socket_dir": str(where), "error": str(exc)})
        return EXIT_BAD_INPUT
    except NoDaemonError:
        message = no_daemon_message(where, timeout_s, db if socket_dir is None else None)
        if fmt != "json":
            raise NoDaemonError(message) from None
        echo_json({"running": False, "socket_dir": str(where), "error": message})
        return EXIT_NO_DAEMON
    if fmt == "json":
        echo_json({"running": True, "dashboard_url": None, **reply})
    else:
        click.echo(format_status(reply))
    return EXIT_OK
