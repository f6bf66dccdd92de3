"""The dashboard app's state: :class:`WebState` (what it serves from beyond
the database) and the typed keys it is kept under. Below every module of
``gpuprofd.web`` (the app, the API, live sockets, the login), which all read it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuprofd.sampling.nvml import GpuDevice
from gpuprofd.storage.reader import Reader


@dataclass(frozen=True)
class WebState:
    """What the app needs beyond the database.

    Args:
        reader: every read goes through it (the daemon's store, a pool).
        devices: this node's GPUs (index, name) to label series; empty on a
            server, where the stored rows are all there is.
        live_run_ids: the ids of the runs being tracked now (their ``live``).
        boot_id: this node's boot; with *now_mono_ns*, where a running run's
            window ends (a server has neither: a running run ends at its last step).
        now_mono_ns: this node's monotonic clock, ns.
        live_poll_s: how often a live socket looks for new rows, seconds.
        insights_poll_s: how often it looks for new insights and run state, seconds.
        watch_runs: where runs that changed are told (a team server: every
            replica's ingest, through Postgres ``NOTIFY``): a live socket then
            looks as soon as its run changes, and every *live_poll_s* only as a
            safety net. ``watch_runs(watcher)`` returns the function that stops
            it; the watcher gets the ids that changed, or None (anything may have).
        live_summary: a running run's summary as of the daemon's latest live
            insights pass (None: none yet), so that ``/runs/{id}`` need not
            build it again from the whole run; a server has none.
    """

    reader: Reader
    devices: Sequence[GpuDevice] = ()
    live_run_ids: Callable[[], set[int]] = field(default=lambda: set())
    boot_id: str | None = None
    now_mono_ns: Callable[[], int] | None = time.monotonic_ns
    live_poll_s: float = 1.0
    insights_poll_s: float = 3.0
    watch_runs: Callable[[Callable[[set[int] | None], None]], Callable[[], None]] | None = None
    live_summary: Callable[[int], dict[str, Any] | None] = field(default=lambda _: None)


STATE = web.AppKey("state", WebState)
SOCKETS = web.AppKey("sockets", weakref.WeakSet)
#: A live socket's request holds its socket here (a login's end closes it: gpuprofd.web.auth).
LIVE_SOCKET = web.RequestKey("live_socket", web.WebSocketResponse)
