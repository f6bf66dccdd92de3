"""Samplers → store: the sinks the GPU and host samplers hand their samples
to, and the rollup backlog.

The GPU sampler threads call their sinks; each sink passes the samples to the
event loop (``call_soon_threadsafe``), so only the loop touches the store.
Every fast-loop sample feeds the per-second rollups (the whole run's GPU
record, :mod:`gpuprofd.sampling.rollup`) and the live view; raw rows are
stored at :data:`STORED_GPU_HZ` for the recent window only (pruned by
:mod:`gpuprofd.storage.upkeep.maintenance`). Rollup rows are never dropped while the store
queue is merely full: they wait in a bounded backlog.

A host sample's per-core CPU % is not stored: as JSON it is ~0.8 KB a row on
a 128-core host, ~130 MB a day at 2 Hz (over 10x the rest of the row), and
no rule reads it yet.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from gpuprofd.core.counters import DropCounter
from gpuprofd.sampling.gpu_sampler import Sink, SlowSink
from gpuprofd.sampling.host_sampler import HostSample, WorkerCpu
from gpuprofd.sampling.nvml import GpuSample, GpuSlowSample
from gpuprofd.sampling.rollup import SecondRollups
from gpuprofd.storage.writes import Store, runsdb

#: Raw GPU fast-loop rows stored per second per GPU, for the recent window
#: only: enough to zoom into the last minutes; every sample still feeds the rollups.
STORED_GPU_HZ = 10.0
#: Rollup rows held while the store queue is full: an hour of 8 GPUs.
ROLLUP_BACKLOG_ROWS = 8 * 3600


class SampleSinks:
    """Turns samples into store ops (see the module doc).

    Args:
        store: where the rows go.
        drops: counts the rollup rows a full backlog loses and the worker
            pids over the host sampler's caps.
        rollups: folds GPU samples into per-second rows.
        boot_id: this boot of the node, stored with host samples.
        workers: the host sampler's worker tracker (its ``dropped`` count is read).
        backlog_rows: rollup rows held while the store queue is full.
    """

    def __init__(
        self,
        store: Store,
        drops: DropCounter,
        rollups: SecondRollups,
        boot_id: str | None = None,
        workers: WorkerCpu | None = None,
        backlog_rows: int = ROLLUP_BACKLOG_ROWS,
    ) -> None:
        self.store = store
        self.drops = drops
        self.rollups = rollups
        self.boot_id = boot_id
        self.workers = workers
        self.gpu_latest: dict[str, GpuSample] = {}
        """The newest fast-loop sample per GPU UUID (every tick, stored or not)."""
        self.backlog: deque[tuple[Any, ...]] = deque(maxlen=backlog_rows)
        self._workers_dropped = 0

    def on_host_sample(self, s: HostSample) -> None:
        """Queue one host sample, its runs' CPU use and its workers' readings."""
        untracked = self.workers.dropped if self.workers is not None else 0
        if untracked > self._workers_dropped:  # worker pids over the caps: counted, not followed
            self.drops.add("workers_untracked", n=untracked - self._workers_dropped)
            self._workers_dropped = untracked
        self.store.submit_nowait(
            runsdb.host_sample_op(
                s.mono_ns,
                s.cpu_pct,
                s.cpu_count,
                s.disk_read_bps,
                s.disk_read_iops,
                s.page_cache_bytes,
                s.mem_total_bytes,
                s.swap_in_bps,
                self.boot_id,
            )
        )
        for run_id, cores in s.run_cpu_cores.items():
            self.store.submit_nowait(runsdb.run_cpu_op(run_id, s.mono_ns, cores))
        for w in s.worker_cpu:
            self.store.submit_nowait(runsdb.worker_cpu_op(w))

    def store_rollups(self, rows: list[tuple[Any, ...]]) -> None:
        """Queue rollup rows. They are the whole run's GPU record (one row per
        GPU per second), so when the store queue is full they wait in the
        backlog (the oldest lost and counted once it is full) instead of being dropped."""
        backlog, queue = self.backlog, self.store.queue
        while backlog and not queue.full():
            self.store.submit_nowait(runsdb.rollup_op(backlog.popleft()))
        for row in rows:
            if not backlog and not queue.full():
                self.store.submit_nowait(runsdb.rollup_op(row))
                continue
            if len(backlog) == backlog.maxlen:
                self.drops.add("rollup_backlog_full")  # the oldest row goes
            backlog.append(row)

    def flush_rollups(self) -> None:
        """Queue the open seconds' rows (before a summary reads a run's GPU
        record: a second split in two rows merges exactly)."""
        self.store_rollups(self.rollups.flush())

    async def drain(self) -> None:
        """At shutdown, after the samplers stopped: queue the open seconds and
        the whole backlog, waiting for queue room (the writer still runs)."""
        self.flush_rollups()
        while self.backlog:
            await self.store.submit(runsdb.rollup_op(self.backlog.popleft()))

    def gpu_sink(self) -> Sink:
        """The fast loop's sink; call on the event loop, which it hands samples to."""
        loop = asyncio.get_running_loop()
        min_gap_ns = int(1e9 / STORED_GPU_HZ)
        last_stored_ns = [0]

        def enqueue(mono_ns: int, samples: list[GpuSample]) -> None:
            self.gpu_latest.update((s.uuid, s) for s in samples)
            self.store_rollups(self.rollups.add(mono_ns, samples))
            if mono_ns - last_stored_ns[0] < min_gap_ns:
                return  # in the rollups and the live view; raw rows at STORED_GPU_HZ
            last_stored_ns[0] = mono_ns
            for s in samples:
                self.store.submit_nowait(runsdb.gpu_sample_op(mono_ns, s))

        return lambda mono_ns, samples: loop.call_soon_threadsafe(enqueue, mono_ns, samples)

    def gpu_slow_sink(self) -> SlowSink:
        """The slow loop's sink (energy, PCIe, GPM); call on the event loop."""
        loop = asyncio.get_running_loop()

        def keep(mono_ns: int, samples: list[GpuSlowSample]) -> None:
            self.store_rollups(self.rollups.add_slow(mono_ns, samples))
            for s in samples:
                self.store.submit_nowait(runsdb.gpu_slow_sample_op(mono_ns, s))

        return lambda mono_ns, samples: loop.call_soon_threadsafe(keep, mono_ns, samples)
