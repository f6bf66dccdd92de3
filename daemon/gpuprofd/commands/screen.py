"""Drawing a live view in the terminal: the I/O around the pure frames of
:mod:`gpuprofd.commands.topframe` and :mod:`gpuprofd.commands.watchframe`.

A view (:class:`View`: ``top``'s, ``watch``'s) holds what the feed said and
answers the keys; :func:`drive` runs one over a
:class:`~gpuprofd.commands.liveclient.FeedClient` in one of three ways:

- ``tty``: the full screen (``rich.live.Live`` on the alternate screen),
  redrawn when the feed says something new (at most :data:`MAX_FPS` a
  second) and every *interval*, keys read from the terminal in cbreak mode;
- ``plain`` (stdout is not a terminal): what the view prints as text every
  *interval* (a frame, or a log line), no escape codes;
- ``once``: one frame as soon as the view has one, then exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.text import Text

from gpuprofd.commands.liveclient import FeedClient

#: Redraws a second at most (the feed sends about one message a second per kind).
MAX_FPS = 8
#: ``--once`` waits at most this long for a full frame, then prints what it has, s.
ONCE_WAIT_S = 15.0
#: What a key handler answers to end the view.
QUIT = "quit"


class View(Protocol):
    """A live view over the feed (see the module doc)."""

    connection: str
    """The socket's state: ``connecting``, ``open``, ``reconnecting (why)``."""

    def subscribe(self) -> dict[str, Any]:
        """The subscribe message to send (on open, and on every reconnect)."""

    async def on_message(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Take one feed message; answer a new subscribe to send, or None."""

    async def on_key(self, key: str) -> dict[str, Any] | str | None:
        """Take a key; answer :data:`QUIT`, a subscribe to switch to, or None."""

    def frame(self, width: int, height: int, plain: bool) -> Text:
        """The frame now."""

    def ready(self) -> bool:
        """Enough has come for a frame worth printing (``--once``)."""

    def finished(self) -> bool:
        """The view has ended by itself (a watched run ended)."""

    def plain_output(self, now: float) -> str | None:
        """What to print now when stdout is not a terminal (None: nothing)."""

    async def after(self) -> str | None:
        """What to print once the view ends (a run's summary), or None."""


def decode_keys(data: bytes) -> list[str]:
    """Keys in what the terminal sent: ``up``, ``down``, ``left``, ``right``,
    ``enter``, ``esc``, or the character itself."""
    arrows = {b"A": "up", b"B": "down", b"C": "right", b"D": "left"}
    out, i = [], 0
    while i < len(data):
        b = data[i : i + 1]
        if b == b"\x1b" and data[i + 1 : i + 2] in (b"[", b"O") and i + 2 < len(data):
            out.append(arrows.get(data[i + 2 : i + 3], "esc"))
            i += 3
        elif b == b"\x1b":
            out.append("esc")
            i += 1
        elif b in (b"\r", b"\n"):
            out.append("enter")
            i += 1
        else:
            out.append(b.decode("latin-1"))
            i += 1
    return out


@contextlib.contextmanager
def key_reader(on_key: Callable[[str], None]) -> Iterator[bool]:
    """Hand each key typed on stdin to *on_key* (cbreak mode: no echo, no
    line buffering; Ctrl-C still interrupts), the terminal restored after.
    Yields False, reading nothing, when stdin is not a terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield False
        return
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b""
        if not data:  # the terminal went away: stop reading (q can no longer come)
            loop.remove_reader(fd)
            return
        for k in decode_keys(data):
            on_key(k)

    tty.setcbreak(fd)
    loop.add_reader(fd, readable)
    try:
        yield True
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def frame_size(console: Console) -> tuple[int, int]:
    """The frame's size: the terminal's, or as text ``COLUMNS`` × ``LINES``
    (80 × 24 unless set)."""
    if console.is_terminal:
        return console.size.width, console.size.height
    try:
        lines = int(os.environ.get("LINES", "24"))
    except ValueError:
        lines = 24
    return console.width, max(lines, 10)


async def drive(
    client: FeedClient, view: View, mode: str, interval_s: float, console: Console
) -> None:
    """Run *view* over *client*'s feed in *mode* (``tty``, ``plain`` or
    ``once``) until it is quit or ends, then print its :meth:`View.after`.

    Raises:
        GpuprofdError: the feed refused us (a login needed, or ended).
    """
    changed = asyncio.Event()
    switch: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def on_message(msg: dict[str, Any]) -> dict[str, Any] | None:
        again = await view.on_message(msg)
        changed.set()
        return again

    def on_state(state: str) -> None:
        view.connection = state
        changed.set()

    pump = asyncio.create_task(client.follow(view.subscribe, on_message, on_state, switch))
    try:
        if mode == "once":
            await _once(view, pump, changed, console)
        elif mode == "plain":
            await _plain(view, pump, changed, interval_s, console)
        else:
            await _tty(view, pump, changed, switch, interval_s, console)
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
    text = await view.after()
    if text:
        console.print(Text(text), soft_wrap=True)


async def _wait(pump: asyncio.Task[Any], *aws: Any, timeout: float | None) -> set[Any]:
    """Wait for the first of *aws* (awaitables) or the pump's end; re-raise
    the pump's error. Returns the finished tasks among *aws*'s."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait([pump, *tasks], timeout=timeout, return_when="FIRST_COMPLETED")
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
    if pump in done:
        pump.result()  # raises the feed's error; a pump never ends otherwise
    return {t for t in tasks if t in done}


async def _once(
    view: View, pump: asyncio.Task[Any], changed: asyncio.Event, console: Console
) -> None:
    deadline = time.monotonic() + ONCE_WAIT_S
    while not (view.ready() or view.finished()) and time.monotonic() < deadline:
        changed.clear()
        await _wait(pump, changed.wait(), timeout=max(deadline - time.monotonic(), 0.01))
    if not view.finished():
        width, height = frame_size(console)
        console.print(view.frame(width, height, plain=not console.is_terminal), crop=True)


async def _plain(
    view: View,
    pump: asyncio.Task[Any],
    changed: asyncio.Event,
    interval_s: float,
    console: Console,
) -> None:
    while not view.finished():
        text = view.plain_output(time.monotonic())
        if text:
            console.print(Text(text), soft_wrap=True)
        changed.clear()
        await _wait(pump, changed.wait(), timeout=min(interval_s, 1.0))


async def _tty(
    view: View,
    pump: asyncio.Task[Any],
    changed: asyncio.Event,
    switch: asyncio.Queue[dict[str, Any]],
    interval_s: float,
    console: Console,
) -> None:
    keys: list[str] = []

    def typed(key: str) -> None:
        keys.append(key)
        changed.set()

    live = Live(
        console=console,
        screen=True,
        auto_refresh=False,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    with key_reader(typed), live:
        while True:
            width, height = frame_size(console)
            live.update(view.frame(width, height, plain=False), refresh=True)
            if not keys:
                changed.clear()
                await _wait(pump, changed.wait(), timeout=interval_s)
            quit_now = False
            while keys:
                answer = await view.on_key(keys.pop(0))
                if answer == QUIT:
                    quit_now = True
                elif isinstance(answer, dict):
                    switch.put_nowait(answer)
            if quit_now or view.finished():
                return
            if not keys:
                await asyncio.sleep(1 / MAX_FPS)
