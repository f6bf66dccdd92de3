"""``gpuprofd serve``'s process: the store, the app, insights when a run's
end arrives, retention, until SIGTERM or SIGINT.

Stateless beyond its database: the cookie secret, the login counts and the
viewers' sessions are in it too, so replicas on one Postgres serve the same
data and sessions (a logout on one ends the session on all).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpuprofd.core.counters import DropCounter
from gpuprofd.core.errors import BadInputError
from gpuprofd.server.app import CHANGES, build_server_app
from gpuprofd.server.ingest_api import IngestLimits
from gpuprofd.server.notify import Listener, RunChanges
from gpuprofd.services.digest import Digest
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import logins, schema
from gpuprofd.storage.upkeep import (
    backlog,
    hostrollup,
    retention,
    samplepack,
    steppack,
    steprollup,
)
from gpuprofd.storage.url import StorageUrl
from gpuprofd.storage.writes import Applied, Store, costs
from gpuprofd.web.auth import Auth, AuthConfig
from gpuprofd.web.httplog import one_line_bad_requests

log = logging.getLogger(__name__)

#: How often retention runs, seconds (and once at start).
RETENTION_EVERY_S = 600.0
#: How often ingested runs' steps are rolled into blocks, seconds (a node's pace).
ROLL_EVERY_S = steprollup.ROLL_INTERVAL_S
#: Most wall seconds a round spends packing steps (s): half the period, so a
#: replica whose nodes send more than a round packs (1,000 8-GPU nodes send
#: ~16,000 steps a second) catches up and still rolls and ingests.
PACK_BUDGET_S = ROLL_EVERY_S / 2
#: Login counts older than this are forgotten (well past the rate window), seconds.
LOGINS_KEPT_S = 3600.0
SHUTDOWN_TIMEOUT_S = 2.0
#: Looks for a digest to send per period, and the longest wait between two, seconds.
DIGEST_LOOKS = 4
DIGEST_LOOK_MAX_S = 60.0
#: Postgres connections of one replica (besides its listener): the ingest
#: transactions of several nodes run at once, each on its own.
POOL_SIZE = 8


#: The cyclic collector's thresholds while serving (Python's are 700, 10, 10).
#: Ingest makes ~340 tracked objects a batch (decoded JSON, rows), almost
#: none in cycles, and short-lived but for the batches waiting for their
#: group: each scan of the youngest generation costs ~1.5-2 ms at 1,000
#: nodes, whether it holds 10,000 objects or 100,000 (those still alive are
#: what it walks). At 10,000 that is a scan every ~30 batches (~0.05-0.09 ms
#: of CPU a batch); at 100,000 one every ~300. At 700 (Python's) ~0.2 ms a
#: batch more (bench/server_ingest.py, docs/benchmarks.md).
GC_THRESHOLDS = (100_000, 20, 100)


def tune_gc() -> None:
    """Set :data:`GC_THRESHOLDS` and leave what is made by now (the
    modules) out of every later collection (``gc.freeze``): it lives as
    long as the process."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@dataclass(frozen=True)
class ServeOptions:
    """What ``gpuprofd serve`` was asked (see :mod:`gpuprofd.server.cli`)."""

    storage: StorageUrl
    host: str
    port: int
    auth: AuthConfig
    keep_days: float | None = None
    limits: IngestLimits = IngestLimits()
    gpu_rate_usd_per_hour: float | None = None
    #: --digest-webhook: where each period's digest goes (None: no digest)
    digest_url: str | None = None
    digest_every_s: int = 7 * 86400
    digest_format: str = "slack"


