"""NVML, wrapped once: device discovery and one fast-loop sample per GPU.

Backends:

- **real** — ``pynvml`` from ``nvidia-ml-py``. A missing library or a failed
  ``nvmlInit`` (no driver, no GPU) disables GPU sampling with one log line
  and a note for the user; never a traceback.
- **mock** — a clearly named fake ``"Mock GPU"`` with made-up numbers, used
  only when ``GPUPROF_NVML=mock`` asks for it (never as a silent fallback).

Each query returns ``None`` ("not available") when the device does not
support it or the query fails: one bad field never aborts a sample.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

log = logging.getLogger(__name__)

NO_GPU_NOTE = "no NVIDIA GPU found: GPU metrics skipped"


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML numbers it (index), with its ``GPU-…`` UUID and name."""

    index: int
    uuid: str
    name: str


@dataclass(frozen=True)
class GpuSample:
    """One fast-loop reading of one GPU; ``None`` fields are not available."""

    index: int
    uuid: str
    util_pct: float | None
    """GPU utilization over the driver's last window, 0-100 %."""
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_mw: int | None
    """Board power draw in milliwatts (mW)."""
    temp_c: int | None
    """GPU core temperature, °C."""
    sm_clock_mhz: int | None


class NvmlBackend(Protocol):
    name: str

    def devices(self) -> list[GpuDevice]: ...

    def sample(self, device: GpuDevice) -> GpuSample: ...

    def close(self) -> None: ...


def normalize_uuid(uuid: str | None) -> str | None:
    """``GPU-ABC…`` and ``abc…`` (torch's spelling) compare equal."""
    if not uuid:
        return None
    u = uuid.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def match_uuid(devices: list[GpuDevice], cuda_uuid: str | None) -> GpuDevice | None:
    """The device whose UUID is *cuda_uuid* (either spelling), if any."""
    want = normalize_uuid(cuda_uuid)
    if want is None:
        return None
    return next((d for d in devices if normalize_uuid(d.uuid) == want), None)


class RealNvml:
    """The real backend over an initialised ``pynvml`` module."""

    name = "real"

    def __init__(self, pynvml: ModuleType) -> None:
        self._nv = pynvml
        self._handles: dict[int, Any] = {}
        self._failed: set[str] = set()

    def devices(self) -> list[GpuDevice]:
        nv = self._nv
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            self._handles[i] = h
            out.append(GpuDevice(i, _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))))
        return out

    def _query(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML query; ``None`` if unsupported or failing."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            if not isinstance(exc, self._nv.NVMLError_NotSupported) and what not in self._failed:
                self._failed.add(what)
                log.info("NVML %s not available: %s", what, exc)
            return None

    def sample(self, device: GpuDevice) -> GpuSample:
        nv, h = self._nv, self._handles[device.index]
        util = self._query("utilization", nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._query("memory", nv.nvmlDeviceGetMemoryInfo, h)
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            util_pct=float(util.gpu) if util is not None else None,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            mem_total_bytes=int(mem.total) if mem is not None else None,
            power_mw=self._query("power", nv.nvmlDeviceGetPowerUsage, h),
            temp_c=self._query("temperature", nv.nvmlDeviceGetTemperature, h,
                               nv.NVML_TEMPERATURE_GPU),
            sm_clock_mhz=self._query("sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        )  # fmt: skip

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass


class MockNvml:
    """A fake GPU named "Mock GPU" with plausible, slowly varying numbers.
    Only for ``GPUPROF_NVML=mock``; nothing about it is measured."""

    name = "mock"
    DEVICE = GpuDevice(0, "GPU-00000000-0000-0000-0000-00000000m0c0", "Mock GPU")
    MEM_TOTAL_BYTES = 80 * 2**30

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock

    def devices(self) -> list[GpuDevice]:
        return [self.DEVICE]

    def sample(self, device: GpuDevice) -> GpuSample:
        wave = 0.5 + 0.5 * math.sin(self._clock() / 5.0)
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            util_pct=round(40 + 50 * wave, 1),
            mem_used_bytes=int(self.MEM_TOTAL_BYTES * (0.3 + 0.2 * wave)),
            mem_total_bytes=self.MEM_TOTAL_BYTES,
            power_mw=int(150_000 + 250_000 * wave),
            temp_c=int(45 + 20 * wave),
            sm_clock_mhz=1980,
        )

    def close(self) -> None:
        pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _import_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def open_backend(
    kind: str, importer: Callable[[], ModuleType] = _import_pynvml
) -> tuple[NvmlBackend | None, str | None]:
    """Open the backend *kind* (``"real"`` or ``"mock"``, see
    :func:`gpuprof.config.nvml_backend`).

    Returns:
        ``(backend, None)``, or ``(None, note)`` when GPU sampling is off;
        the note is logged once here and shown to users in summaries.
    """
    if kind == "mock":
        log.warning("GPUPROF_NVML=mock: GPU metrics come from a fake 'Mock GPU'")
        return MockNvml(), None
    try:
        nv = importer()
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, OSError: all mean "no GPU"
        log.info("%s (%s)", NO_GPU_NOTE, exc.__class__.__name__)
        return None, NO_GPU_NOTE
    backend = RealNvml(nv)
    try:
        if not backend.devices():
            backend.close()
            log.info(NO_GPU_NOTE)
            return None, NO_GPU_NOTE
    except nv.NVMLError as exc:
        log.info("%s (%s)", NO_GPU_NOTE, exc)
        return None, NO_GPU_NOTE
    return backend, None
