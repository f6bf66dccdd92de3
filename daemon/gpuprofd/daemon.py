"""gpuprofd's process: startup checks, wiring, serving, clean shutdown.

Order at startup: socket dir (0700) → single-instance lock (a loser exits 0)
→ database check → store opened → stale sockets unlinked → ``PULL``/``ROUTER``
bound → the dashboard (HTTP, :mod:`gpuprofd.web`) → tasks. At shutdown
(SIGTERM/SIGINT/idle/``gpuprofctl stop``): stop accepting → let in-flight
requests finish → close the dashboard (its live sockets with 1001) → stop
samplers → persist counters → flush the store → remove socket files →
release the lock. Live runs stay ``running`` so the next daemon re-adopts them.

Every step after the lock is a context on one :class:`contextlib.AsyncExitStack`
(:meth:`Daemon._start`). The stack unwinds last in, first out, so the steps
are entered in the reverse of the shutdown order; each is marked with its
shutdown step. A start that fails half-way unwinds what it took the same way.

The jobs wired here live elsewhere: samplers → store in :mod:`gpuprofd.services.sinks`;
retention and the periodic loop in :mod:`gpuprofd.storage.upkeep.maintenance`; the database
file deleted or replaced in :mod:`gpuprofd.ingest.dbswitch`; hello, bye, ping
and stop in :mod:`gpuprofd.ingest.handlers`; the sockets in
:mod:`gpuprofd.ingest.sockets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprof import config
from gpuprofd.core.boot import boot_id
from gpuprofd.core.counters import DropCounter
from gpuprofd.core.errors import EXIT_OK, DatabaseError, GpuprofdError
from gpuprofd.core.lock import InstanceLock
from gpuprofd.forward.config import ForwardConfig
from gpuprofd.ingest.control import ControlServer
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.dbswitch import DB_CHECK_S, DbSwitch
from gpuprofd.ingest.handlers import STOP_CHECK_S, ControlHandlers
from gpuprofd.ingest.lifecycle import Lifecycle
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.ingest.sockets import DaemonSockets
from gpuprofd.sampling import gpu_sampler
from gpuprofd.sampling.backend import open_backend
from gpuprofd.sampling.gpu_sampler import DEFAULT_SAMPLE_HZ, GpuSampler
from gpuprofd.sampling.host_sampler import HostSampler
from gpuprofd.sampling.rollup import SecondRollups
from gpuprofd.services.evidence import EvidencePlanner
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.services.sinks import SampleSinks
from gpuprofd.storage import filecheck, schema
from gpuprofd.storage.upkeep import (
    DEFAULT_RAW_WINDOW_S,
    Retention,
    commprune,
    every,
    hostrollup,
    steprollup,
)
from gpuprofd.storage.url import StorageUrl
from gpuprofd.storage.writes import Store, costs
from gpuprofd.web import address as http_address
from gpuprofd.web.address import HttpAddress

if TYPE_CHECKING:
    from gpuprofd.forward.forwarder import Forwarder
    from gpuprofd.web.auth import AuthConfig

log = logging.getLogger(__name__)

#: How long shutdown waits for in-flight control requests (a bye) to finish, seconds.
DRAIN_S = 3.0
#: How long shutdown spends sending what the outbox still holds, seconds.
LAST_SEND_S = 3.0
#: How often the outbox is held to its bound (``--forward-max-mb``), seconds.
FORWARD_LIMIT_S = 5.0


@dataclass(frozen=True)
class DaemonOptions:
    """What ``gpuprofd``'s command line and environment set."""

    socket_dir: Path
    """Where the sockets and the single-instance lock live (made 0700)."""
    db: Path
    """The SQLite database (made if missing), unless *storage* names a Postgres one."""
    storage: StorageUrl | None = None
    """Where runs are stored; None: the file *db*."""
    idle_exit_s: float = 0.0
    """Exit after this long with no live run and no message, seconds; 0 = never."""
    sample_hz: float = DEFAULT_SAMPLE_HZ
    """GPU fast-loop rate (samples per second per GPU)."""
    nvml_backend: str = "real"
    """``real``, ``mock`` or ``replay:PATH`` (:func:`gpuprofd.sampling.backend.open_backend`)."""
    host_interval_s: float = 0.5
    """Seconds between host samples."""
    gpu_rate_usd_per_hour: float | None = None
    """GPU price for the cost estimate, US dollars per GPU-hour; None: not estimated."""
    base_notes: tuple[str, ...] = ()
    """Told to every run at hello (e.g. a malformed ``GPUPROF_GPU_RATE``)."""
    raw_window_s: float = DEFAULT_RAW_WINDOW_S
    """Raw GPU samples older than this are deleted (rollups stay), seconds."""
    comm_steps_kept: int = commprune.COMM_STEPS_KEPT
    """Per-bucket comm rows kept for each run's last this-many steps ..."""
    comm_keep_every: int = commprune.COMM_KEEP_EVERY
    """... and for every this-many-th step (:mod:`gpuprofd.storage.upkeep.commprune`)."""
    http: HttpAddress | None = http_address.parse(None)
    """Where the dashboard listens (:mod:`gpuprofd.web.address`); None: ``--http off``."""
    forward: ForwardConfig | None = None
    """The team server runs are forwarded to (``--server``); None: none."""
    viewers: AuthConfig | None = None
    """The dashboard's viewer login (``--viewer-password-file``); None: loopback, no login."""