class Server:
    """The running role: :meth:`run` until :meth:`stop`."""

    def __init__(self, opts: ServeOptions) -> None:
        self.opts = opts
        self.drops = DropCounter()
        # Postgres: the writer, reads, and up to ~6 batches applied at once
        self.store = Store(opts.storage, self.drops, pool_size=POOL_SIZE)
        self.url: str | None = None
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ending: dict[int, asyncio.Lock] = {}
        self.changes = RunChanges()
        """Runs changed by any replica's ingest (Postgres ``LISTEN``; this one's on SQLite)."""
        self._listener: Listener | None = None

    def stop(self) -> None:
        self._stop.set()

    async def _after_batch(self, applied: Applied) -> None:
        """A committed batch: each run whose end it carried gets its insights
        and summary (in the background: the node's answer does not wait).
        On SQLite (one process) its runs are told to the watchers here; on
        Postgres the batch's NOTIFY reaches every replica's listener."""
        if self._listener is None:
            self.changes.tell(set(applied.run_ids))
        for run_id in applied.ended_run_ids:
            task = asyncio.create_task(self._finalize(run_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _finalize(self, run_id: int) -> None:
        lock = self._ending.setdefault(run_id, asyncio.Lock())
        try:
            async with lock:
                await self.runner.finalize(run_id, keep_sent=True)
            log.info("run %d ended: insights stored", run_id)
        except Exception:  # noqa: BLE001 - one run's rules must not stop the server
            log.exception("insights of run %d failed", run_id)
            self.drops.add("insights_failed")
        finally:
            if not lock.locked():
                self._ending.pop(run_id, None)

    async def _roll_steps(self) -> None:
        """The step and host rollup tiers of ingested runs, as a node keeps
        its own (:mod:`gpuprofd.storage.upkeep.steprollup`,
        :mod:`~gpuprofd.storage.upkeep.hostrollup`):
        whole-run charts of long runs read blocks, not every step or sample;
        and its older steps and samples packed (:mod:`~gpuprofd.storage.upkeep.steppack`,
        :mod:`~gpuprofd.storage.upkeep.samplepack`).
        Replicas may both roll: a block is written once (its key)."""
        while not self._stop.is_set():
            try:
                await steprollup.roll_pass(self.store)
                await hostrollup.roll_pass(self.store)
                for module in (steppack, samplepack):  # half the budget each
                    await backlog.pack_backlog(
                        module.pack_round,
                        self.store,
                        PACK_BUDGET_S / 2,
                        module.MAX_BLOCKS_PER_ROUND,
                    )
            except Exception:  # noqa: BLE001 - retry at the next round
                log.exception("step rollups failed; trying again in %.0f s", ROLL_EVERY_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), ROLL_EVERY_S)

    async def _retention(self) -> None:
        while not self._stop.is_set():
            try:
                now = time.time_ns()
                await logins.forget_old_logins(self.store, now - int(LOGINS_KEPT_S * 1e9))
                await logins.forget_ended_sessions(self.store, now)
                if self.opts.keep_days is not None:
                    cutoff = now - int(self.opts.keep_days * 86_400 * 1e9)
                    runs, rows = await retention.apply_retention(self.store, cutoff)
                    if runs:
                        log.info(
                            "retention: %d runs older than %g days deleted (and %d node rows)",
                            runs,
                            self.opts.keep_days,
                            rows,
                        )
            except Exception:  # noqa: BLE001 - retry at the next round
                log.exception("retention failed; trying again in %.0f s", RETENTION_EVERY_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), RETENTION_EVERY_S)

    async def _digests(self) -> None:
        """Each period's digest, sent once across replicas
        (:mod:`gpuprofd.services.digest`); looks :data:`DIGEST_LOOKS` times a period."""
        assert self.opts.digest_url is not None
        digest = Digest(
            self.store, self.opts.digest_url, self.opts.digest_every_s, self.opts.digest_format
        )
        every = min(DIGEST_LOOK_MAX_S, self.opts.digest_every_s / DIGEST_LOOKS)
        while not self._stop.is_set():
            try:
                await digest.tick()
            except Exception:  # noqa: BLE001 - retry at the next look
                log.exception("digest failed; trying again in %.0f s", every)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), every)

    async def run(self, ready: Callable[[str], None] | None = None) -> None:
        """Serve until stopped.

        Raises:
            DatabaseError: the database unreachable or not gpuprof's.
            BadInputError: the address cannot be bound.
        """
        opts = self.opts
        if opts.storage.path is not None:
            await asyncio.to_thread(schema.prepare, opts.storage.path)
        await self.store.open()
        self.store.start()
        runner: web.AppRunner | None = None
        if opts.storage.dsn is not None:
            self._listener = Listener(opts.storage, self.changes)
            self._listener.start()
        try:
            self.runner = InsightsRunner(
                self.store, opts.storage.display, opts.gpu_rate_usd_per_hour, drops=self.drops
            )
            guard = await Auth.create(opts.auth, self.store)
            app = build_server_app(self.store, guard, opts.limits, self._after_batch, self.changes)
            app[CHANGES] = self.changes
            one_line_bad_requests()
            # Bodies are inflated by the ingest handler itself, bounded (ingest_api).
            runner = web.AppRunner(
                app, access_log=None, auto_decompress=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
            )
            await runner.setup()
            try:
                await web.TCPSite(runner, opts.host, opts.port).start()
            except OSError as exc:
                raise BadInputError(
                    f"cannot listen on {opts.host}:{opts.port} ({exc.strerror or exc}): "
                    "pick another --http HOST:PORT"
                ) from None
            port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
            host = f"[{opts.host}]" if ":" in opts.host else opts.host
            self.url = f"http://{host}:{port}"
            log.info("team server on %s, storing in %s", self.url, opts.storage.display)
            if ready is not None:
                ready(self.url)
            keeper = asyncio.create_task(self._retention())
            roller = asyncio.create_task(self._roll_steps())
            loops = [keeper, roller, asyncio.create_task(costs.backfill(self.store))]
            if opts.digest_url is not None:
                loops.append(asyncio.create_task(self._digests()))
            await self._stop.wait()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
        finally:
            if runner is not None:
                await runner.cleanup()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._listener is not None:
                await self._listener.close()
            await self.store.close()


def run_server(opts: ServeOptions, ready: Callable[[str], None] | None = None) -> None:
    """Run the team server in this process until SIGTERM or SIGINT."""

    async def main() -> None:
        tune_gc()  # this process's: not for a Server run inside another program
        server = Server(opts)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        await server.run(ready)

    run_loop(main())


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run *main* on uvloop's event loop where it is installed (the
    ``postgres`` extra brings it: its sockets, callbacks and timers are C,
    and a replica's CPU goes to each request's reading and answering), else
    on asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - by what is installed
        asyncio.run(main)
        return
    uvloop.run(main)
