"""gpuprofd's process: startup checks, wiring, serving, clean shutdown.

Order at startup: socket dir (0700) → single-instance lock (a loser exits 0)
→ database check → stale sockets unlinked → ``PULL``/``ROUTER`` bound →
tasks. At shutdown (SIGTERM/SIGINT/idle): stop accepting → let in-flight
requests finish → stop samplers → persist counters → flush the store →
remove socket files → release the lock. Live runs stay ``running`` so the
next daemon re-adopts them.

Periodic pruning (every :data:`PRUNE_INTERVAL_S`, or the raw window if
shorter): raw GPU samples older than ``--raw-window`` (the per-second rollups
keep the whole run); continuous kernel windows merged as they age
(:mod:`gpuprofd.storage.kcompact`); per-bucket comm rows outside each run's last
``--comm-steps-kept`` steps that are not every ``--comm-keep-every``-th step
(:mod:`gpuprofd.storage.commprune`; bounded delete passes, each step's exposed comm
stays in ``steps``).

The database file deleted or replaced under the daemon (``rm gpuprof.db*``
between runs): checked at each hello and once a second
(:meth:`Daemon.check_db`). A hello then makes a fresh database at the path and
its run is stored there; runs open at that moment are copied across at once
(:mod:`gpuprofd.storage.dbrotate`) and go on there, with a note in their summary.
With no run open the daemon only logs it (no empty file reappears after an
``rm``) and makes the new file at the next hello. ``gpuprofctl status
--format json`` shows it under ``db_file`` / ``db_reopened``.

``gpuprofctl stop`` sends ``stop``: with no open run the daemon exits at
once; else it refuses new runs (their hello is answered with why: they run
unprofiled) and exits when its open runs have ended. ``now`` exits at once:
open runs stay ``running`` in the database and the next daemon re-adopts
them while their processes live (their events meanwhile are dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from gpuprof import config
from gpuprofd.boot import boot_id
from gpuprofd.counters import DropCounter
from gpuprofd.errors import EXIT_OK, DatabaseError, GpuprofdError
from gpuprofd.ingest.control import ControlServer
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.lifecycle import Lifecycle
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.insights_runner import InsightsRunner
from gpuprofd.lock import InstanceLock
from gpuprofd.sampling import rollup
from gpuprofd.sampling.gpu_sampler import DEFAULT_SAMPLE_HZ, GpuSampler
from gpuprofd.sampling.host_sampler import HostSample, HostSampler
from gpuprofd.sampling.nvml import GpuSample, GpuSlowSample, open_backend
from gpuprofd.sampling.rollup import SecondRollups
from gpuprofd.storage import commprune, dbrotate, kcompact, runsdb, schema
from gpuprofd.storage.store import Op, Store
from gpuprofd.storage.url import StorageUrl

log = logging.getLogger(__name__)

#: How long shutdown waits for in-flight control requests (a bye) to finish.
DRAIN_S = 3.0
#: Raw GPU fast-loop rows stored per second per GPU, for the recent window
#: only (the whole run is kept as per-second rollups, see gpuprofd.sampling.rollup):
#: enough to zoom into the last minutes; every sample still feeds the rollups.
STORED_GPU_HZ = 10.0
#: How long raw GPU rows (fast and slow loop) are kept, seconds. 15 min of
#: 10 Hz rows is ~9k rows per GPU; older data lives on as rollups.
DEFAULT_RAW_WINDOW_S = 900.0
#: Rollup rows held while the store queue is full: an hour of 8 GPUs.
ROLLUP_BACKLOG_ROWS = 8 * 3600
#: How often rows older than the raw window are deleted, seconds.
PRUNE_INTERVAL_S = 60.0
#: How often the database path is checked for deletion or replacement, seconds
#: (a stat; each hello checks too).
DB_CHECK_S = 1.0
#: Database switches remembered for ``ping``.
DB_EVENTS_KEPT = 10


@dataclass(frozen=True)
class DaemonOptions:
    socket_dir: Path
    db: Path
    """The SQLite file, unless *storage* names a Postgres database."""
    storage: StorageUrl | None = None
    """Where runs are stored; None: the file *db*."""
    idle_exit_s: float = 0.0
    """Exit after this long with no live run and no message; 0 = never."""
    sample_hz: float = DEFAULT_SAMPLE_HZ
    """GPU fast-loop rate (samples per second per GPU)."""
    nvml_backend: str = "real"
    host_interval_s: float = 0.5
    gpu_rate_usd_per_hour: float | None = None
    base_notes: tuple[str, ...] = ()
    raw_window_s: float = DEFAULT_RAW_WINDOW_S
    """Raw GPU samples older than this are deleted (rollups stay), seconds."""
    comm_steps_kept: int = commprune.COMM_STEPS_KEPT
    """Per-bucket comm rows kept for each run's last this-many steps ..."""
    comm_keep_every: int = commprune.COMM_KEEP_EVERY
    """... and for every this-many-th step (:mod:`gpuprofd.storage.commprune`)."""


