"""GPU sampling: a fast loop at ``sample_hz`` and a slow loop (≤ 1 Hz), each in
its own thread, each on a deadline schedule.

The fast loop asks only the cheap NVML queries (:meth:`NvmlBackend.sample`,
1–9 µs a call on an H200); the slow loop the expensive ones
(:meth:`NvmlBackend.slow_sample`: energy ~3.9 ms, field values, GPM,
violation counters), so a slow query can never make the fast loop late. The
H200 fixture's own recorder put energy in every sample and reached ~68 Hz of
100 (``tests/fixtures/h200/README.md``): that is what this split avoids.

Deadline scheduling: tick *k* is due at ``start + k · period``. Late ticks
never shift the schedule (no drift) and never run back to back to catch up
(no burst): a tick that ends past the next slot's due time starts the slot
it is in at once and drops the slots it overran, counting them in
:attr:`LoopStats.missed_ticks`.

The threads hand immutable sample lists to the sinks, which in the daemon
pass them to the event loop (``call_soon_threadsafe``); nothing here touches
the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuprofd.sampling.nvml import GpuDevice, GpuSample, GpuSlowSample, NvmlBackend

log = logging.getLogger(__name__)

Sink = Callable[[int, list[GpuSample]], None]
"""Receives (mono_ns, samples of one fast tick), in the fast-loop thread."""

SlowSink = Callable[[int, list[GpuSlowSample]], None]
"""Receives (mono_ns, samples of one slow tick), in the slow-loop thread."""

DEFAULT_SAMPLE_HZ = 100.0
"""Fast-loop rate: the cheap queries cost 1–9 µs each (probe.json), so 100 Hz
is < 0.5 % of a core for 8 GPUs while catching 10 ms idle gaps."""

MAX_SLOW_HZ = 1.0
"""Slow-loop ceiling: its energy read alone costs ~3.9 ms per GPU (probe.json),
and GPM metrics need a window of about a second to be meaningful."""

Wait = Callable[[float], bool]
"""Sleeps up to *seconds*; returns True when the loop must stop."""


@dataclass(frozen=True)
class LoopStats:
    """What a loop achieved so far (an immutable snapshot)."""

    requested_hz: float
    ticks: int
    """Ticks run."""
    missed_ticks: int
    """Scheduled slots skipped because a tick overran them."""
    achieved_hz: float | None
    """Ticks per second between the first and the last tick's start."""
    tick_s_max: float
    """Longest tick, seconds."""
    cpu_s: float
    """CPU time the loop's thread spent (``time.thread_time``), seconds."""


