"""The daemon's periodic passes: :func:`every`, the one loop they all run in,
and :class:`Retention`, the passes that keep the database small.

Retention runs every :data:`PRUNE_INTERVAL_S`, or every raw window if that is
shorter: raw GPU samples older than ``--raw-window`` are deleted (the
per-second rollups keep the whole run); continuous kernel windows are merged
as they age (:mod:`gpuprofd.storage.upkeep.kcompact`); per-bucket comm rows outside
each run's last ``--comm-steps-kept`` steps that are not every
``--comm-keep-every``-th step are deleted (:mod:`gpuprofd.storage.upkeep.commprune`;
bounded delete passes, each step's exposed comm stays in ``steps``); each
run's steps older than its last ``STEPS_RAW_KEPT`` are packed per block
(:mod:`gpuprofd.storage.upkeep.steppack`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn

from gpuprofd.storage.upkeep import (
    commprune,
    hostrollup,
    kcompact,
    samplepack,
    steppack,
    steprollup,
)
from gpuprofd.storage.writes import Store, runsdb

log = logging.getLogger(__name__)

#: How often retention runs at most, seconds.
PRUNE_INTERVAL_S = 60.0
#: How long raw GPU rows (fast and slow loop) are kept, seconds. 15 min of
#: 10 Hz rows is ~9k rows per GPU; older data lives on as rollups.
DEFAULT_RAW_WINDOW_S = 900.0


async def every(interval_s: float, job: Callable[[], Awaitable[object]], name: str) -> NoReturn:
    """Run *job* every *interval_s* seconds (the first pass after one
    interval) until cancelled.

    A pass that raises is logged with its traceback and counted in the log
    line, and the loop goes on: the next pass retries (a locked or briefly
    failing database must not end the daemon's upkeep for good).
    """
    failed = 0
    while True:
        await asyncio.sleep(interval_s)
        try:
            await job()
        except Exception:  # noqa: BLE001 - one failed pass must not end the loop
            failed += 1
            log.exception(
                "%s failed (%d failed pass(es) so far); retried in %.3g s", name, failed, interval_s
            )


class Retention:
    """The retention passes over *store* (see the module doc), each run by :func:`every`.

    Args:
        store: the daemon's store.
        raw_window_s: raw GPU rows and fine kernel windows older than this go, seconds.
        comm_steps_kept: per-bucket comm rows kept for each run's last this-many steps ...
        comm_keep_every: ... and for every this-many-th step.
        clock: monotonic nanoseconds (the samples' time base).
    """

    def __init__(
        self,
        store: Store,
        raw_window_s: float = DEFAULT_RAW_WINDOW_S,
        comm_steps_kept: int = commprune.COMM_STEPS_KEPT,
        comm_keep_every: int = commprune.COMM_KEEP_EVERY,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.store = store
        self.raw_window_s = raw_window_s
        self._comm = commprune.CommPruner(comm_steps_kept, comm_keep_every)
        self._clock = clock

    @property
    def interval_s(self) -> float:
        """Seconds between passes: :data:`PRUNE_INTERVAL_S`, or the raw window if shorter."""
        return min(PRUNE_INTERVAL_S, self.raw_window_s)

    async def prune_raw(self) -> None:
        """Queue the deletes of raw GPU rows older than the raw window."""
        cutoff_ns = self._clock() - int(self.raw_window_s * 1e9)
        for op in runsdb.prune_raw_gpu_ops(cutoff_ns):
            self.store.submit_nowait(op)

    async def compact_kernels(self) -> None:
        """Merge continuous kernel windows older than the raw window into coarser ones."""
        await kcompact.compact_once(self.store, self._clock(), self.raw_window_s)

    async def roll_steps(self) -> None:
        """Write the step rollups each run has pending (:mod:`.steprollup`)."""
        await steprollup.roll_pass(self.store)

    async def pack_steps(self) -> None:
        """Pack each run's older steps per block (:mod:`.steppack`)."""
        await steppack.pack_round(self.store)

    async def pack_samples(self) -> None:
        """Pack the older host and run CPU samples per block (:mod:`.samplepack`)."""
        await samplepack.pack_round(self.store)

    async def roll_hosts(self) -> None:
        """Write the host rollups each run has pending (:mod:`.hostrollup`)."""
        await hostrollup.roll_pass(self.store)

    async def prune_comm(self) -> None:
        """Delete per-bucket comm rows outside each run's kept steps."""
        passes = await self._comm.prune_round(self.store)
        if passes:
            log.debug("comm buckets pruned in %d pass(es)", passes)
