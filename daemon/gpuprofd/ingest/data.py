"""Ingest: the data socket (``PULL``) → validated events → the store.

Every frame goes through :func:`gpuprof.protocol.decode_events` (a ``batch``
of one run's events is expanded into the same per-event handling as single
events); anything invalid is counted by its reason and dropped (one bad
event of a batch drops that event alone) (a step's ``comm`` bucket rows included:
one bad row drops the step). A step is queued with its bucket rows as one
atomic op; a ``clock`` event sets the run's clock offset. Nothing here waits on the database for a
known run: steps are queued with ``submit_nowait`` and a ``kernels`` window
with its rows with ``submit_all_nowait`` (all or none; dropped and counted when
the store is behind), so a slow disk can never stall the training processes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import zmq.asyncio

from gpuprof.protocol import ProtocolError, decode_frame
from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.registry import LiveRun
from gpuprofd.ingest.runservice import RunService
from gpuprofd.storage.writes import BATCH_MAX_OPS, Store, runsdb

log = logging.getLogger(__name__)

#: Ingest reads no further while this many ops wait for the writer: two full
#: batches keep it busy, and a commit is never more than that behind.
INGEST_BACKLOG_OPS = 2 * BATCH_MAX_OPS


class Ingest:
    """Reads the ``PULL`` socket until cancelled."""

    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        runs: RunService,
        store: Store,
        drops: DropCounter,
        on_activity: Callable[[], None] = lambda: None,
        on_workers: Callable[[int, Mapping[str, Any]], None] = lambda run_id, msg: None,
    ) -> None:
        self.sock = sock
        self.runs = runs
        self.store = store
        self.drops = drops
        self.on_activity = on_activity
        self.on_workers = on_workers
        """Gets (run id, ``workers`` message) of runs whose pids are ours to read."""
        self.received = 0
        """Valid events accepted for a known run, since start."""

    async def run(self) -> None:
        while True:
            frame = await self.sock.recv()
            self.on_activity()
            try:
                await self.handle(frame)
            except Exception as exc:  # noqa: BLE001 - no message may stop ingest
                log.exception("ingest failed on a message")
                self.drops.add("internal_error", repr(exc)[:100])
            # recv() on a socket with frames waiting returns without yielding:
            # under a burst the store's writer task would never run and its
            # queue would overflow. Let the other tasks in after each message.
            await asyncio.sleep(0)

    async def handle(self, frame: bytes) -> None:
        """Validate one frame (an event or a batch of them) and route each
        event; count each dropped one under its reason."""
        try:
            events, bad, envelope = decode_frame(frame)
        except ProtocolError as exc:
            self.drops.add(exc.reason, str(exc)[:120])
            return
        for err in bad:
            self.drops.add(err.reason, str(err)[:120])
        live = None
        if envelope is not None and "seq" in envelope:
            live = await self._numbered_run(envelope, len(events) + len(bad))
            if live is None:
                return
        # A writer behind: wait for it (the socket buffers what comes meanwhile)
        # rather than drop what was already received, and leave it the loop.
        await self.store.wait_for_room(len(events), backlog=INGEST_BACKLOG_OPS)
        for msg in events:
            await self.handle_event(msg)
        if live is not None:  # after its events: commits with them or later
            live.seq = envelope["seq"]  # type: ignore[index]
            if not self.store.submit_nowait(runsdb.seq_op(live.run_id, live.seq, live.received)):
                live.store_dropped += 1

    async def _numbered_run(self, envelope: Mapping[str, Any], events: int) -> LiveRun | None:
        """The run of a numbered message (``seq``) if it is to be stored now:
        each message once and in the shim's order. A message already stored
        (a resend after a crash) is dropped as ``duplicate``; one that would
        skip messages still to come, or one for a run that has not said hello
        to this daemon, is left to the shim's resend (``resend_expected``)."""
        key = envelope["run_key"]
        live = self.runs.registry.get(key) or await self.runs.resolve(key)
        if live is None:
            self.drops.add(self.runs.registry.unknown_reason(key) or "unknown_run", key)
            return None
        seq = envelope["seq"]
        if seq <= live.seq:
            self.drops.add("duplicate", f"run {live.run_id} message {seq} ({events} events)")
            return None
        if not live.helloed or seq > max(live.seq, envelope.get("lost", 0)) + 1:
            self.drops.add("resend_expected", f"run {live.run_id} message {seq}")
            return None
        return live

    def _late_loader_stacks(self, key: str, msg: dict[str, Any]) -> bool:
        """Store a DataLoader worker's last stack counts that came after its
        run ended (a worker sends them as it exits, which can be after the
        loop's end: :data:`~gpuprofd.ingest.registry.LATE_LOADER_STACKS_S`);
        True when stored. The run's findings are not made again for them."""
        if msg["type"] != "stacks" or msg.get("source") != "loader":
            return False
        run_id = self.runs.registry.ended_run_id(key)
        if run_id is None:
            return False
        self.store.submit_all_nowait(runsdb.stacks_ops(run_id, msg))  # counts a full queue
        return True

    async def handle_event(self, msg: dict[str, Any]) -> None:
        """Route one valid event to its run and the store."""
        key = msg["run_key"]
        live = self.runs.registry.get(key) or await self.runs.resolve(key)
        if live is None:
            if not self._late_loader_stacks(key, msg):
                self.drops.add(self.runs.registry.unknown_reason(key) or "unknown_run", key)
            return
        live.note_event(msg)
        self.received += 1
        if msg["type"] == "step" and not self.store.submit_nowait(runsdb.step_op(live.run_id, msg)):
            live.store_dropped += 1
        elif msg["type"] == "kernels":
            if not self.store.submit_all_nowait(runsdb.kernels_ops(live.run_id, msg)):
                live.store_dropped += 1
        elif msg["type"] == "clock":
            if not self.store.submit_nowait(runsdb.clock_op(live.run_id, msg)):
                live.store_dropped += 1
        elif msg["type"] == "model_info":
            ops = runsdb.model_info_ops(live.run_id, msg, self.store.dialect)
            if not self.store.submit_all_nowait(ops):
                live.store_dropped += 1
        elif msg["type"] == "stacks":
            if not self.store.submit_all_nowait(runsdb.stacks_ops(live.run_id, msg)):
                live.store_dropped += 1
        elif msg["type"] == "loaders":
            if not self.store.submit_nowait(
                runsdb.loaders_op(live.run_id, msg, self.store.dialect)
            ):
                live.store_dropped += 1
        elif msg["type"] == "workers":
            if live.local_pid:
                self.on_workers(live.run_id, msg)
            else:  # pids of another PID namespace (a container) name other processes here
                log.debug("run %d: workers in another PID namespace, not sampled", live.run_id)
