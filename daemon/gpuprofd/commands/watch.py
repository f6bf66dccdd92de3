"""``gpuprofctl watch [DB] [RUN_ID]``: one run live in the terminal (its
iteration time and phases, its findings as they come), then its summary."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from gpuprof.window import PHASES, window_figures
from gpuprofd.commands.common import run_id_type
from gpuprofd.commands.feedopts import feed_options, resolve_feed, show
from gpuprofd.commands.insights import split_args
from gpuprofd.commands.liveclient import FeedClient
from gpuprofd.commands.livestate import RunState
from gpuprofd.commands.screen import QUIT
from gpuprofd.commands.termtext import (
    PHASE_LETTER,
    gain_text,
    ms_text,
    num,
    rate_text,
    safe,
)
from gpuprofd.commands.watchframe import WINDOW_STEPS, summary_text, watch_frame
from gpuprofd.core.errors import BadInputError

#: Steps a watch asks the feed for when it starts (the run's recent past; the
#: feed answers ``reset`` past 2,000 rows of one kind at once).
RECENT_STEPS = 1500
#: ... and after a ``reset`` (the feed ran ahead of us).
AFTER_RESET_STEPS = 100
#: Seconds of GPU and host samples before now a watch starts from.
RECENT_SAMPLES_S = 5.0
#: The feed's message kinds of a run (what a watch takes).
RUN_KINDS = frozenset({"steps", "gpus", "host", "insights", "run", "reset", "error"})
#: Keys that leave a watch opened from ``top``.
BACK_KEYS = frozenset({"b", "esc", "left"})


class WatchView:
    """One run's live view (:class:`gpuprofd.commands.screen.View`).

    *embedded*: opened from ``top`` (``b`` goes back; it does not end with the run).
    """

    def __init__(
        self, client: FeedClient, run_id: int, *, embedded: bool = False, every_s: float = 10.0
    ) -> None:
        self.client = client
        self.state = RunState(run_id)
        self.embedded = embedded
        self.every_s = every_s
        self.connection = "connecting"
        self._kinds: set[str] = set()
        self._said: set[tuple[Any, Any]] = set()
        self._started = False
        self._next_progress = 0.0

    async def start(self) -> None:
        """Read the run's headline (and its summary, if it ended) and start
        the cursors at its recent past.

        Raises:
            UnknownRunError: no such run.
        """
        data = await self.client.get(f"/runs/{self.state.run_id}")
        self.state.headline = data.get("run") or {}
        if self.state.headline.get("status") not in (None, "running"):
            self.state.state = {
                k: self.state.headline.get(k) for k in ("id", "name", "status", "steps")
            }
            self.state.summary = data.get("summary")
        await self._start_point(RECENT_STEPS)

    async def _start_point(self, recent: int) -> None:
        run_id = self.state.run_id
        steps = self.state.state.get("steps", self.state.headline.get("steps")) or 0
        window = (await self.client.get(f"/runs/{run_id}/series", parts="host", width=10))["window"]
        self.state.start_at(step=steps - 1 - recent, t=float(window["to"]) - RECENT_SAMPLES_S)

    def subscribe(self) -> dict[str, Any]:
        return {"run": self.state.run_id, "cursors": self.state.cursors()}

    async def on_message(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        kind = msg.get("type")
        if kind not in RUN_KINDS:
            return None
        self._kinds.add(str(kind))
        self.state.apply(msg)
        if kind == "run" and self.state.ended and self.state.summary is None:
            data = await self.client.get(f"/runs/{self.state.run_id}")
            self.state.headline = data.get("run") or self.state.headline
            self.state.summary = data.get("summary") or {}
        if self.state.reset:
            await self._start_point(AFTER_RESET_STEPS)
            return self.subscribe()
        return None

    async def on_key(self, key: str) -> dict[str, Any] | str | None:
        if key == "q":
            return QUIT
        return None

    def frame(self, width: int, height: int, plain: bool) -> Text:
        keys = "b back  q quit" if self.embedded else "q quit"
        notice = None if self.connection in ("open", "connecting") else self.connection
        return watch_frame(self.state, width, height, plain=plain, keys=keys, notice=notice)

    def ready(self) -> bool:
        got = {"run", "insights"} <= self._kinds
        steps = "steps" in self._kinds or not self.state.state.get("steps")
        return got and steps

    def finished(self) -> bool:
        return not self.embedded and self.state.ended and self.state.summary is not None

    def plain_output(self, now: float) -> str | None:
        """Log lines: the run once, each finding when it first shows, and a
        progress line every ``every_s``."""
        lines = []
        st = self.state
        if not self._started and st.state:
            self._started = True
            name = safe(st.state.get("name") or st.headline.get("name"))
            lines.append(f"watching run {st.run_id} {name} ({safe(st.state.get('status'))})")
        for ins in st.insights:
            key = (ins.get("rule"), ins.get("title"))
            if key not in self._said:
                self._said.add(key)
                gain = gain_text(ins)
                lines.append(
                    f"[{safe(ins.get('severity'))}] {safe(ins.get('title'))}"
                    + (f" ({gain})" if gain else "")
                )
        if st.steps and now >= self._next_progress:
            self._next_progress = now + self.every_s
            lines.append(progress_line(st))
        return "\n".join(lines) or None

    async def after(self) -> str | None:
        if self.embedded or not self.state.summary:
            return None
        return summary_text(self.state.summary)


def progress_line(state: RunState) -> str:
    """``step 1519 · 1520 steps · 12.1 steps/s · 82.4 ms mean, 52.1 ms median ·
    W 62% F 10% ...`` over the last :data:`WINDOW_STEPS` steps."""
    figs = window_figures(state.window(WINDOW_STEPS), unit_s=1e-3)
    shares = " ".join(
        f"{PHASE_LETTER[p]} {num(figs['pct'][p], '{:.0f}')}%"
        for p in PHASES
        if figs["pct"][p] is not None
    )
    count = state.step_count() if state.state else None
    return (
        f"{time.strftime('%H:%M:%S')} step {state.steps[-1].step}"
        + (f" · {count} steps" if count is not None else "")
        + f" · {rate_text(figs['steps_per_s'])} steps/s · {ms_text(figs['mean'])} ms mean, "
        f"{ms_text(figs['median'])} ms median · {shares}"
    )


async def latest_live_run(client: FeedClient) -> int:
    """The newest running run's id.

    Raises:
        BadInputError: none is running.
    """
    rows = (await client.get("/runs", status="running", limit=1)).get("runs") or []
    if not rows:
        raise BadInputError(
            f"no live run on {client.base_url}: give a RUN_ID (gpuprofctl runs lists them)"
        )
    return int(rows[0]["id"])


WATCH_HELP = """Watch one run live (default: the latest live run): its iteration
time and phases as a scrolling chart, eval and traced steps marked, its GPU
and CPU, its findings as gpuprofd finds them; when it ends, its summary
(exit 0).