def run_daemon(opts: DaemonOptions) -> int:
    """Run a daemon to completion; return the process exit code.

    Raises:
        GpuprofdError: startup failed (bad database): the caller prints it.
    """
    make_socket_dir(opts.socket_dir)
    lock = InstanceLock(opts.socket_dir / config.LOCK_NAME)
    if not lock.acquire():
        log.info(
            "gpuprofd already running on %s (pid %s): exiting", opts.socket_dir, lock.holder_pid()
        )
        return EXIT_OK
    if opts.storage is not None and not opts.storage.is_file:
        # Several daemons may share one Postgres database, and there is no file
        # to lock or to lose: the Postgres store creates its own tables.
        try:
            return asyncio.run(Daemon(opts).serve())
        finally:
            lock.release()
    db_lock = InstanceLock(opts.db, write_pid=False)
    try:  # shutdown's last step: release the lock (after everything below is undone)
        _prepare(opts)
        if not db_lock.acquire():
            raise DatabaseError(
                f"{opts.db} is already served by another gpuprofd; point GPUPROF_SOCKET at "
                "that daemon's socket directory (gpuprofctl status lists it)"
            )
        return asyncio.run(Daemon(opts, db_lock).serve())
    finally:
        db_lock.release()
        lock.release()


def _prepare(opts: DaemonOptions) -> None:
    """The database file made or upgraded, checked whole first unless it is as
    the last clean stop left it (:mod:`gpuprofd.storage.filecheck`).

    Raises:
        DatabaseError: not SQLite, damaged, not gpuprof's, or too new.
    """
    if filecheck.left_clean(opts.socket_dir / filecheck.CLEAN_STAMP, opts.db):
        log.info("%s is as gpuprofd left it at its last clean stop: not checked again", opts.db)
        schema.prepare(opts.db, verify=False)
        return
    held = opts.db.is_file() and opts.db.stat().st_size > 0
    t0 = time.perf_counter()
    schema.prepare(opts.db)
    if held:
        took = time.perf_counter() - t0
        log.info("checked %s whole (SQLite's quick_check): %.2f s", opts.db, took)


