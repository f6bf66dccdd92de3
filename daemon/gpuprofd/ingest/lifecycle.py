"""The daemon's once-a-second housekeeping: lost runs, persisted counters,
live insights (every ~10 s) and the idle exit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.runservice import RunService
from gpuprofd.storage.upkeep import every
from gpuprofd.storage.writes import runsdb

log = logging.getLogger(__name__)

TICK_S = 1.0
#: Seconds between live insights passes over the running runs ...
LIVE_INSIGHTS_S = 10.0
#: ... or more: a pass takes at most this share of the time between passes,
#: so the daemon's CPU stays small beside training on a long run (a pass
#: over a run of 1M steps can take seconds on a 2-core box).
LIVE_INSIGHTS_MAX_SHARE = 0.05


class Lifecycle:
    """Periodic checks; calls *request_stop* when idle for *idle_exit_s* (0 = never)."""

    def __init__(
        self,
        runs: RunService,
        drops: DropCounter,
        idle_exit_s: float,
        last_activity: Callable[[], float],
        request_stop: Callable[[], None],
        tick_s: float = TICK_S,
        live_insights_s: float = LIVE_INSIGHTS_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runs = runs
        self.drops = drops
        self.idle_exit_s = idle_exit_s
        self.last_activity = last_activity
        self.request_stop = request_stop
        self.tick_s = tick_s
        self.live_insights_s = live_insights_s
        self._clock = clock
        self._next_live = clock() + live_insights_s

    async def run(self) -> None:
        """:meth:`tick` every *tick_s* seconds until cancelled; a failing tick is logged."""
        await every(self.tick_s, self.tick, "housekeeping")

    async def tick(self) -> None:
        await self.runs.check_lost()
        await self.runs.retry_ends()
        await self.persist()
        now = self._clock()
        if now >= self._next_live:
            self._next_live = now + self.live_insights_s  # kept if a pass raises
            for live in list(self.runs.registry.live.values()):
                await self.runs.insights.live(live.run_id)
            spent = self._clock() - now
            self._next_live = now + max(self.live_insights_s, spent / LIVE_INSIGHTS_MAX_SHARE)
        idle_s = now - self.last_activity()
        if self.idle_exit_s > 0 and not self.runs.registry.live and idle_s >= self.idle_exit_s:
            log.info("idle for %.0f s with no live runs: exiting", idle_s)
            self.request_stop()

    async def persist(self) -> None:
        """Queue the live runs' received counts and new drop counts."""
        await self.runs.persist_counts()
        await runsdb.add_drops(self.runs.store, self.drops.take_unpersisted())
