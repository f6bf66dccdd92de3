"""Control: the ``ROUTER`` socket. Each request is decoded, handled in its own
task (a ``bye`` may wait for late events without holding up a ``ping``), and
answered with one orjson object. Any failure becomes ``{"ok": false, ...}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import zmq
import zmq.asyncio

from gpuprof.protocol import ProtocolError, decode
from gpuprofd.core.counters import DropCounter
from gpuprofd.core.errors import GpuprofdError

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ControlServer:
    """Serves control requests until cancelled; :meth:`drain` waits for in-flight ones."""

    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        handlers: Mapping[str, Handler],
        drops: DropCounter,
        on_activity: Callable[[], None] = lambda: None,
    ) -> None:
        self.sock = sock
        self.handlers = handlers
        self.drops = drops
        self.on_activity = on_activity
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        while True:
            frames = await self.sock.recv_multipart()
            self.on_activity()
            task = asyncio.create_task(self._serve(frames))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float) -> None:
        """Wait up to *timeout_s* for requests being handled, then cancel the rest."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _serve(self, frames: list[bytes]) -> None:
        if len(frames) < 2:  # ROUTER always prefixes the peer identity
            self.drops.add("control:bad_envelope")
            return
        envelope, payload = frames[:-1], frames[-1]
        reply = await self.reply_for(payload)
        try:
            await self.sock.send_multipart([*envelope, orjson.dumps(reply, default=str)])
        except zmq.ZMQError as exc:
            log.debug("control reply not sent: %s", exc)

    async def reply_for(self, payload: bytes) -> dict[str, Any]:
        """The reply object for one request payload (never raises)."""
        try:
            msg = decode(payload, channel="control")
        except ProtocolError as exc:
            self.drops.add(f"control:{exc.reason}", str(exc)[:120])
            return {"ok": False, "error": f"bad message: {exc}"}
        try:
            return await self.handlers[msg["type"]](msg)
        except GpuprofdError as exc:
            self.drops.add("control:rejected", str(exc))
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a handler bug must not kill the loop
            log.exception("control handler %s failed", msg["type"])
            self.drops.add("control:handler_error", repr(exc)[:100])
            return {"ok": False, "error": f"internal error: {exc.__class__.__name__}: {exc}"}