\b
Example:
  gpuprofctl watch 3

It reads the live feed of this database's gpuprofd (DB, GPUPROF_DB or
./gpuprof.db; or --socket-dir), or with --server URL a team server's. A
lone all-digits argument that is not an existing file is RUN_ID.

In a terminal: the full screen, q quits. Not in one: a line per finding as
it comes and a progress line every --interval, then the summary. --once
prints one frame. docs/terminal.md shows a frame.
"""


@click.command("watch", help=WATCH_HELP, short_help="One run live, then its summary.")
@click.argument("db", type=click.Path(path_type=Path), required=False)
@click.argument("run_id", type=run_id_type, required=False)
@feed_options
def watch_cmd(
    db: Path | None,
    run_id: int | None,
    socket_dir: Path | None,
    server: str | None,
    api_key_file: Path | None,
    viewer_password_file: Path | None,
    once: bool,
    interval_s: float | None,
    timeout_s: float,
) -> int:
    db, run_id = split_args(db, run_id)
    target = resolve_feed(db, socket_dir, server, api_key_file, viewer_password_file, timeout_s)

    async def make(client: FeedClient) -> WatchView:
        every = interval_s or 10.0
        view = WatchView(client, run_id or await latest_live_run(client), every_s=every)
        await view.start()
        return view

    return show(target, make, once, interval_s)