class DeadlineLoop:
    """Calls *tick(mono_ns)* at *hz* on a deadline schedule until *wait* says stop.

    Args:
        hz: requested rate, ticks per second.
        tick: the work of one tick, given the tick's start (``clock`` ns).
        clock: monotonic nanoseconds (tests pass a fake clock).
        wait: sleeps and reports a stop request (a ``threading.Event.wait``).
        cpu_clock: the calling thread's CPU seconds (``time.thread_time``).
    """

    def __init__(
        self,
        hz: float,
        tick: Callable[[int], None],
        clock: Callable[[], int],
        wait: Wait,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        if not hz > 0:
            raise ValueError(f"sample rate must be > 0 Hz, got {hz}")
        self.hz = hz
        self.period_ns = max(1, round(1e9 / hz))
        self._tick, self._clock, self._wait, self._cpu_clock = tick, clock, wait, cpu_clock
        self._ticks = self._missed = 0
        self._first_ns: int | None = None
        self._last_ns = 0
        self._tick_ns_max = 0
        self._cpu_s = 0.0

    def run(self) -> None:
        """Run ticks until the stop request (blocking: call in the loop's thread)."""
        cpu0 = self._cpu_clock()
        start = self._clock()
        slot = 0
        while True:
            t0 = self._clock()
            self._tick(t0)
            t1 = self._clock()
            self._record(t0, t1, self._cpu_clock() - cpu0)
            current = (t1 - start) // self.period_ns  # the slot whose window t1 is in
            if current <= slot:  # on time: sleep until the next slot is due
                slot += 1
                delay_s = (start + slot * self.period_ns - t1) / 1e9
            else:  # overran: start the slot we are in now, drop the ones skipped
                self._missed += current - slot - 1
                slot = current
                delay_s = 0.0
            if self._wait(delay_s):
                return

    def _record(self, t0: int, t1: int, cpu_s: float) -> None:
        self._ticks += 1
        if self._first_ns is None:
            self._first_ns = t0
        self._last_ns = t0
        self._tick_ns_max = max(self._tick_ns_max, t1 - t0)
        self._cpu_s = cpu_s

    def stats(self) -> LoopStats:
        """A snapshot of the counters (safe to call from any thread)."""
        first, last, n = self._first_ns, self._last_ns, self._ticks
        achieved = (n - 1) / ((last - first) / 1e9) if first is not None and last > first else None
        return LoopStats(self.hz, n, self._missed, achieved, self._tick_ns_max / 1e9, self._cpu_s)


class GpuSampler:
    """Samples every device of *backend*: the cheap queries at *hz* and the
    expensive ones at *slow_hz*, each loop in its own thread, until :meth:`stop`.

    Args:
        backend: the NVML backend (real, replay or mock).
        hz: fast-loop rate, samples per second per GPU.
        sink: receives each fast tick's samples.
        clock: monotonic nanoseconds, for schedules and sample times.
        slow_sink: receives each slow tick's samples; without one the slow
            loop does not run (nobody would read what it paid for).
        slow_hz: slow-loop rate, at most :data:`MAX_SLOW_HZ`.
        wait: the loops' sleep; default: wait on the stop event.
    """

    def __init__(
        self,
        backend: NvmlBackend,
        hz: float,
        sink: Sink,
        clock: Callable[[], int] = time.monotonic_ns,
        slow_sink: SlowSink | None = None,
        slow_hz: float = MAX_SLOW_HZ,
        wait: Wait | None = None,
    ) -> None:
        if not 0 < slow_hz <= MAX_SLOW_HZ:
            raise ValueError(f"slow-loop rate must be in (0, {MAX_SLOW_HZ}] Hz, got {slow_hz}")
        self.backend = backend
        self.devices: list[GpuDevice] = backend.devices()
        self._sink = sink
        self._slow_sink = slow_sink
        self._failing: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        wait = wait or self._stop.wait
        self.fast = DeadlineLoop(hz, self._fast_tick, clock, wait)
        self.slow = DeadlineLoop(slow_hz, self._slow_tick, clock, wait)
        loops = [("gpuprofd-gpu", self.fast)]
        if slow_sink is not None:
            loops.append(("gpuprofd-gpu-slow", self.slow))
        self._threads = [
            threading.Thread(target=self._run, args=(loop,), name=name, daemon=True)
            for name, loop in loops
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def tick(self) -> list[GpuSample]:
        """Sample every device once (a failing device is skipped, not fatal)."""
        return self._each("sampling", self.backend.sample)

    def slow_tick(self) -> list[GpuSlowSample]:
        """Read every device's expensive queries once (failures skip the device)."""
        return self._each("slow sampling", self.backend.slow_sample)

    def _each(self, what: str, fn: Callable[[GpuDevice], Any]) -> list[Any]:
        """*fn* of every device; a device that raises (e.g. fell off the bus) is
        skipped, with its traceback logged once until it answers again (not
        100 times a second)."""
        out = []
        for dev in self.devices:
            try:
                out.append(fn(dev))
            except Exception:  # noqa: BLE001 - one GPU must not stop the others
                if (what, dev.index) not in self._failing:
                    self._failing.add((what, dev.index))
                    log.exception(
                        "%s GPU %d failed (logged once until it recovers)", what, dev.index
                    )
            else:
                self._failing.discard((what, dev.index))
        return out

    def _fast_tick(self, now_ns: int) -> None:
        samples = self.tick()
        if samples:
            self._sink(now_ns, samples)

    def _slow_tick(self, now_ns: int) -> None:
        samples = self.slow_tick()
        if samples and self._slow_sink is not None:
            self._slow_sink(now_ns, samples)

    def _run(self, loop: DeadlineLoop) -> None:
        try:
            loop.run()
        except RuntimeError:  # the sink's event loop closed during shutdown
            self._stop.set()

    def stats(self) -> dict[str, LoopStats]:
        """``{"fast": …, "slow": …}``: each loop's achieved rate and misses."""
        return {"fast": self.fast.stats(), "slow": self.slow.stats()}

    def stop(self) -> None:
        """Stop and join the threads (blocking; call via ``asyncio.to_thread``)."""
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=5)
        self.backend.close()


@contextlib.asynccontextmanager
async def running(sampler: GpuSampler | None) -> AsyncIterator[GpuSampler | None]:
    """*sampler*'s threads running for the context (None: no GPU, nothing to run).

    On exit the threads are stopped and joined off the event loop, the fast
    loop's achieved rate is logged, and the loop runs once more so the sinks
    the threads' last ticks queued (``call_soon_threadsafe``) have run.
    """
    if sampler is None:
        yield None
        return
    sampler.start()
    try:
        yield sampler
    finally:
        await asyncio.to_thread(sampler.stop)
        fast = sampler.stats()["fast"]
        log.info(
            "GPU fast loop: %d ticks, %.1f Hz of %.1f, %d slots missed",
            fast.ticks,
            fast.achieved_hz or 0.0,
            fast.requested_hz,
            fast.missed_ticks,
        )
        await asyncio.sleep(0)


def sampling_status(
    sampler: GpuSampler | None, why_off: str | None, backend: str, latest: Mapping[str, Any]
) -> dict[str, Any]:
    """The GPU loops' achieved rates so far (Hz, CPU seconds), or why there are none.

    Args:
        sampler: the running sampler, None when GPU metrics are off.
        why_off: why they are off (no NVML, no GPU), if known.
        backend: the backend's name as configured (``real``, ``mock``, ``replay:…``).
        latest: the newest sample per GPU UUID (its size is the GPUs reporting).
    """
    if sampler is None:
        return {"on": False, "why": why_off or "no NVML backend"}
    out: dict[str, Any] = {"on": True, "gpus": len(latest), "backend": backend}
    for name, st in sampler.stats().items():
        out[name] = {
            "requested_hz": st.requested_hz,
            "achieved_hz": st.achieved_hz,
            "ticks": st.ticks,
            "missed_ticks": st.missed_ticks,
            "cpu_s": st.cpu_s,
        }
    return out
