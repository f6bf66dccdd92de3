"""``/api/v1/live``: one WebSocket per page; only what is new since its cursors.

The client names a run and what it holds (``{"run": id, "cursors": {"step":
last step index, "t": last sample's unix s}}``); about once a second the
socket sends the run's steps, GPU samples and host samples newer than that,
and, every few seconds, its insights and state when they changed
(``docs/dashboard.md``). ``{"node": true}`` instead follows every running
run at once (:mod:`gpuprofd.web.node`: one ``node`` snapshot about once a
second, what ``gpuprofctl top`` shows). More than :data:`MAX_ROWS` waiting rows of one
kind is a ``reset``: the client re-fetches ``/series`` and sends new
cursors, so a message is bounded by a second's rows, never by the run's
length. Every read is a bounded, indexed query on the reader (off the event
loop on SQLite: aiosqlite's thread); the socket never touches ingest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from gpuprofd.core.errors import DatabaseError, UnknownRunError
from gpuprofd.storage import reads
from gpuprofd.storage.reads import series
from gpuprofd.web import runs as views
from gpuprofd.web.api import MAX_ID, insights_payload
from gpuprofd.web.node import NODE_FEED, NodeFeed
from gpuprofd.web.series import T_HALF_ULP_NS, RunClock, live_gpu, live_host, live_step
from gpuprofd.web.state import LIVE_SOCKET, SOCKETS, STATE, WebState

log = logging.getLogger(__name__)

#: New rows of one kind past which the client is told to ``reset``.
MAX_ROWS = 2000
#: Longest client message read, bytes (a subscribe is ~60).
MAX_CLIENT_MESSAGE = 4096
#: With ``watch_runs``: the shortest time between two looks of one socket, seconds.
MIN_GAP_S = 0.25
#: ... and between two ``node`` messages (any run's change wakes a node view).
NODE_MIN_GAP_S = 1.0


class Subscription:
    """One socket's run and cursors (see the module doc)."""

    def __init__(
        self, state: WebState, ws: web.WebSocketResponse, node_feed: NodeFeed | None = None
    ) -> None:
        self.state = state
        self.ws = ws
        self.node_feed = node_feed or NodeFeed(state)
        """The app's node view, shared by the sockets that follow it."""
        self.run: dict[str, Any] | None = None
        self.clock: RunClock | None = None
        self.gpus: list[views.RunGpu] = []
        self.step = -1
        self.gpu_ns = 0
        self.host_ns = 0
        self.node: NodeFeed | None = None
        """Set by a ``{"node": true}`` subscribe: the node view instead of a run."""
        self.paused = True
        """No run yet, or a reset sent: nothing is pushed until the next subscribe."""
        self._sent_insights: bytes | None = None
        self._sent_run: dict[str, Any] | None = None
        self._next_slow = 0.0
        self._wake = asyncio.Event()

    async def send(self, msg: dict[str, Any]) -> None:
        await self.ws.send_str(orjson.dumps(msg, option=orjson.OPT_NON_STR_KEYS).decode())

    async def on_message(self, text: str) -> None:
        """A subscribe: the run and the cursors; an error message for anything else."""
        try:
            msg = orjson.loads(text)
            if isinstance(msg, dict) and "node" in msg:
                if msg["node"] is not True:
                    raise ValueError(f"node must be true, got {msg['node']!r}")
                self.run, self.node, self.paused = None, self.node_feed, False
                self._wake.set()
                return
            run_id, step, t = _parse(msg)
        except (orjson.JSONDecodeError, ValueError) as exc:
            await self.send({"type": "error", "error": f"not a subscribe message: {exc}"})
            return
        try:
            run = await reads.get_run(self.state.reader, run_id)
        except UnknownRunError as exc:
            await self.send({"type": "error", "error": str(exc)})
            return
        self.run, self.clock, self.node = run, views.clock_of(run), None
        lo, hi = await views.window_of(self.state, run)
        self.gpus = await views.gpus_of(self.state, run, lo, hi)
        self.step = step
        start = run.get("start_mono_ns") or 0
        held = self.clock.to_mono(t) + T_HALF_ULP_NS if t > 0 else start - 1
        self.gpu_ns = self.host_ns = held
        self._sent_insights = self._sent_run = None
        self._next_slow = 0.0
        self.paused = False
        self._wake.set()

    def changed(self, run_ids: set[int] | None) -> None:
        """Runs changed (a team server's ingest): look now if this one did
        (a node view: if any did)."""
        if self.node is not None or (
            self.run is not None and (run_ids is None or self.run["id"] in run_ids)
        ):
            self._wake.set()

    async def push_loop(self) -> None:
        """Push what is new every ``live_poll_s``, and at once when the run
        changed (``watch_runs``; at most every :data:`MIN_GAP_S`), until
        cancelled (or the socket closes)."""
        while not self.ws.closed:
            self._wake.clear()
            if not self.paused:
                try:
                    if self.node is not None:
                        await self.send(await self.node.message())
                    else:
                        await self.tick()
                except DatabaseError as exc:
                    await self.send({"type": "error", "error": str(exc)})
            if self.state.watch_runs is not None:
                # a node's batches every second: one look each (a node view: one a second)
                await asyncio.sleep(NODE_MIN_GAP_S if self.node is not None else MIN_GAP_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.state.live_poll_s)

    async def tick(self) -> None:
        """One round: steps, GPU and host samples newer than the cursors; the
        run's state and insights when their time has come and they changed."""
        assert self.run is not None and self.clock is not None
        db, run_id, clock = self.state.reader, self.run["id"], self.clock
        now = time.monotonic()
        if now >= self._next_slow:
            self._next_slow = now + self.state.insights_poll_s
            await self._slow(run_id)
        steps = await series.steps_after(db, run_id, self.step, MAX_ROWS + 1)
        keys = {g.key: g.info["uuid"] for g in self.gpus}
        end = self.run.get("end_mono_ns")
        gpu = await series.gpu_samples_after(db, list(keys), self.gpu_ns, MAX_ROWS + 1, end)
        boot = self.run.get("boot_id")
        host = await series.host_samples_after(db, run_id, boot, self.host_ns, MAX_ROWS + 1, end)
        if max(len(steps), len(gpu), len(host)) > MAX_ROWS:
            self.paused = True
            await self.send({"type": "reset"})
            return
        if steps:
            self.step = steps[-1]["step"]
            await self.send({"type": "steps", "rows": [live_step(r, clock) for r in steps]})
        if gpu:
            self.gpu_ns = gpu[-1]["mono_ns"]
            samples = [live_gpu(r, clock, keys.get(r["uuid"], r["uuid"])) for r in gpu]
            await self.send({"type": "gpus", "samples": samples})
        if host:
            self.host_ns = host[-1]["mono_ns"]
            await self.send({"type": "host", "samples": [live_host(r, clock) for r in host]})

    async def _slow(self, run_id: int) -> None:
        if not self.gpus and self.run is not None:  # a run just started: its GPUs' first rows
            lo, hi = await views.window_of(self.state, self.run)
            self.gpus = await views.gpus_of(self.state, self.run, lo, hi)
        state = await views.live_view(self.state, run_id)
        if state != self._sent_run:
            self._sent_run = state
            await self.send({"type": "run", "run": state})
            if state["status"] != "running" and self.run is not None:  # ended: bound the reads
                self.run = await reads.get_run(self.state.reader, run_id)
        found = await insights_payload(self.state.reader, run_id, self.state.live_summary(run_id))
        key = orjson.dumps(found["insights"], option=orjson.OPT_NON_STR_KEYS)
        if key != self._sent_insights:
            self._sent_insights = key
            await self.send(
                {
                    "type": "insights",
                    "insights": found["insights"],
                    "gains": found["gains"],
                    "computed_s": found["computed_s"],
                }
            )


