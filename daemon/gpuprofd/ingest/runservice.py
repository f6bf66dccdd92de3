"""Run lifecycle: start (hello), re-adoption, end (bye), loss (process died).

A run is ``running`` from its hello until its bye (``finished`` or
``failed``) or until its process is seen gone without one (``lost``). A
daemon that restarts while runs continue re-adopts them: at startup (rows
left ``running`` whose pid lives) or on their first event.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from gpuprof.protocol import MAX_ERROR_CHARS, clean_run_name, clean_text
from gpuprofd.core.errors import GpuprofdError
from gpuprofd.ingest.procs import pid_alive as _pid_alive
from gpuprofd.ingest.procs import pid_namespace
from gpuprofd.ingest.registry import LiveRun, RunRegistry
from gpuprofd.sampling.nvml import GpuDevice, match_uuid
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import reads
from gpuprofd.storage.writes import Op, Store, runsdb

log = logging.getLogger(__name__)

#: Longest a bye waits for events still in flight before it answers, seconds
#: (under the shim's 5 s bye timeout).
BYE_WAIT_S = 4.0
#: After a bye has answered, events still in the socket's buffer (a writer
#: catching up after a burst) go on being stored while they keep arriving:
#: until all the run sent is in, or none came for this long (seconds).
TAIL_IDLE_S = 5.0
#: A run whose pid is in another PID namespace (training in a container, the
#: daemon on the host) cannot be checked by pid; it is lost after this long
#: without an event (s). Long enough for an evaluation pass between steps;
#: a lost run that speaks again is re-adopted.
FOREIGN_SILENCE_S = 600.0
LOST_NOTE = "the training process exited without ending the run: marked lost"

PidAlive = Callable[[int | None, int | None], bool]


class UnknownRun(GpuprofdError):
    """A control message names a run this daemon does not know."""


class RunService:
    """Owns the transitions of runs between the registry and the database."""

    def __init__(
        self,
        store: Store,
        registry: RunRegistry,
        insights: InsightsRunner,
        gpu_devices: list[GpuDevice],
        pid_alive: PidAlive = _pid_alive,
        cpu_count: int | None = None,
        mono_clock: Callable[[], int] = time.monotonic_ns,
        wall_clock: Callable[[], int] = time.time_ns,
        boot_id: str | None = None,
        owner: str | None = None,
        default_gpu: GpuDevice | None = None,
    ) -> None:
        self.store = store
        self.default_gpu = default_gpu
        """The GPU a run that names no CUDA device is taken to use: the
        replayed one under ``GPUPROF_NVML=replay:PATH`` (a CPU run stands in
        for training on it); None on real and mock GPUs."""
        self.owner = owner
        """This daemon as stored with its runs (``host:socket dir``): on a
        database several daemons share, each recovers only its own runs."""
        self.boot_id = boot_id
        """The node's boot (:mod:`gpuprofd.core.boot`), recorded on each new run."""
        self.registry = registry
        self.insights = insights
        self.gpu_devices = gpu_devices
        self.pid_alive = pid_alive
        self.cpu_count = cpu_count if cpu_count is not None else os.cpu_count()
        self._mono = mono_clock
        self._wall = wall_clock
        self._lock = asyncio.Lock()
        self._tails: set[asyncio.Task[None]] = set()
        """Ended runs whose late events are still being stored (:meth:`_tail`)."""
        self._unstored_ends: dict[int, tuple[LiveRun, dict[str, Any]]] = {}
        """Runs whose bye failed to store their end (a full disk), by run id,
        with the bye: :meth:`retry_ends` stores it once the store takes writes
        (else the row would say ``running`` until the daemon restarts)."""
        self.pid_ns = pid_namespace()

    @property
    def lock(self) -> asyncio.Lock:
        """Held while a run is created or re-adopted (its row written and it
        registered): the database switch takes it so no new run falls between."""
        return self._lock

    def _local(self, run_pid_ns: str | None) -> bool:
        """Can a run's pid be checked here? Unknown namespaces count as ours."""
        return run_pid_ns is None or self.pid_ns is None or run_pid_ns == self.pid_ns

    def _alive(self, run: dict[str, Any]) -> bool:
        """Liveness of a stored run; a foreign-namespace pid is given the benefit
        of the doubt (its silence is checked once it is live again)."""
        if not self._local(run.get("pid_ns")):
            return True
        return self.pid_alive(run["pid"], run["start_wall_ns"])

    def _gpu(self, cuda_uuid: str | None) -> tuple[str | None, int]:
        dev = match_uuid(self.gpu_devices, cuda_uuid)
        return (dev.name, 1) if dev else (None, 0)

    async def hello(self, msg: dict[str, Any]) -> LiveRun:
        """Create the run of a ``hello`` (idempotent: a retried hello gets the same run)."""
        async with self._lock:
            live = self.registry.get(msg["run_key"])
            if live is not None:
                live.helloed = True
                return live
            existing = await reads.find_run(self.store, run_key=msg["run_key"])
            if existing is not None:
                if existing["status"] in ("finished", "failed"):
                    raise UnknownRun(f"run {existing['id']} with this key has already ended")
                # a restarted daemon (or a lost run whose process speaks again):
                # the same run resumes, its stored messages acknowledged
                live = await self._adopt(existing)
                live.helloed = True
                return live
            default = self.default_gpu.uuid if self.default_gpu else None
            cuda_uuid = msg.get("cuda_uuid") or default
            gpu_model, gpu_count = self._gpu(cuda_uuid)
            row = {
                "run_key": msg["run_key"],
                "run_name": clean_run_name(msg["run_name"]),
                "status": "running",
                "host": msg["host"],
                "pid": msg["pid"],
                "pid_ns": msg.get("pid_ns"),
                "user_name": msg.get("user"),
                "project": msg.get("project"),
                "tags": orjson.dumps(msg["tags"]).decode() if msg.get("tags") else None,
                "rank": msg["rank"],
                "local_rank": msg["local_rank"],
                "world_size": msg["world_size"],
                "auto": int(msg["auto"]),
                "start_wall_ns": msg["wall_ns"],
                "start_mono_ns": msg["mono_ns"],
                "options": msg["options"],
                "cuda_uuid": cuda_uuid,
                "gpu_model": gpu_model,
                "gpu_count": gpu_count,
                "cpu_count": self.cpu_count,
                "boot_id": self.boot_id,
                "group_id": msg.get("group"),
                "local_world_size": msg.get("local_world_size"),
                "daemon": self.owner,
                # the run across nodes: a team server keys it by this (docs/team-server.md)
                "run_uuid": str(uuid.uuid4()),
            }
            run_id = await runsdb.insert_run(self.store, row)
            live = LiveRun(
                run_id,
                row["run_key"],
                row["run_name"],
                msg["pid"],
                msg["wall_ns"],
                msg["mono_ns"],
                cuda_uuid,
                local_pid=self._local(msg.get("pid_ns")),
                helloed=True,
            )
            self.registry.add(live)
            log.info("run %d %r started (pid %d)", run_id, row["run_name"], msg["pid"])
            return live

    async def resolve(self, run_key: str) -> LiveRun | None:
        """The live run for *run_key*, re-adopting a stored one whose process
        still runs; None if unknown or ended (see ``registry.unknown_reason``)."""
        live = self.registry.get(run_key)
        if live is not None or self.registry.unknown_reason(run_key):
            return live
        async with self._lock:
            live = self.registry.get(run_key)
            if live is not None:
                return live
            run = await reads.find_run(self.store, run_key=run_key)
            if run is None:
                self.registry.mark_unknown(run_key, "unknown_run")
                return None
            if run["status"] in ("finished", "failed") or not self._alive(run):
                self.registry.mark_unknown(run_key, "run_ended")
                return None
            return await self._adopt(run)

    async def _live_from_row(self, run: dict[str, Any]) -> LiveRun:
        live = LiveRun(
            run["id"],
            run["run_key"],
            run["run_name"],
            run["pid"],
            run["start_wall_ns"],
            run["start_mono_ns"],
            run["cuda_uuid"],
            local_pid=self._local(run.get("pid_ns")),
        )
        live.received = live.persisted_received = int(run["received_events"] or 0)
        live.store_dropped = int(run.get("store_dropped_events") or 0)
        live.seq = int(run.get("shim_seq") or 0)
        live.steps = await reads.count_steps(self.store, run["id"])
        return live

    async def _adopt(self, run: dict[str, Any]) -> LiveRun:
        """Track a stored run again (daemon restart), status back to running."""
        live = await self._live_from_row(run)
        if run.get("daemon") != self.owner:
            await runsdb.update_run(self.store, run["id"], daemon=self.owner)
        if run["status"] != "running":
            await runsdb.update_run(
                self.store,
                run["id"],
                status="running",
                end_wall_ns=None,
                end_mono_ns=None,
                summary=None,
            )
        self.registry.add(live)
        log.info("run %d %r re-adopted (pid %s)", run["id"], run["run_name"], run["pid"])
        return live

    async def bye(self, msg: dict[str, Any]) -> dict[str, Any]:
        """End a run: wait for its in-flight events, store its end, return the
        summary. Events still on their way after :data:`BYE_WAIT_S` are stored
        as they arrive (the run stays open to them, :meth:`_tail`) and the
        stored summary and insights are made again once they are in."""
        live = await self.resolve(msg["run_key"])
        if live is None or live.ending:
            raise UnknownRun(f"no running run with key {msg['run_key']!r}")
        live.ending = True
        try:
            tail = not await live.wait_received(msg["sent"], BYE_WAIT_S)
            await self.store.flush()
            if not tail:
                self._close(live)
            self._collect_lost(live)
            await runsdb.update_run(self.store, live.run_id, **self._end_fields(live, msg))
        except BaseException:  # whatever failed, the run is no longer live
            self._close(live)
            self._unstored_ends[live.run_id] = (live, msg)
            raise
        log.info("run %d %r %s", live.run_id, live.run_name, msg["status"])
        if not tail:
            return await self.insights.finalize(live.run_id, self._end_notes(live, msg))
        notes = self._end_notes(live, msg, tail=True)
        summary = await self.insights.finalize(live.run_id, notes)
        task = asyncio.create_task(self._tail(live, msg), name=f"tail-{live.run_id}")
        self._tails.add(task)
        task.add_done_callback(self._tails.discard)
        return summary

    async def retry_ends(self) -> list[int]:
        """Store the ends of runs whose bye could not (:attr:`_unstored_ends`)
        and judge them; return their ids. Raises while the store still fails
        (the run kept for the next try)."""
        done = []
        for run_id, (live, msg) in list(self._unstored_ends.items()):
            self._collect_lost(live)
            await runsdb.update_run(self.store, run_id, **self._end_fields(live, msg))
            del self._unstored_ends[run_id]
            log.info("run %d %r %s (its end stored late)", run_id, live.run_name, msg["status"])
            await self.insights.finalize(run_id, self._end_notes(live, msg))
            done.append(run_id)
        return done

    def _close(self, live: LiveRun) -> None:
        self.registry.end(live)

    def _collect_lost(self, live: LiveRun) -> None:
        """Add the events of *live* the store could not commit to its count."""
        refused = self.store.take_lost(live.run_id)
        live.store_dropped += refused
        live.store_refused += refused
        live.store_error = self.store.take_lost_error(live.run_id) or live.store_error

    def _end_fields(self, live: LiveRun, msg: dict[str, Any]) -> dict[str, Any]:
        cuda_uuid = msg.get("cuda_uuid") or live.cuda_uuid
        gpu_model, gpu_count = self._gpu(cuda_uuid)
        return dict(
            status=msg["status"],
            error=clean_text(msg["error"], MAX_ERROR_CHARS, keep_newlines=True)
            if msg.get("error")
            else None,
            dropped_events=msg["dropped"],
            sent_events=msg["sent"],
            received_events=live.received,
            end_wall_ns=msg["wall_ns"],
            end_mono_ns=msg["mono_ns"],
            cuda_uuid=cuda_uuid,
            gpu_model=gpu_model,
            gpu_count=gpu_count,
            trailing_eval_ns=msg.get("eval_ns", 0),
            store_dropped_events=live.store_dropped,
        )

    def _end_notes(self, live: LiveRun, msg: dict[str, Any], tail: bool = False) -> list[str]:
        notes = list(live.notes)
        if msg["dropped"]:
            notes.append(f"{msg['dropped']} events dropped in the training process")
        if tail:
            notes.append(
                f"{msg['sent'] - live.received} events were still on their way to gpuprofd: "
                "this summary is without them; they are being stored "
                "(gpuprofctl insights shows the whole run)"
            )
        elif msg["sent"] > live.received:
            notes.append(f"{msg['sent'] - live.received} events sent but not received")
        busy = live.store_dropped - live.store_refused
        if busy:
            notes.append(f"{busy} events received but not stored (daemon busy)")
        if live.store_refused:
            why = f" ({live.store_error})" if live.store_error else ""
            notes.append(
                f"{live.store_refused} events received but not stored: "
                f"the database refused them{why}"
            )
        return notes

    async def _tail(self, live: LiveRun, msg: dict[str, Any]) -> None:
        """Store the rest of an ended run's events while they keep coming,
        then make its stored insights and summary again over all of them."""
        try:
            while live.received < msg["sent"]:
                before = live.received
                if not await live.wait_received(msg["sent"], TAIL_IDLE_S) and (
                    live.received == before
                ):
                    break  # nothing for a while: the rest is lost
            await self.store.flush()
        finally:
            self._close(live)
        log.info(
            "run %d: %d of %d events in after its end", live.run_id, live.received, msg["sent"]
        )
        self._collect_lost(live)
        await runsdb.update_run(
            self.store,
            live.run_id,
            received_events=live.received,
            store_dropped_events=live.store_dropped,
        )
        await self.insights.finalize(live.run_id, self._end_notes(live, msg))

    async def close_tails(self) -> None:
        """Stop storing ended runs' late events (daemon shutdown)."""
        for t in list(self._tails):
            t.cancel()
        await asyncio.gather(*self._tails, return_exceptions=True)

    async def lose(self, live: LiveRun) -> dict[str, Any]:
        """Mark a live run whose process is gone as lost and finalize it."""
        live.ending = True
        try:
            await self.store.flush()
        finally:
            self.registry.end(live)
        self._collect_lost(live)
        await runsdb.update_run(
            self.store,
            live.run_id,
            status="lost",
            received_events=live.received,
            end_wall_ns=self._wall(),
            end_mono_ns=live.last_t1_ns or self._mono(),
            store_dropped_events=live.store_dropped,
        )
        why = f"pid {live.pid} is gone" if live.local_pid else "silent too long"
        log.warning("run %d %r lost: %s", live.run_id, live.run_name, why)
        return await self.insights.finalize(live.run_id, [LOST_NOTE, *live.notes])

    async def check_lost(self) -> list[int]:
        """Lose every live run whose process is gone; return their ids."""
        candidates = [r for r in self.registry.live.values() if not r.ending]
        if not candidates:
            return []
        now = time.monotonic_ns()

        def gone(r: LiveRun) -> bool:
            if not r.local_pid:
                return now - r.last_event_mono_ns > FOREIGN_SILENCE_S * 1e9
            return not self.pid_alive(r.pid, r.start_wall_ns)

        dead = await asyncio.to_thread(lambda: [r for r in candidates if gone(r)])
        for live in dead:
            if not live.ending:
                await self.lose(live)
        return [r.run_id for r in dead]

    async def recover_at_startup(self) -> None:
        """Runs left ``running`` by a previous daemon of this node: adopt if
        alive, else lose. Another daemon's runs (a shared database) are its own."""
        for run in await reads.runs_with_status(self.store, "running"):
            if run.get("daemon") not in (None, self.owner):
                continue
            if self._alive(run):
                await self._adopt(run)
                continue
            live = await self._live_from_row(run)
            t1 = await reads.last_step_end(self.store, run["id"])
            live.last_t1_ns = t1 if t1 is not None else run["start_mono_ns"]
            await self.lose(live)

    async def persist_counts(self) -> None:
        """Store each live run's received-event count (survives a restart)."""
        for live in self.registry.live.values():
            if live.received != live.persisted_received:
                await self.store.submit(
                    Op(
                        "UPDATE runs SET received_events = ? WHERE id = ?",
                        (live.received, live.run_id),
                    )
                )
                live.persisted_received = live.received
