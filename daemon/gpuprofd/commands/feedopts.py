"""What ``gpuprofctl top`` and ``watch`` share: where the live feed is (this
database's gpuprofd, found by its control socket, or a team server given
with ``--server``), with which credentials, and how the view is shown
(full screen, plain text, one frame)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from gpuprof import config
from gpuprofd.commands.client import ping
from gpuprofd.commands.common import resolve_socket_dir, socket_dir_option
from gpuprofd.commands.liveclient import Credentials, FeedClient, open_client
from gpuprofd.commands.screen import View, drive
from gpuprofd.commands.status import no_daemon_message
from gpuprofd.core.errors import EXIT_OK, BadInputError, NoDaemonError
from gpuprofd.forward.config import ApiKey, check_server_url

#: Seconds between redraws in a terminal, and between prints as plain text.
TTY_INTERVAL_S, PLAIN_INTERVAL_S = 1.0, 10.0


def feed_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a command that reads the live feed."""
    options = [
        socket_dir_option(
            "The gpuprofd's socket directory [default: GPUPROF_SOCKET, or the per-user "
            "daemon of DB / GPUPROF_DB / ./gpuprof.db]."
        ),
        click.option(
            "--server",
            metavar="URL",
            default=None,
            help="A team server's feed instead (gpuprofd serve): its runs of every node.",
        ),
        click.option(
            "--api-key-file",
            metavar="FILE",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="With --server: an API key of the server (default: GPUPROF_API_KEY_FILE "
            "or GPUPROF_API_KEY).",
        ),
        click.option(
            "--viewer-password-file",
            metavar="FILE",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="The viewers' password (its first line), for a server or dashboard "
            "behind a login; in a terminal it is asked for when needed.",
        ),
        click.option("--once", is_flag=True, help="Print one frame and exit."),
        click.option(
            "--interval",
            "interval_s",
            type=click.FloatRange(min=0.2),
            metavar="SECONDS",
            default=None,
            help=f"Seconds between redraws [default: {TTY_INTERVAL_S:g} in a terminal, "
            f"{PLAIN_INTERVAL_S:g} as plain text].",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(min=0.05),
            metavar="SECONDS",
            default=2.0,
            show_default=True,
            help="Seconds to wait for the daemon's answer.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@dataclass(frozen=True)
class FeedTarget:
    """Where the feed is (``http(s)://host:port``) and with what to read it."""

    url: str
    creds: Credentials


def read_password(path: Path) -> str:
    """The password in *path*'s first non-empty line.

    Raises:
        BadInputError: unreadable, empty, or an argon2 hash (the server's
            file; the password itself is needed here).
    """
    try:
        lines = [ln.strip() for ln in path.read_text().splitlines()]
    except OSError as exc:
        raise BadInputError(
            f"cannot read the viewer password file {path} ({exc.strerror or exc})"
        ) from None
    line = next((ln for ln in lines if ln), "")
    if not line:
        raise BadInputError(f"the viewer password file {path} is empty")
    if line.startswith("$argon2"):
        raise BadInputError(
            f"{path} holds a password hash (the server's file): give a file with the password"
        )
    return line


def resolve_feed(
    db: Path | None,
    socket_dir: Path | None,
    server: str | None,
    api_key_file: Path | None,
    password_file: Path | None,
    timeout_s: float,
) -> FeedTarget:
    """The feed: *server*'s, or the dashboard of the gpuprofd on *socket_dir*
    (default: the per-user daemon of *db*, ``GPUPROF_DB`` or ``./gpuprof.db``).

    Raises:
        NoDaemonError: no gpuprofd answers (where it was looked for, and why).
        BadInputError: it serves no dashboard (``--http off``); a bad
            ``--server`` URL; an unreadable key or password file.
    """
    password = read_password(password_file) if password_file is not None else None
    if server is not None:
        url = check_server_url(server)
        key_path = api_key_file or config.api_key_file()
        key = None
        if key_path is not None or config.api_key():
            key = ApiKey(text=config.api_key(), path=key_path).get()
        return FeedTarget(url, Credentials(api_key=key, password=password))
    if api_key_file is not None:
        raise click.UsageError("--api-key-file goes with --server URL (a team server)")
    mine = db if socket_dir is None else None
    if socket_dir is None and db is not None:
        socket_dir = config.socket_dir(db=db.expanduser())
    where = resolve_socket_dir(socket_dir)
    try:
        reply = ping(where, timeout_s)
    except NoDaemonError:
        raise NoDaemonError(no_daemon_message(where, timeout_s, mine)) from None
    url = reply.get("dashboard_url")
    if not url:
        raise BadInputError(
            f"the gpuprofd on {where} serves no dashboard (started with --http off), and "
            "this view reads the dashboard's live feed: start it without --http off"
        )
    return FeedTarget(str(url), Credentials(password=password))


def _prompt(url: str) -> Callable[[], str | None] | None:
    """In a terminal, a prompt for the viewers' password of *url*; else None."""
    if not (sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty()):
        return None
    return lambda: click.prompt(
        f"viewer password for {url}", hide_input=True, default="", show_default=False, err=True
    )


def show(
    target: FeedTarget,
    make_view: Callable[[FeedClient], Awaitable[View]],
    once: bool,
    interval_s: float | None,
) -> int:
    """Run the view *make_view* builds over *target*'s feed: full screen in a
    terminal, plain text otherwise, one frame with *once*. Exit 0 when it
    is quit (q, Ctrl-C) or ends."""
    console = Console()
    mode = "once" if once else "tty" if console.is_terminal else "plain"
    interval = interval_s or (TTY_INTERVAL_S if console.is_terminal else PLAIN_INTERVAL_S)

    async def main() -> None:
        async with open_client(target.url, target.creds, _prompt(target.url)) as client:
            view = await make_view(client)
            await drive(client, view, mode, interval, console)

    # SIGTERM ends it as Ctrl-C does: the terminal's modes and screen restored first
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK
