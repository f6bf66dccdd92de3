"""Host sampler: CPU use (all cores) and disk read rate, every 0.5 s, via psutil.

psutil calls run in a worker thread (``asyncio.to_thread``) so the event loop
never blocks on ``/proc``. psutil and the clock are injected for tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil as _psutil

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5


@dataclass(frozen=True)
class HostSample:
    mono_ns: int
    cpu_pct: float
    """Mean CPU use over all cores since the previous sample, 0-100 %."""
    cpu_count: int
    disk_read_bps: float | None
    """Disk bytes read per second since the previous sample; None if unknown."""


class HostSampler:
    """Turns psutil's cumulative counters into per-interval rates.

    The first :meth:`sample` call only primes the counters (psutil's first
    ``cpu_percent`` is a meaningless 0) and returns None.
    """

    def __init__(
        self, psutil: ModuleType | Any = _psutil, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self._ps = psutil
        self._clock = clock
        self._primed = False
        self._last_read_bytes: int | None = None
        self._last_ns: int | None = None

    def _read_bytes(self) -> int | None:
        try:
            io = self._ps.disk_io_counters()
        except (OSError, RuntimeError):
            return None
        return int(io.read_bytes) if io is not None else None

    def sample(self) -> HostSample | None:
        """Read the counters; None on the priming call (blocking: run in a thread)."""
        now = self._clock()
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
        return HostSample(now, cpu, cpu_count, rate)

    async def run(
        self, sink: Callable[[HostSample], None], interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        """Sample every *interval_s* seconds until cancelled, passing each to *sink*."""
        while True:
            try:
                sample = await asyncio.to_thread(self.sample)
            except Exception:  # noqa: BLE001 - a sampler hiccup must not stop sampling
                log.exception("host sample failed")
                sample = None
            if sample is not None:
                sink(sample)
            await asyncio.sleep(interval_s)
