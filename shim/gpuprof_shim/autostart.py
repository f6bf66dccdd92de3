"""Start a per-user gpuprofd when ``hello`` finds none, then wait for it.

The daemon is spawned detached (its own session, stdin closed, output
appended to ``<socket dir>/gpuprofd.log``) and exits by itself after being
idle. If two training processes race, both may spawn one; the daemon's file
lock leaves one running, so this module only spawns and retries ``hello``.
The whole wait is bounded (~15 s, cut short when the spawned daemon exits):
training never fails for want of a daemon.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuprof.config import CONTROL_SOCKET_NAME, LOG_NAME

log = logging.getLogger("gpuprof.shim")

#: How long to keep retrying ``hello`` after spawning, seconds: a daemon's
#: start (Python, aiohttp, the database) took over 5 s on a 2-core box at a
#: load average of 15 (2026-12-01), and a run that misses it records nothing.
WAIT_S = 15.0
#: Pause between ``hello`` retries, seconds.
RETRY_INTERVAL_S = 0.15
#: After the spawned process exits (it lost the lock race, or crashed), how
#: much longer to retry: a racing winner may still be starting, seconds.
EXIT_GRACE_S = 1.0
#: Idle time after which the auto-started daemon exits, seconds.
IDLE_EXIT_S = 300

#: Daemons this process spawned; kept referenced so an unreaped child never
#: warns, and reaped when found exited.
_spawned: list[subprocess.Popen[bytes]] = []


def daemon_argv(socket_dir: Path, db: Path, server: str | None = None) -> list[str]:
    """The command that starts gpuprofd for *socket_dir* and *db*, forwarding
    to team server *server* if given (its key: the environment's)."""
    argv = [
        sys.executable,
        "-m",
        "gpuprofd",
        "--socket-dir",
        str(socket_dir),
        "--db",
        str(db),
        "--idle-exit",
        str(IDLE_EXIT_S),
    ]
    return [*argv, "--server", server] if server else argv


def spawned_processes() -> list[subprocess.Popen[bytes]]:
    """The daemons this process started that have not been reaped yet."""
    _spawned[:] = [p for p in _spawned if p.poll() is None]
    return list(_spawned)


def spawn(argv: Sequence[str], socket_dir: Path) -> subprocess.Popen[bytes] | None:
    """Create *socket_dir* (mode 0700) and start *argv* detached; None if that fails."""
    try:
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        fd = os.open(socket_dir / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                list(argv),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                close_fds=True,
            )
        finally:
            os.close(fd)
    except Exception as exc:
        log.warning("gpuprof: could not start gpuprofd (%s): %s", argv[0] if argv else "", exc)
        return None
    spawned_processes()  # reap earlier ones that exited
    _spawned.append(proc)
    return proc


def start_and_hello(
    hello: Callable[[], dict[str, Any] | None],
    socket_dir: Path,
    argv: Sequence[str],
    *,
    wait_s: float | None = None,
    interval_s: float = RETRY_INTERVAL_S,
    exit_grace_s: float = EXIT_GRACE_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | None:
    """Spawn the daemon and retry *hello* until it answers or time is up.

    Args:
        hello: sends one ``hello`` and returns the reply, or None.
        socket_dir: where the daemon binds; a retry is skipped while its
            control socket file does not exist yet (connecting would only time out).
        argv: the daemon command (:func:`daemon_argv`).
        wait_s: total retry budget after spawning, seconds (default :data:`WAIT_S`).
        interval_s: pause between retries, seconds.
        exit_grace_s: extra retry time once the spawned process has exited, seconds.

    Returns:
        The first reply, or None if the daemon never answered.
    """
    wait_s = WAIT_S if wait_s is None else wait_s
    proc = spawn(argv, socket_dir)
    if proc is None:
        return None
    control = Path(socket_dir) / CONTROL_SOCKET_NAME
    deadline = clock() + wait_s
    while clock() < deadline:
        if control.exists():
            reply = hello()
            if reply is not None:
                return reply
        if proc.returncode is None and proc.poll() is not None:
            log.debug("gpuprof: spawned gpuprofd exited with %s", proc.returncode)
            deadline = min(deadline, clock() + exit_grace_s)
        sleep(interval_s)
    log.debug("gpuprof: gpuprofd did not answer within %.1f s", wait_s)
    return None


def log_tail(socket_dir: Path, max_chars: int = 300) -> str | None:
    """The last line the auto-started daemon wrote to its log (its error,
    when it exited at start), or None."""
    try:
        with open(Path(socket_dir) / LOG_NAME, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return None
    last = next((ln for ln in reversed(lines) if ln), None)
    return last[:max_chars] if last else None
