"""``gpuprofctl drain``: send what a stopped daemon left in a database's
outbox to the team server, with progress; exit 0 only when everything was
acknowledged. A later drain resumes where one stopped (the outbox keeps
whatever was not acknowledged)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import click

from gpuprof import config
from gpuprofd.commands.common import echo_json, format_option, resolve_db
from gpuprofd.core.counters import DropCounter
from gpuprofd.core.errors import EXIT_FAILURE, EXIT_OK, BadInputError
from gpuprofd.core.lock import InstanceLock
from gpuprofd.forward.client import Paused, Retry
from gpuprofd.forward.config import resolve
from gpuprofd.forward.forwarder import Forwarder
from gpuprofd.storage import schema
from gpuprofd.storage.writes import Store, outbox

DRAIN_HELP = """Upload what a stopped gpuprofd had not yet sent to the team server.

\b
Example:
  gpuprofctl drain /var/lib/gpuprof/gpuprof.db --server https://gpuprof.example:8000

A gpuprofd that forwards runs to a team server (started with --server, or
with GPUPROF_SERVER set) keeps in its database file whatever the server has
not yet confirmed, and sends it in the background. When that daemon stops
before everything is sent (the server was down, or an auto-started daemon
exited 5 minutes after its last run), the rest waits in the file until a
forwarding daemon starts on it again. Run drain to send it now: before you
delete or move the file, or when no more runs will start on that node. It
shows progress, and a second drain picks up where one stopped.

Only for a database no gpuprofd is using: a running daemon sends the
rest itself (gpuprofctl status shows how much is left), so drain refuses
while one runs; stop it first (gpuprofctl stop) to drain by hand.

The server is --server, else GPUPROF_SERVER, else the one the file last
forwarded to; its API key is --api-key-file, else GPUPROF_API_KEY_FILE or
GPUPROF_API_KEY.

Exit 0: the server confirmed everything. Exit 1: something is left (the
server did not answer for --give-up-after seconds: run drain again), or the
server refused part of it (set aside, never sent again; the output says
why).

DB: the database file (default: GPUPROF_DB or ./gpuprof.db).
"""


@click.command(
    "drain", help=DRAIN_HELP, short_help="Upload a stopped daemon's unsent runs to the team server."
)
@click.argument("db", type=click.Path(path_type=Path), required=False)
@click.option(
    "--server",
    metavar="URL",
    default=None,
    help="The team server (default: GPUPROF_SERVER, else the one DB last forwarded to).",
)
@click.option(
    "--api-key-file",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The API key (default: GPUPROF_API_KEY_FILE or GPUPROF_API_KEY).",
)
@click.option(
    "--give-up-after",
    "give_up_after_s",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="Stop when the server has not answered for this long (what is left stays).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@format_option
def drain_cmd(
    db: Path | None,
    server: str | None,
    api_key_file: Path | None,
    give_up_after_s: float,
    quiet: bool,
    fmt: str,
) -> None:
    path = resolve_db(db)
    if not path.is_file():
        raise BadInputError(
            f"no database at {path}: give the database file to drain (a run's prof.db names it)"
        )
    lock = InstanceLock(path, write_pid=False)
    if not lock.acquire():
        raise BadInputError(
            f"{path} is served by a running gpuprofd, which forwards its outbox itself "
            "(gpuprofctl status shows the backlog); to drain by hand, stop it first "
            "(gpuprofctl stop)"
        )
    try:
        schema.prepare(path)
        out = asyncio.run(_drain(path, server, api_key_file, give_up_after_s, quiet, fmt))
    finally:
        lock.release()
    if fmt == "json":
        echo_json(out)
    else:
        click.echo(_text(out))
    sys.exit(EXIT_OK if out["ok"] else EXIT_FAILURE)


async def _drain(
    path: Path,
    server: str | None,
    api_key_file: Path | None,
    give_up_after_s: float,
    quiet: bool,
    fmt: str,
) -> dict[str, Any]:
    store = Store(path, DropCounter())
    await store.open()
    store.start()
    try:
        # --server, else GPUPROF_SERVER, else the server the file last forwarded to
        server = server or config.server_url(os.environ) or await outbox.remembered_server(store)
        cfg = resolve(server, api_key_file)
        if cfg is None:
            raise BadInputError(
                f"no team server known for {path}: pass --server URL (or set GPUPROF_SERVER)"
            )
        cfg.key.get()  # no key: said before anything is read
        before = await outbox.state(store)
        out: dict[str, Any] = {"db": str(path), "server": cfg.server, "sent": 0, "error": None}
        if before.events:
            forwarder = Forwarder(store, cfg)
            show = not quiet and fmt == "text"
            with click.progressbar(
                length=before.events,
                label=f"sending {before.events} events to {cfg.server}",
                file=sys.stderr if show else _Null(),
                show_pos=True,
            ) as bar:
                try:
                    out["sent"] = await forwarder.drain(bar.update, give_up_after_s)
                except Paused as exc:
                    out["error"] = str(exc)
                except Retry as exc:
                    out["error"] = f"{exc} (gave up after {give_up_after_s:g} s)"
        after = await outbox.state(store)
        out["left"] = after.events
        out["refused"] = after.dead_events - before.dead_events
        out["refused_reason"] = after.dead_reason if out["refused"] else None
        out["ok"] = after.events == 0 and out["refused"] == 0 and out["error"] is None
        return out
    finally:
        await store.close()


class _Null:
    """A progress bar's file that shows nothing (``--quiet``, ``--format json``)."""

    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _text(out: dict[str, Any]) -> str:
    lines = [f"{out['db']} -> {out['server']}: {out['sent']} events sent"]
    if out["refused"]:
        lines.append(
            f"  {out['refused']} events refused by the server (dead-lettered, not sent "
            f"again): {out['refused_reason']}"
        )
    if out["error"]:
        lines.append(f"  stopped: {out['error']}")
    if out["left"]:
        lines.append(f"  {out['left']} events left in the outbox: run gpuprofctl drain again")
    elif out["ok"]:
        lines.append("  everything was acknowledged")
    return "\n".join(lines)
