"""``gpuprofctl top [DB]``: every live run of a gpuprofd (or a team server)
in the terminal, refreshed about once a second, with the GPUs and the host's
CPU; pick one to watch it."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from rich.text import Text

from gpuprofd.commands.feedopts import feed_options, resolve_feed, show
from gpuprofd.commands.liveclient import FeedClient
from gpuprofd.commands.livestate import NodeState
from gpuprofd.commands.screen import QUIT
from gpuprofd.commands.topframe import (
    SORTS,
    TopChoices,
    move_pick,
    picked_run,
    sorted_runs,
    top_frame,
)
from gpuprofd.commands.watch import BACK_KEYS, RUN_KINDS, WatchView

#: The node view's subscribe message.
NODE = {"node": True}


class TopView:
    """The node view (:class:`gpuprofd.commands.screen.View`); Enter opens
    a :class:`~gpuprofd.commands.watch.WatchView` of the picked run on the
    same socket, ``b`` comes back."""

    def __init__(
        self, client: FeedClient, choices: TopChoices, where: str, every_s: float = 10.0
    ) -> None:
        self.client = client
        self.choices = choices
        self.where = where
        self.every_s = every_s
        self.node = NodeState()
        self.watch: WatchView | None = None
        self.connection = "connecting"
        self._next_print = 0.0

    def subscribe(self) -> dict[str, Any]:
        return self.watch.subscribe() if self.watch is not None else dict(NODE)

    async def on_message(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        kind = msg.get("type")
        if kind == "node" or (kind == "error" and self.watch is None):
            self.node.apply(msg)
        elif self.watch is not None and kind in RUN_KINDS:
            return await self.watch.on_message(msg)
        return None

    def runs(self) -> list[Any]:
        return sorted_runs((self.node.node or {}).get("runs") or [], self.choices)

    async def on_key(self, key: str) -> dict[str, Any] | str | None:
        if key == "q":
            return QUIT
        if self.watch is not None:
            if key in BACK_KEYS:
                self.watch = None
                return dict(NODE)
            return None
        runs = self.runs()
        if key == "s":
            self.choices.next_sort()
        elif key == "r":
            self.choices.descending = not self.choices.descending
        elif key in ("down", "j"):
            move_pick(runs, self.choices, 1)
        elif key in ("up", "k"):
            move_pick(runs, self.choices, -1)
        elif key in ("enter", "right"):
            run = picked_run(runs, self.choices)
            if run is not None:
                self.choices.picked = run.get("id")
                watch = WatchView(self.client, int(run["id"]), embedded=True)
                await watch.start()
                self.watch = watch
                return watch.subscribe()
        return None

    def frame(self, width: int, height: int, plain: bool) -> Text:
        if self.watch is not None:
            return self.watch.frame(width, height, plain)
        error = self.node.error
        if self.connection.startswith("reconnecting"):  # the daemon restarting, the network
            error = self.connection
        return top_frame(
            self.node.node,
            self.choices,
            width,
            height,
            where=self.where,
            error=error,
            keys=not plain,
        )

    def ready(self) -> bool:
        return self.node.node is not None

    def finished(self) -> bool:
        return False

    def plain_output(self, now: float) -> str | None:
        """The frame as text, every ``every_s`` (a blank line between two)."""
        if self.node.node is None or now < self._next_print:
            return None
        self._next_print = now + self.every_s
        return self.frame(80, 24, plain=True).plain + "\n"

    async def after(self) -> str | None:
        return None


TOP_HELP = """Every live run of this database's gpuprofd, refreshed about once a
second: name, user, rank, steps, steps/s, iteration time (mean and median of
the last steps), the phase split, MFU, dropped events and each run's top
finding with its gain; below, each GPU (utilization, memory, power, clock,
the run using it) and the host's CPU (the runs' and the others').

\b
Example:
  gpuprofctl top

It reads the live feed of the gpuprofd of DB (GPUPROF_DB or ./gpuprof.db;
or --socket-dir), or with --server URL a team server's (every node's runs).

Keys: s sort (run id, name, steps/s, iteration, loader wait, CPU), r
reverse, up/down (or j/k) pick a run, Enter watch it (b back), q quit.
Not in a terminal: a frame every --interval as plain text. --once prints
one frame. docs/terminal.md explains each column.
"""


@click.command("top", help=TOP_HELP, short_help="Every live run, refreshed: steps, phases, GPUs.")
@click.argument("db", type=click.Path(path_type=Path), required=False)
@feed_options
@click.option(
    "--sort",
    type=click.Choice(list(SORTS)),
    default="id",
    show_default=True,
    help="Sort the runs by this (descending; r in the view reverses it).",
)
def top_cmd(
    db: Path | None,
    socket_dir: Path | None,
    server: str | None,
    api_key_file: Path | None,
    viewer_password_file: Path | None,
    once: bool,
    interval_s: float | None,
    timeout_s: float,
    sort: str,
) -> int:
    target = resolve_feed(db, socket_dir, server, api_key_file, viewer_password_file, timeout_s)
    parts = urlsplit(target.url)
    where = server and target.url or (parts.netloc or target.url)

    async def make(client: FeedClient) -> TopView:
        return TopView(client, TopChoices(sort=sort), where, every_s=interval_s or 10.0)

    return show(target, make, once, interval_s)