def _parse(msg: Any) -> tuple[int, int, float]:
    """(run id, step cursor, time cursor s) of a subscribe message.

    Raises:
        ValueError: anything else (said to the client).
    """
    if not isinstance(msg, dict):
        raise ValueError('give {"run": ID, "cursors": {"step": N, "t": S}} or {"node": true}')
    run_id = msg.get("run")
    if type(run_id) is not int or not 1 <= run_id <= MAX_ID:
        raise ValueError(f"run must be a positive integer, got {run_id!r}")
    cursors = msg.get("cursors") or {}
    if not isinstance(cursors, dict):
        raise ValueError("cursors must be an object")
    step, t = cursors.get("step", -1), cursors.get("t", 0)
    if type(step) is not int or not -1 <= step < 2**62:
        raise ValueError(f"cursors.step must be an integer >= -1, got {step!r}")
    if type(t) not in (int, float) or not 0 <= t < 2**40:
        raise ValueError(f"cursors.t must be unix seconds (or 0), got {t!r}")
    return run_id, step, float(t)


async def handler(request: web.Request) -> web.WebSocketResponse:
    """The live socket: reads subscribes, pushes (see the module doc)."""
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_CLIENT_MESSAGE)
    await ws.prepare(request)
    request.app[SOCKETS].add(ws)
    request[LIVE_SOCKET] = ws
    state = request.app[STATE]
    sub = Subscription(state, ws, request.app.get(NODE_FEED))
    unwatch = state.watch_runs(sub.changed) if state.watch_runs is not None else None
    pusher = asyncio.create_task(sub.push_loop(), name="live-push")
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await sub.on_message(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await sub.send({"type": "error", "error": "send JSON text frames"})
    except (ConnectionResetError, DatabaseError) as exc:
        log.debug("live socket ended: %s", exc)
    finally:
        if unwatch is not None:
            unwatch()
        pusher.cancel()
        await asyncio.gather(pusher, return_exceptions=True)
    return ws
