"""GPU fast loop: one NVML sample per GPU at ``sample_hz``, in its own thread.

The thread hands immutable :class:`~gpuprofd.nvml.GpuSample` lists to the
event loop (``call_soon_threadsafe``); it never touches the store itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpuprofd.nvml import GpuDevice, GpuSample, NvmlBackend

log = logging.getLogger(__name__)

Sink = Callable[[int, list[GpuSample]], None]
"""Receives (mono_ns, samples of one tick), in the sampler thread."""


class GpuSampler:
    """Samples every device of *backend* at *hz* until :meth:`stop`."""

    def __init__(
        self,
        backend: NvmlBackend,
        hz: float,
        sink: Sink,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if hz <= 0:
            raise ValueError(f"sample rate must be > 0 Hz, got {hz}")
        self.backend = backend
        self.devices: list[GpuDevice] = backend.devices()
        self._period_s = 1.0 / hz
        self._sink = sink
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuprofd-gpu", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def tick(self) -> list[GpuSample]:
        """Sample every device once (a failing device is skipped, not fatal)."""
        out = []
        for dev in self.devices:
            try:
                out.append(self.backend.sample(dev))
            except Exception:  # noqa: BLE001 - e.g. GPU fell off the bus
                log.exception("sampling GPU %d failed", dev.index)
        return out

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            now_ns = self._clock()
            samples = self.tick()
            if samples:
                try:
                    self._sink(now_ns, samples)
                except RuntimeError:  # event loop closed during shutdown
                    return
            next_t += self._period_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: skip, don't burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def stop(self) -> None:
        """Stop and join the thread (blocking; call via ``asyncio.to_thread``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.backend.close()
