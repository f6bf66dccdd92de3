"""Host sampler: CPU use (all cores), disk read rate, and the CPU each live
run's process tree (the training process and its DataLoader workers) uses,
every 0.5 s, via psutil.

psutil calls run in a worker thread (``asyncio.to_thread``) so the event loop
never blocks on ``/proc``. psutil and the clock are injected for tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil as _psutil

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5
#: A process that exited, or one we may not read: skipped, not an error.
_GONE = (_psutil.NoSuchProcess, _psutil.AccessDenied)


@dataclass(frozen=True)
class HostSample:
    mono_ns: int
    cpu_pct: float
    """Mean CPU use over all cores since the previous sample, 0-100 %."""
    cpu_count: int
    disk_read_bps: float | None
    """Disk bytes read per second since the previous sample; None if unknown."""
    run_cpu_cores: Mapping[int, float] = field(default_factory=dict)
    """run id → CPU cores (1.0 = one core busy) its process tree used since the
    previous sample; processes first seen in this sample count from the next."""


class ProcessTreeCpu:
    """CPU use of each training process plus its children, in cores.

    Keeps one primed ``psutil.Process`` per pid (a new object's first
    ``cpu_percent()`` is a meaningless 0), re-primes a pid that was reused
    (``is_running`` compares creation times), follows DataLoader workers that
    respawn every epoch, and forgets processes that are gone.
    """

    def __init__(self, psutil: ModuleType | Any = _psutil) -> None:
        self._ps = psutil
        self._procs: dict[int, Any] = {}

    def _tree(self, pid: int) -> list[Any]:
        root = self._procs.get(pid)
        if root is None or not root.is_running():
            root = self._ps.Process(pid)
        return [root, *root.children(recursive=True)]

    def sample(self, pids: Mapping[int, int]) -> dict[int, float]:
        """Cores used per run id since the previous call; *pids* maps run id → pid.
        A run whose process is gone or not ours to read is left out."""
        seen: set[int] = set()
        out: dict[int, float] = {}
        for run_id, pid in pids.items():
            try:
                tree = self._tree(pid)
            except _GONE:
                continue
            cores = 0.0
            for proc in tree:
                known = self._procs.get(proc.pid)
                try:
                    if known is not None and known.is_running():
                        cores += known.cpu_percent(None) / 100.0
                    else:
                        proc.cpu_percent(None)  # prime
                        self._procs[proc.pid] = proc
                except _GONE:
                    continue
                seen.add(proc.pid)
            out[run_id] = cores
        for pid in set(self._procs) - seen:
            del self._procs[pid]
        return out


class HostSampler:
    """Turns psutil's cumulative counters into per-interval rates.

    The first :meth:`sample` call only primes the counters (psutil's first
    ``cpu_percent`` is a meaningless 0) and returns None.
    """

    def __init__(
        self,
        psutil: ModuleType | Any = _psutil,
        clock: Callable[[], int] = time.monotonic_ns,
        run_pids: Callable[[], Mapping[int, int]] = dict,
    ) -> None:
        self._ps = psutil
        self._clock = clock
        self._run_pids = run_pids
        """run id → pid of the live runs; read on the event loop, never in the thread."""
        self._trees = ProcessTreeCpu(psutil)
        self._primed = False
        self._last_read_bytes: int | None = None
        self._last_ns: int | None = None

    def _read_bytes(self) -> int | None:
        try:
            io = self._ps.disk_io_counters()
        except (OSError, RuntimeError):
            return None
        return int(io.read_bytes) if io is not None else None

    def sample(self, run_pids: Mapping[int, int] | None = None) -> HostSample | None:
        """Read the counters; None on the priming call (blocking: run in a thread).

        Args:
            run_pids: run id → pid of the runs whose process-tree CPU to measure.
        """
        now = self._clock()
        run_cores = self._trees.sample(run_pids or {})
        per_cpu = self._ps.cpu_percent(percpu=True)
        read_bytes = self._read_bytes()
        last_bytes, last_ns = self._last_read_bytes, self._last_ns
        self._last_read_bytes, self._last_ns = read_bytes, now
        if not self._primed:
            self._primed = True
            return None
        rate = None
        have_delta = read_bytes is not None and last_bytes is not None and last_ns is not None
        if have_delta and now > last_ns:
            rate = max(read_bytes - last_bytes, 0) / ((now - last_ns) / 1e9)
        cpu_count = len(per_cpu) or (self._ps.cpu_count() or 0)
        cpu = sum(per_cpu) / len(per_cpu) if per_cpu else 0.0
        return HostSample(now, cpu, cpu_count, rate, run_cores)

    async def run(
        self, sink: Callable[[HostSample], None], interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        """Sample every *interval_s* seconds until cancelled, passing each to *sink*."""
        while True:
            try:
                sample = await asyncio.to_thread(self.sample, dict(self._run_pids()))
            except Exception:  # noqa: BLE001 - a sampler hiccup must not stop sampling
                log.exception("host sample failed")
                sample = None
            if sample is not None:
                sink(sample)
            await asyncio.sleep(interval_s)