def run_daemon(opts: DaemonOptions) -> int:
    """Run a daemon to completion; return the process exit code.

    Raises:
        GpuprofdError: startup failed (bad database): the caller prints it.
    """
    make_socket_dir(opts.socket_dir)
    lock = InstanceLock(opts.socket_dir / config.LOCK_NAME)
    if not lock.acquire():
        log.info("gpuprofd already running on %s (pid %s): exiting", opts.socket_dir,
                 lock.holder_pid())  # fmt: skip
        return EXIT_OK
    if opts.storage is not None and not opts.storage.is_file:
        # Several daemons may share one Postgres database, and there is no file
        # to lock or to lose: the Postgres store creates its own tables.
        try:
            return asyncio.run(Daemon(opts).serve())
        finally:
            lock.release()
    db_lock = InstanceLock(opts.db, write_pid=False)
    try:
        schema.prepare(opts.db)
        if not db_lock.acquire():
            raise DatabaseError(
                f"{opts.db} is already served by another gpuprofd; point GPUPROF_SOCKET at "
                "that daemon's socket directory (gpuprofctl status lists it)"
            )
        return asyncio.run(Daemon(opts, db_lock).serve())
    finally:
        db_lock.release()
        lock.release()


def make_socket_dir(path: Path) -> None:
    """Create the socket directory, private (0700) if we create it."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuprofdError(f"cannot create socket directory {path}: {exc}") from None


class Daemon:
    """One running daemon (inside an event loop)."""

    def __init__(self, opts: DaemonOptions, db_lock: InstanceLock | None = None) -> None:
        self.opts = opts
        self.db_lock = db_lock
        """The flock on the database file (moved to a new file by :meth:`check_db`)."""
        self._db_check = asyncio.Lock()
        self._db_noted: str | None = None
        """The last database problem logged (logged once, not every second)."""
        self.db_events: deque[dict[str, Any]] = deque(maxlen=DB_EVENTS_KEPT)
        self.stopping = False
        """``gpuprofctl stop``: no new runs; exit once the open ones end."""
        self.drops = DropCounter()
        self.registry = RunRegistry()
        self.store = Store(opts.storage or opts.db, self.drops)
        self.started_wall_ns = time.time_ns()
        self._last_activity = time.monotonic()
        self._stop = asyncio.Event()
        self._zmq = zmq.asyncio.Context()
        self._sockets: list[zmq.asyncio.Socket] = []
        self._socket_files = [
            opts.socket_dir / config.INGEST_SOCKET_NAME,
            opts.socket_dir / config.CONTROL_SOCKET_NAME,
        ]
        self._gpu: GpuSampler | None = None
        self._gpu_note: str | None = None
        """Why GPU metrics are off (no NVML, no GPU), if they are."""
        self.gpu_slow: dict[str, GpuSlowSample] = {}
        #: The newest fast-loop sample per GPU UUID (every tick, stored or not).
        self.gpu_latest: dict[str, GpuSample] = {}
        """The latest slow-loop sample per GPU UUID (energy, PCIe, GPM); also stored."""
        #: The newest host sample. Its per-core CPU % is kept here only, not
        #: stored: as JSON it is ~0.8 KB a row on a 128-core host, ~130 MB a
        #: day at 2 Hz (over 10x the rest of the row), and no rule reads it yet.
        self.host_latest: HostSample | None = None
        self.ingest: Ingest | None = None
        self.runs: RunService | None = None
        self.boot_id = boot_id()
        """This boot of the node: stored with runs, host samples and rollups."""
        self.rollups = SecondRollups(boot_id=self.boot_id)
        self._rollup_backlog: deque[tuple[Any, ...]] = deque(maxlen=ROLLUP_BACKLOG_ROWS)
        self._host: HostSampler | None = None
        self._workers_dropped = 0

    def touch(self) -> None:
        """Note activity (any message) for the idle exit."""
        self._last_activity = time.monotonic()

    def stop(self) -> None:
        """Ask the daemon to shut down cleanly."""
        self._stop.set()

    async def serve(self) -> int:
        await self.store.open()
        self.store.start()
        try:
            tasks, control, lifecycle = await self._start()
        except BaseException:
            await self._abort_start()  # or aiosqlite's thread keeps the process (and lock) alive
            raise
        log.info("gpuprofd %d serving on %s, db %s", os.getpid(), self.opts.socket_dir,
                 self.store.where)  # fmt: skip
        try:
            await self._stop.wait()
        finally:
            await self._shutdown(tasks, control, lifecycle)
        return EXIT_OK

    async def _start(self) -> tuple[list[asyncio.Task[Any]], ControlServer, Lifecycle]:
        opts = self.opts
        backend, gpu_note = await asyncio.to_thread(open_backend, opts.nvml_backend)
        notes = [*opts.base_notes, *([gpu_note] if gpu_note else [])]
        self._gpu_note = gpu_note
        devices = backend.devices() if backend else []
        self.rollups = SecondRollups(devices, self.boot_id)
        insights = InsightsRunner(self.store, self.store.where, opts.gpu_rate_usd_per_hour, notes,
                                  drops=self.drops)  # fmt: skip
        self.runs = RunService(self.store, self.registry, insights, devices, boot_id=self.boot_id)
        self._notes = notes
        await self.runs.recover_at_startup()
        pull, router = self._bind()
        host = self._host = HostSampler(run_pids=self.registry.pids)
        self.ingest = Ingest(pull, self.runs, self.store, self.drops, self.touch,
                             on_workers=host.workers.add)  # fmt: skip
        control = ControlServer(
            router,
            {"hello": self._hello, "bye": self._bye, "ping": self._ping, "stop": self._stop_req},
            self.drops, self.touch,
        )  # fmt: skip
        lifecycle = Lifecycle(self.runs, self.drops, opts.idle_exit_s,
                              lambda: self._last_activity, self.stop)  # fmt: skip
        tasks = [
            asyncio.create_task(self.ingest.run(), name="ingest"),
            asyncio.create_task(control.run(), name="control"),
            asyncio.create_task(host.run(self._on_host_sample, opts.host_interval_s), name="host"),
            asyncio.create_task(lifecycle.run(), name="lifecycle"),
            asyncio.create_task(self._prune_raw(), name="prune"),
            asyncio.create_task(self._compact_kernels(), name="compact-kernels"),
            asyncio.create_task(self._prune_comm(), name="prune-comm"),
            asyncio.create_task(self._watch_db(), name="watch-db"),
        ]
        if backend is not None:
            self._gpu = GpuSampler(backend, opts.sample_hz, self._gpu_sink(),
                                   slow_sink=self._gpu_slow_sink())  # fmt: skip
            self._gpu.start()
        self._install_signals()
        return tasks, control, lifecycle

    async def _abort_start(self) -> None:
        """Release what a failed start took: sampler threads, sockets, the store."""
        if self._gpu is not None:
            await asyncio.to_thread(self._gpu.stop)
        for sock in self._sockets:
            sock.close(linger=0)
        self._zmq.term()
        await self.store.close()

    def _bind(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        for path in self._socket_files:  # stale files of a dead daemon; we hold the lock
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        pull = self._zmq.socket(zmq.PULL)
        router = self._zmq.socket(zmq.ROUTER)
        self._sockets = [pull, router]
        for s in self._sockets:
            s.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.RCVHWM, 100_000)
        pull.bind(config.ingest_endpoint(self.opts.socket_dir))
        router.bind(config.control_endpoint(self.opts.socket_dir))
        return pull, router

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def _shutdown(self, tasks: list[asyncio.Task[Any]], control: ControlServer,
                        lifecycle: Lifecycle) -> None:  # fmt: skip
        log.info("gpuprofd shutting down")
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        tasks[0].cancel()
        tasks[1].cancel()  # stop accepting; requests in flight may finish
        await control.drain(DRAIN_S)
        for t in tasks[2:]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._gpu is not None:
            await asyncio.to_thread(self._gpu.stop)
            fast = self._gpu.stats()["fast"]
            log.info("GPU fast loop: %d ticks, %.1f Hz of %.1f, %d slots missed", fast.ticks,
                     fast.achieved_hz or 0.0, fast.requested_hz, fast.missed_ticks)  # fmt: skip
            await asyncio.sleep(0)  # sinks queued by the sampler threads' last ticks
        self._store_rollups(self.rollups.flush())
        while self._rollup_backlog:  # the writer is still running: wait for room
            await self.store.submit(Op(rollup.INSERT_SQL, self._rollup_backlog.popleft()))
        for s in self._sockets:
            s.close(linger=0)
        self._zmq.term()
        for path in self._socket_files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        try:
            await lifecycle.persist()
        finally:
            await self.store.close()

    # --- samplers → store -------------------------------------------------------

    def _on_host_sample(self, s: HostSample) -> None:
        self.host_latest = s
        untracked = self._host.workers.dropped if self._host is not None else 0
        if untracked > self._workers_dropped:  # worker pids over the caps: counted, not followed
            self.drops.add("workers_untracked", n=untracked - self._workers_dropped)
            self._workers_dropped = untracked
        self.store.submit_nowait(
            runsdb.host_sample_op(
                s.mono_ns, s.cpu_pct, s.cpu_count, s.disk_read_bps, s.disk_read_iops,
                s.page_cache_bytes, s.mem_total_bytes, s.swap_in_bps, self.boot_id,
            )
        )  # fmt: skip
        for run_id, cores in s.run_cpu_cores.items():
            self.store.submit_nowait(runsdb.run_cpu_op(run_id, s.mono_ns, cores))
        for w in s.worker_cpu:
            self.store.submit_nowait(runsdb.worker_cpu_op(w))

    def _store_rollups(self, rows: list[tuple[Any, ...]]) -> None:
        """Queue rollup rows. They are the whole run's GPU record (one row per
        GPU per second), so when the store queue is full they wait in a
        backlog (up to :data:`ROLLUP_BACKLOG_ROWS`) instead of being dropped."""
        backlog, queue = self._rollup_backlog, self.store.queue
        while backlog and not queue.full():
            self.store.submit_nowait(Op(rollup.INSERT_SQL, backlog.popleft()))
        for row in rows:
            if not backlog and not queue.full():
                self.store.submit_nowait(Op(rollup.INSERT_SQL, row))
                continue
            if len(backlog) == backlog.maxlen:
                self.drops.add("rollup_backlog_full")  # the oldest row goes
            backlog.append(row)

    def _gpu_sink(self) -> Any:
        loop = asyncio.get_running_loop()
        min_gap_ns = int(1e9 / STORED_GPU_HZ)
        last_stored = [0]

        def enqueue(mono_ns: int, samples: list[GpuSample]) -> None:
            self.gpu_latest.update((s.uuid, s) for s in samples)
            self._store_rollups(self.rollups.add(mono_ns, samples))
            if mono_ns - last_stored[0] < min_gap_ns:
                return  # in the rollups and the live view; raw rows at STORED_GPU_HZ
            last_stored[0] = mono_ns
            for s in samples:
                self.store.submit_nowait(runsdb.gpu_sample_op(mono_ns, s))

        return lambda mono_ns, samples: loop.call_soon_threadsafe(enqueue, mono_ns, samples)

    def _gpu_slow_sink(self) -> Any:
        loop = asyncio.get_running_loop()

        def keep(mono_ns: int, samples: list[GpuSlowSample]) -> None:
            self.gpu_slow.update((s.uuid, s) for s in samples)
            self._store_rollups(self.rollups.add_slow(mono_ns, samples))
            for s in samples:
                self.store.submit_nowait(runsdb.gpu_slow_sample_op(mono_ns, s))

        return lambda mono_ns, samples: loop.call_soon_threadsafe(keep, mono_ns, samples)

    async def _prune_raw(self) -> None:
        """Delete raw GPU rows older than the raw window, once a minute."""
        while True:
            await asyncio.sleep(min(PRUNE_INTERVAL_S, self.opts.raw_window_s))
            cutoff = time.monotonic_ns() - int(self.opts.raw_window_s * 1e9)
            for op in runsdb.prune_raw_gpu_ops(cutoff):
                self.store.submit_nowait(op)

    async def _compact_kernels(self) -> None:
        """Merge continuous kernel windows older than the raw window into
        coarser ones (:mod:`gpuprofd.storage.kcompact`), as often as raw GPU rows are pruned."""
        while True:
            await asyncio.sleep(min(PRUNE_INTERVAL_S, self.opts.raw_window_s))
            try:
                await kcompact.compact_once(self.store, time.monotonic_ns(), self.opts.raw_window_s)
            except Exception:  # a read failing must not end the task
                log.exception("kernel window compaction failed; retried next time")

    async def _prune_comm(self) -> None:
        """Delete per-bucket comm rows outside each run's recent window and
        not every Nth step (:mod:`gpuprofd.storage.commprune`), as often as raw GPU rows."""
        pruner = commprune.CommPruner(self.opts.comm_steps_kept, self.opts.comm_keep_every)
        while True:
            await asyncio.sleep(min(PRUNE_INTERVAL_S, self.opts.raw_window_s))
            try:
                passes = await pruner.prune_round(self.store)
                if passes:
                    log.debug("comm buckets pruned in %d pass(es)", passes)
            except Exception:  # a read or delete failing must not end the task
                log.exception("comm bucket pruning failed; retried next time")

    # --- the database file deleted or replaced ------------------------------------

    async def _watch_db(self) -> None:
        while True:
            await asyncio.sleep(DB_CHECK_S)
            try:
                await self.check_db(for_hello=False)
                if self.stopping and not self.registry.live:
                    log.info("stop requested and no run is open: exiting")
                    self.stop()
            except Exception:  # a failing check must not end the task
                log.exception("database file check failed; retried next time")

    async def check_db(self, *, for_hello: bool) -> None:
        """Has the database file been deleted or replaced under us? Then move
        to a fresh database at the path, copying the open runs (see module doc).
        Without open runs only a hello moves (the periodic check logs)."""
        if self.store.file_state() is None:
            return
        assert self.runs is not None
        async with self._db_check, self.runs.lock:  # no run is half-created meanwhile
            state = self.store.file_state()
            if state is None:
                return
            live = list(self.registry.live.values())
            if not live and not for_hello:
                self._note_db(state, logging.WARNING,
                              "no run is open; a fresh database is made there at the next run "
                              "(host samples meanwhile are not kept)")  # fmt: skip
                return
            await self._reopen_db(state, live)

    def _note_db(self, state: str, level: int, what: str) -> None:
        key = f"{state}: {what}"
        if self._db_noted != key:
            self._db_noted = key
            log.log(level, "database %s was %s under gpuprofd %d: %s", self.opts.db, state,
                    os.getpid(), what)  # fmt: skip

    async def _reopen_db(self, state: str, live: list[Any]) -> None:
        db = self.opts.db
        if state == "deleted":  # nothing at the path: try it before letting go of the old file
            try:
                await asyncio.to_thread(schema.prepare, db)
            except GpuprofdError as exc:
                self._note_db(state, logging.ERROR,
                              f"no fresh database can be made there ({exc}); runs are written "
                              "into the deleted file, lost when gpuprofd exits: fix the path, "
                              "or run `gpuprofctl stop` and start again")  # fmt: skip
                return
        if self.db_lock is not None and not await asyncio.to_thread(self.db_lock.reacquire):
            self._note_db(state, logging.ERROR,
                          "the file now there is served by another gpuprofd; runs are written "
                          "into the deleted file, lost when this daemon exits: run "
                          "`gpuprofctl stop` for this one")  # fmt: skip
            return
        run_ids = sorted({r.run_id for r in live})
        ids: dict[int, int] = {}

        async def write_new(new: Any, snap: dbrotate.Snapshot) -> None:
            ids.update(await dbrotate.write_live_runs(new, snap))

        try:
            await self.store.reopen(lambda old: dbrotate.read_live_runs(old, run_ids),
                                    lambda: schema.prepare(db), write_new)  # fmt: skip
        except Exception as exc:
            log.error("database %s was %s under gpuprofd %d and switching to it failed (%s): "
                      "runs cannot be stored; gpuprofd exits (open runs are lost; the next run "
                      "starts a fresh daemon)", db, state, os.getpid(), exc)  # fmt: skip
            self.db_events.append({"wall_ns": time.time_ns(), "was": state, "error": str(exc),
                                   "runs_lost": run_ids})  # fmt: skip
            self.stop()
            return
        self._db_noted = None
        for r in live:
            old_id = r.run_id
            r.run_id = ids.get(old_id, old_id)
            renamed = f" (now run {r.run_id})" if r.run_id != old_id else ""
            r.notes.append(
                f"the database file was {state} during this run: gpuprofd made a fresh one at "
                f"{db} and copied this run's rows into it{renamed}"
            )
        carried = ", ".join(f"{r.run_id} {r.run_name!r}" for r in live) or "none"
        log.warning("database %s was %s under gpuprofd %d: made a fresh database there; open "
                    "runs copied into it: %s", db, state, os.getpid(), carried)  # fmt: skip
        self.db_events.append({"wall_ns": time.time_ns(), "was": state,
                               "runs_copied": [r.run_id for r in live]})  # fmt: skip

    # --- control handlers ------------------------------------------------------

    async def _hello(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.runs is not None
        if self.stopping and self.registry.get(msg["run_key"]) is None:
            return {"ok": False, "stopping": True, "error": "gpuprofd is stopping (gpuprofctl "
                    "stop) and takes no new runs: it exits once its open runs end; "
                    "`gpuprofctl stop --now` ends it at once"}  # fmt: skip
        await self.check_db(for_hello=True)
        live = await self.runs.hello(msg)
        return {
            "ok": True, "run_id": live.run_id, "db": self.store.where,
            "daemon_pid": os.getpid(), "notes": list(self._notes),
        }  # fmt: skip

    async def _bye(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.runs is not None
        # the open second holds the run's last GPU samples: store it before the
        # summary reads (a second split in two rows merges exactly)
        self._store_rollups(self.rollups.flush())
        return {"ok": True, "summary": await self.runs.bye(msg)}

    async def _ping(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "pid": os.getpid(),
            "db": self.store.where,
            "socket_dir": str(self.opts.socket_dir),
            "started_wall_ns": self.started_wall_ns,
            "live_runs": [r.as_ping() for r in self.registry.live.values()],
            "dropped": self.drops.snapshot(),
            "received": self.ingest.received if self.ingest else 0,
            "gpu_sampling": self._gpu_sampling(),
            "db_file": self.store.file_state() or "ok",
            "db_reopened": list(self.db_events),
            "stopping": self.stopping,
        }

    async def _stop_req(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``gpuprofctl stop``: exit once the open runs end, or now."""
        open_runs = len(self.registry.live)
        if msg.get("now") or not open_runs:
            log.info("stop requested (%s): exiting", "now" if msg.get("now") else "no open run")
            asyncio.get_running_loop().call_later(0.05, self.stop)  # after this reply is sent
            return {"ok": True, "pid": os.getpid(), "exiting": True, "open_runs": open_runs}
        self.stopping = True
        log.info("stop requested: no new runs; exiting once %d open run(s) end", open_runs)
        return {"ok": True, "pid": os.getpid(), "exiting": False, "open_runs": open_runs}

    def _gpu_sampling(self) -> dict[str, Any]:
        """The GPU loops' achieved rates so far, or why there are none."""
        if self._gpu is None:
            return {"on": False, "why": self._gpu_note or "no NVML backend"}
        out: dict[str, Any] = {"on": True, "gpus": len(self.gpu_latest),
                               "backend": self.opts.nvml_backend}  # fmt: skip
        for name, st in self._gpu.stats().items():
            out[name] = {
                "requested_hz": st.requested_hz, "achieved_hz": st.achieved_hz,
                "ticks": st.ticks, "missed_ticks": st.missed_ticks, "cpu_s": st.cpu_s,
            }  # fmt: skip
        return out