def make_socket_dir(path: Path) -> None:
    """Create the socket directory, private (0700) if we create it."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuprofdError(f"cannot create socket directory {path}: {exc}") from None


@contextlib.asynccontextmanager
async def open_store(opts: DaemonOptions, drops: DropCounter) -> AsyncIterator[Store]:
    """The daemon's store, open and writing inside the context; on exit
    everything queued is committed and the connections closed. The one place
    that builds, opens and closes the store (and so picks its backend)."""
    store = Store(opts.storage or opts.db, drops)
    await store.open()
    if store.path is None:
        log.info(
            "storing in Postgres (%s): no database file to lock or to watch; other gpuprofd "
            "may share the database",
            store.where,
        )
    try:
        store.start()
        yield store
    except BaseException:
        await store.close()
        raise
    file_id = store.file_id  # the file it had open to the end (a switch may have failed)
    await store.close()
    if file_id is not None and store.path is not None:  # a clean stop: no check at the next start
        filecheck.note_clean(opts.socket_dir / filecheck.CLEAN_STAMP, store.path, file_id)


@contextlib.asynccontextmanager
async def task(name: str, coro: Coroutine[Any, Any, Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """*coro* running as the task *name*; leaving cancels it and waits for its end."""
    t = asyncio.create_task(coro, name=name)
    try:
        yield t
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        log.debug("task %s stopped", name)


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call *stop* inside the context (the default handlers after)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class Daemon:
    """One running daemon (inside an event loop)."""

    def __init__(self, opts: DaemonOptions, db_lock: InstanceLock | None = None) -> None:
        self.opts = opts
        self.db_lock = db_lock
        """The flock on the database file (moved to a new file by the database switch)."""
        self.drops = DropCounter()
        self.registry = RunRegistry()
        self.started_wall_ns = time.time_ns()
        self.boot_id = boot_id()
        """This boot of the node: stored with runs, host samples and rollups."""
        self._last_activity = time.monotonic()
        self._where = str(opts.db)
        self._stop = asyncio.Event()

    def touch(self) -> None:
        """Note activity (any message) for the idle exit."""
        self._last_activity = time.monotonic()

    def stop(self) -> None:
        """Ask the daemon to shut down cleanly."""
        self._stop.set()

    async def serve(self) -> int:
        """Start, serve until asked to stop, shut down in the documented order."""
        async with contextlib.AsyncExitStack() as stack:
            await self._start(stack)
            log.info(
                "gpuprofd %d serving on %s, db %s", os.getpid(), self.opts.socket_dir, self._where
            )
            await self._stop.wait()
        return EXIT_OK

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        """Enter every step on *stack*, in the reverse of the shutdown order
        (the numbers are the module doc's shutdown steps)."""
        opts, drops = self.opts, self.drops
        # 6. remove socket files: registered first so it runs after the store's flush
        sockets = DaemonSockets(opts.socket_dir)
        stack.callback(sockets.close)
        # 5. flush the store
        store = await stack.enter_async_context(open_store(opts, drops))

        backend, gpu_note = await asyncio.to_thread(open_backend, opts.nvml_backend)
        notes = [*opts.base_notes, *([gpu_note] if gpu_note else [])]
        devices = backend.devices() if backend else []
        self._where = store.where
        forwarder = await self._forwarding(stack, store)
        insights = InsightsRunner(
            store,
            store.where,
            opts.gpu_rate_usd_per_hour,
            notes,
            drops=drops,
            team_url=opts.forward.run_url if opts.forward is not None else None,
            evidence=EvidencePlanner(),
        )
        runs = RunService(
            store,
            self.registry,
            insights,
            devices,
            boot_id=self.boot_id,
            owner=f"{socket.gethostname()}:{opts.socket_dir}",
            default_gpu=devices[0] if opts.nvml_backend.startswith("replay:") and devices else None,
        )
        # 4. (with the counters) stop storing ended runs' late events; they stay
        # open in the database and the next daemon takes them up
        stack.push_async_callback(runs.close_tails)
        await runs.recover_at_startup()
        lifecycle = Lifecycle(runs, drops, opts.idle_exit_s, lambda: self._last_activity, self.stop)
        # 4. persist counters (after the housekeeping task that also persists them stopped)
        stack.push_async_callback(lifecycle.persist)

        # 3. stop samplers and periodic tasks, then store what they left
        host = HostSampler(run_pids=self.registry.pids)
        sinks = SampleSinks(
            store, drops, SecondRollups(devices, self.boot_id), self.boot_id, host.workers
        )
        stack.push_async_callback(sinks.drain)  # after the sampler threads' last ticks
        gpu = None
        if backend is not None:
            gpu = GpuSampler(
                backend, opts.sample_hz, sinks.gpu_sink(), slow_sink=sinks.gpu_slow_sink()
            )
        await stack.enter_async_context(gpu_sampler.running(gpu))
        retention = Retention(store, opts.raw_window_s, opts.comm_steps_kept, opts.comm_keep_every)
        db_switch = DbSwitch(opts.db, store, runs, self.db_lock, self.stop)
        await stack.enter_async_context(
            task("host", host.run(sinks.on_host_sample, opts.host_interval_s))
        )
        await stack.enter_async_context(task("lifecycle", lifecycle.run()))
        # the GPU-hours rows of runs this database held before it had them
        await stack.enter_async_context(task("backfill-costs", costs.backfill(store)))
        for name, interval_s, job in (
            ("prune-raw", retention.interval_s, retention.prune_raw),
            ("compact-kernels", retention.interval_s, retention.compact_kernels),
            ("prune-comm", retention.interval_s, retention.prune_comm),
            ("roll-steps", steprollup.ROLL_INTERVAL_S, retention.roll_steps),
            ("pack-steps", retention.interval_s, retention.pack_steps),
            ("roll-host", hostrollup.ROLL_INTERVAL_S, retention.roll_hosts),
            ("pack-samples", retention.interval_s, retention.pack_samples),
            ("watch-db", DB_CHECK_S, db_switch.check_periodic),
        ):
            await stack.enter_async_context(task(name, every(interval_s, job, name)))

        pull, router = sockets.bind()
        ingest = Ingest(pull, runs, store, drops, self.touch, on_workers=host.workers.add)
        # 2b. close the dashboard (after the control requests drained): live sockets get 1001
        dashboard = await self._dashboard(stack, store, devices, ingest, sinks, insights, forwarder)
        handlers = ControlHandlers(
            db=store.where,
            socket_dir=opts.socket_dir,
            runs=runs,
            ingest=ingest,
            db_switch=db_switch,
            drops=drops,
            notes=notes,
            flush_rollups=sinks.flush_rollups,
            gpu_status=partial(
                gpu_sampler.sampling_status, gpu, gpu_note, opts.nvml_backend, sinks.gpu_latest
            ),
            request_stop=self.stop,
            started_wall_ns=self.started_wall_ns,
            evidence=insights.evidence,
            exits_idle=opts.idle_exit_s > 0,
            dashboard_url=dashboard.url,
            dashboard_why_not=dashboard.why_not,
            forward_status=forwarder.describe if forwarder is not None else None,
            forward_server=opts.forward.server if opts.forward is not None else None,
        )
        name = "stop-when-drained"
        await stack.enter_async_context(
            task(name, every(STOP_CHECK_S, handlers.exit_when_drained, name))
        )
        control = ControlServer(router, handlers.table(), drops, self.touch)
        # 2. let in-flight requests finish
        stack.push_async_callback(control.drain, DRAIN_S)
        # 1. stop accepting
        await stack.enter_async_context(task("control", control.run()))
        await stack.enter_async_context(task("ingest", ingest.run()))

        stack.enter_context(stop_on_signals(self.stop))  # a second signal during shutdown kills
        stack.callback(log.info, "gpuprofd shutting down")

    async def _forwarding(self, stack: contextlib.AsyncExitStack, store: Store) -> Forwarder | None:
        """With ``--server``: every op stored also goes to the outbox, and the
        forwarder sends it (on *stack*: it stops before the store's last
        flush, then sends what that flush left for a few seconds)."""
        cfg = self.opts.forward
        if cfg is None:
            return None
        from gpuprofd.forward.forwarder import Forwarder

        store.forwarding = True
        forwarder = Forwarder(store, cfg, self.drops)
        # 5a. after the last flush: a short last send (the rest waits for the
        # next daemon or gpuprofctl drain)
        stack.push_async_callback(forwarder.last_send, LAST_SEND_S)
        await stack.enter_async_context(task("forward", forwarder.run()))
        name = "forward-limit"
        await stack.enter_async_context(
            task(name, every(FORWARD_LIMIT_S, forwarder.enforce_limit, name))
        )
        log.info("forwarding runs to %s", cfg.server)
        return forwarder

    async def _dashboard(
        self,
        stack: contextlib.AsyncExitStack,
        store: Store,
        devices: list[Any],
        ingest: Ingest,
        sinks: SampleSinks,
        insights: InsightsRunner,
        forwarder: Forwarder | None = None,
    ) -> Dashboard:
        """Serve the web app on ``opts.http`` (on *stack*); what runs are told of it.

        Raises:
            BadInputError: the address given cannot be bound.
        """
        if self.opts.http is None:
            return Dashboard(None, "gpuprofd was started with --http off")
        from gpuprofd.web.app import build_app, serving
        from gpuprofd.web.metrics import ForwardGauges, metrics_sources
        from gpuprofd.web.state import WebState

        def forward() -> ForwardGauges | None:
            got = forwarder.gauges() if forwarder is not None else None
            return None if got is None else ForwardGauges(**got)

        state = WebState(
            reader=store,
            devices=tuple(devices),
            live_run_ids=lambda: {r.run_id for r in self.registry.live.values()},
            boot_id=self.boot_id,
            live_summary=insights.live_summary,
        )
        sources = metrics_sources(
            registry=self.registry,
            gpu_latest=sinks.gpu_latest,
            drops=self.drops,
            store=store,
            ingest=ingest,
            insights=insights,
            forward=forward,
        )
        if self.opts.viewers is None:
            app = build_app(state, sources, loopback_only=True)
        else:  # the team server's login: sessions, CSRF, login limits in this database
            from gpuprofd.web.auth import Auth

            app = build_app(state, sources)
            guard = await Auth.create(self.opts.viewers, store)
            guard.install(app, api_key_paths=("/metrics",))
        served = await stack.enter_async_context(serving(app, self.opts.http))
        return Dashboard(served.url, None)


@dataclass(frozen=True)
class Dashboard:
    """The dashboard's URL as told to runs (hello) and ``gpuprofctl status``
    (ping), or why there is none."""

    url: str | None
    why_not: str | None = None
