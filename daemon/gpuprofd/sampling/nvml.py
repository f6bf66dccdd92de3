"""NVML, wrapped once: device discovery, one fast-loop and one slow-loop
sample per GPU.

Backends:

- **real** — ``pynvml`` from ``nvidia-ml-py``. A missing library or a failed
  ``nvmlInit`` (no driver, no GPU) disables GPU sampling with one log line
  and a note for the user; never a traceback.
- **replay** — the real backend's code over a fake ``pynvml`` that plays a
  recorded trace (:mod:`gpuprofd.sampling.nvml_replay`), for ``GPUPROF_NVML=replay:PATH``.
- **mock** — a clearly named fake ``"Mock GPU"`` with made-up numbers, used
  only when ``GPUPROF_NVML=mock`` asks for it (never as a silent fallback).

Each query returns ``None`` ("not available") when the device does not
support it (``NVMLError_NotSupported``: MIG slices, fans on SXM boards,
NVLink on a single GPU, per-process utilization) or the query fails: one
bad field never aborts a sample, and "not available" is never reported as 0.

What each loop may ask is fixed by the cost of one call on an H200
(``tests/fixtures/h200/probe.json``): the fast loop only the 1–9 µs
queries (:data:`FAST_CALLS`); energy (~3,900 µs), field values (~450 µs),
GPM samples (~620 µs) and violation counters (~700–840 µs) only in the slow
loop (:data:`SLOW_CALLS`). ``nvmlDeviceGetPcieThroughput`` (~21,000 µs: it
blocks for a 20 ms window) is never called; PCIe bytes/s come from GPM's
PCIe metrics (the mean over the slow loop's interval), else from the
``NVML_FI_DEV_PCIE_COUNT_{RX,TX}_BYTES`` counters where they are 64-bit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

log = logging.getLogger(__name__)

NO_GPU_NOTE = "no NVIDIA GPU found: GPU metrics skipped"

FAST_CALLS = frozenset(
    {
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    }
)
"""The pynvml calls the fast loop may make: 1–9 µs each on an H200 (probe.json)."""

SLOW_CALLS = frozenset(
    {
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetViolationStatus",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
    }
)
"""The pynvml calls only the slow loop makes: energy ~3,900 µs, field values ~450 µs,
GPM sample ~620 µs, violation status ~700–840 µs per call on an H200 (probe.json)."""

#: Field ids of the PCIe byte counters (``NVML_FI_DEV_PCIE_COUNT_RX_BYTES`` /
#: ``_TX_BYTES`` in nvml.h / pynvml); cumulative bytes since the driver loaded.
FI_PCIE_RX_BYTES = 198
FI_PCIE_TX_BYTES = 197

#: GPM metric ids (``NVML_GPM_METRIC_*`` in pynvml): percentages 0-100 ...
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
#: ... and PCIe traffic, MiB/s, from / to the GPU.
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
GPM_METRICS = (
    GPM_SM_UTIL,
    GPM_SM_OCCUPANCY,
    GPM_ANY_TENSOR_UTIL,
    GPM_DRAM_BW_UTIL,
    GPM_PCIE_TX_PER_SEC,
    GPM_PCIE_RX_PER_SEC,
)
MIB = 1 << 20
#: ``NVML_VALUE_TYPE_*`` of a counter that does not wrap between two slow
#: ticks: unsigned long, unsigned long long, signed long long. The H200's PCIe
#: byte counters answer ``NVML_VALUE_TYPE_UNSIGNED_INT`` (probe.json): 32 bits
#: wrap every 4 GiB, 0.08 s of a 55 GB/s copy (seen on an H200, 2026-12-04:
#: 4.0 GB/s read at 1 Hz during 55.5 GB/s of copies), so they give no rate.
WIDE_VALUE_TYPES = frozenset({2, 3, 4})

#: ``NVML_PERF_POLICY_POWER`` / ``_THERMAL`` for ``nvmlDeviceGetViolationStatus``.
PERF_POLICY_POWER = 0
PERF_POLICY_THERMAL = 1

#: ``c_nvmlValue_t`` member per ``NVML_VALUE_TYPE_*`` (0 double … 6 unsigned short).
_VALUE_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML numbers it (index), with its ``GPU-…`` UUID and name.

    *mig_uuids* are the ``MIG-…`` UUIDs of its MIG slices when MIG mode is on
    (a process on a slice sees the slice's UUID, not the GPU's)."""

    index: int
    uuid: str
    name: str
    mig_uuids: tuple[str, ...] = ()
    max_sm_mhz: int | None = None
    """Max SM clock, MHz (``nvmlDeviceGetMaxClockInfo``; ~1.4 ms a call on the
    H200, so read once): the reference the clock-throttling rules measure from."""
    power_limit_mw: int | None = None
    """The power limit the driver enforces, mW (``nvmlDeviceGetEnforcedPowerLimit``,
    read once; 700,000 on the H200 probe): what the dashboard draws power against."""


@dataclass(frozen=True)
class GpuSample:
    """One fast-loop reading of one GPU; ``None`` fields are not available."""

    index: int
    uuid: str
    util_pct: float | None
    """GPU utilization over the driver's last window, 0-100 % (counts copy-engine
    time too: 94 % during pure host→device copies on the H200 trace)."""
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_mw: int | None
    """Board power draw in milliwatts (mW)."""
    temp_c: int | None
    """GPU core temperature, °C."""
    sm_clock_mhz: int | None
    """SM clock, MHz."""
    mem_util_pct: float | None = None
    """Memory-controller busy time over the driver's last window, 0-100 %."""
    clock_event_reasons: int | None = None
    """``nvmlClocksEventReason*`` bitmask: 0x1 GPU idle, 0x4 SW power cap,
    0x20 SW thermal slowdown, 0x40/0x80 HW thermal / power-brake slowdown."""


@dataclass(frozen=True)
class GpuSlowSample:
    """One slow-loop (≤ 1 Hz) reading of the expensive queries of one GPU.

    Rates are over the interval since this GPU's previous slow sample, so the
    first one has counters but no rates. ``None`` is "not available"."""

    index: int
    uuid: str
    energy_mj: int | None
    """Energy since the driver loaded, millijoules (mJ)."""
    energy_power_mw: float | None
    """Mean board power over the interval from the energy counter, mW."""
    pcie_rx_bytes_per_s: float | None
    """Host→device PCIe traffic, bytes/s (GPM's mean over the interval, else
    the 64-bit byte counters)."""
    pcie_tx_bytes_per_s: float | None
    """Device→host PCIe traffic, bytes/s."""
    gpm_sm_util_pct: float | None
    """GPM: SMs busy, 0-100 % (0 during pure copies, unlike ``util_pct``)."""
    gpm_sm_occupancy_pct: float | None
    """GPM: resident warps over the maximum, 0-100 %."""
    gpm_tensor_util_pct: float | None
    """GPM: any tensor-core pipe active, 0-100 %."""
    gpm_dram_bw_util_pct: float | None
    """GPM: DRAM bandwidth used over peak, 0-100 %."""
    power_violation_ns: int | None
    """Time clocks were held below target by the power cap, ns (cumulative)."""
    thermal_violation_ns: int | None
    """Time clocks were held below target by thermal limits, ns (cumulative)."""
    power_capped_pct: float | None = None
    """Share of the interval spent power-capped, 0-100 %."""
    thermal_capped_pct: float | None = None
    """Share of the interval spent thermally capped, 0-100 %."""


class NvmlBackend(Protocol):
    name: str

    def devices(self) -> list[GpuDevice]: ...

    def sample(self, device: GpuDevice) -> GpuSample: ...

    def slow_sample(self, device: GpuDevice) -> GpuSlowSample: ...

    def close(self) -> None: ...


def normalize_uuid(uuid: str | None) -> str | None:
    """The comparable form of a GPU or MIG UUID, whoever spelled it.

    ``GPU-ABC…`` (NVML), ``abc…`` (torch's ``props.uuid``) and ``GPU-abc…``
    (the shim's hello) compare equal; so do ``MIG-abc…`` (NVML) and the same
    hex with a ``GPU-`` prefix or none (what the shim makes of a MIG slice's
    16-byte CUDA UUID). Old-style ``MIG-GPU-<uuid>/<gi>/<ci>`` names keep
    their instance suffix, so they never equal the whole GPU's UUID.
    """
    if not uuid:
        return None
    u = uuid.strip().lower()
    if u.startswith("mig-gpu-"):
        return "mig:" + u[8:]
    return u[4:] if u.startswith(("gpu-", "mig-")) else u


def match_uuid(devices: Sequence[GpuDevice], cuda_uuid: str | None) -> GpuDevice | None:
    """The device whose UUID, or one of whose MIG slices' UUIDs, is *cuda_uuid*
    (any spelling, see :func:`normalize_uuid`); ``None`` if none is.

    Matching is by UUID, never by index: ``CUDA_VISIBLE_DEVICES=2,0`` makes
    NVML's GPU 2 the process's ``cuda:0``."""
    want = normalize_uuid(cuda_uuid)
    if want is None:
        return None
    for d in devices:
        if want in {normalize_uuid(u) for u in (d.uuid, *d.mig_uuids)}:
            return d
    return None


@dataclass
class _SlowState:
    """What one GPU's previous slow sample left for the next one's rates."""

    t_s: float | None = None
    energy_mj: int | None = None
    pcie: tuple[int | None, int | None, int | None] = (None, None, None)
    """(rx bytes, tx bytes, NVML timestamp µs) of the last field-value read."""
    pcie_counters: bool = True
    """False once the byte counters answered 32-bit (no rate): never asked again."""
    violation: tuple[Any, Any] = (None, None)
    gpm_supported: bool | None = None
    gpm_prev: Any = None
    gpm_next: Any = None


class RealNvml:
    """The real backend over an initialised ``pynvml`` module (or a fake one
    with the same names: the replay backend and tests pass their own).

    Args:
        pynvml: the module (``nvmlInit`` already called).
        clock: monotonic seconds, for the slow loop's rates.
        name: ``"real"``, or ``"replay"`` over a recorded trace.
    """

    def __init__(
        self,
        pynvml: ModuleType | Any,
        clock: Callable[[], float] = time.monotonic,
        name: str = "real",
    ) -> None:
        self._nv = pynvml
        self._clock = clock
        self.name = name
        self._handles: dict[int, Any] = {}
        self._slow: dict[int, _SlowState] = {}
        self._failed: set[str] = set()
        self._index_of: dict[int, int] = {}
        """id(handle) → GPU index, to say which GPU a failing query was about."""
        self._reasons_fn = getattr(
            pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None
        ) or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    def devices(self) -> list[GpuDevice]:
        nv = self._nv
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            try:  # a GPU that fell off the bus must not take the others' metrics with it
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid, name = _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))
            except nv.NVMLError as exc:
                if f"gpu{i}" not in self._failed:
                    self._failed.add(f"gpu{i}")
                    log.warning("NVML: GPU %d cannot be read (%s): not sampled", i, exc)
                continue
            self._handles[i] = h
            self._index_of[id(h)] = i
            max_sm = None
            if hasattr(nv, "NVML_CLOCK_SM"):
                max_sm = self._query(
                    "max_sm_clock",
                    getattr(nv, "nvmlDeviceGetMaxClockInfo", None),
                    h,
                    nv.NVML_CLOCK_SM,
                )
            limit = self._query(
                "power_limit", getattr(nv, "nvmlDeviceGetEnforcedPowerLimit", None), h
            )
            out.append(
                GpuDevice(
                    i,
                    uuid,
                    name,
                    self._mig_uuids(h),
                    int(max_sm) if max_sm else None,
                    int(limit) if limit else None,
                )
            )
        return out

    def _mig_uuids(self, h: Any) -> tuple[str, ...]:
        """UUIDs of the MIG slices of *h* if MIG mode is on, else ``()``."""
        nv = self._nv
        mode = self._query("mig_mode", getattr(nv, "nvmlDeviceGetMigMode", None), h)
        if not mode or not mode[0]:
            return ()
        out = []
        for k in range(self._query("mig_count", nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
            mh = self._query(
                "mig_handle", nv.nvmlDeviceGetMigDeviceHandleByIndex, h, k, quiet=True
            )  #   # empty slots raise NotFound
            uuid = self._query("mig_uuid", nv.nvmlDeviceGetUUID, mh) if mh is not None else None
            if uuid:
                out.append(_text(uuid))
        return tuple(out)

    def _query(
        self, what: str, fn: Callable[..., Any] | None, *args: Any, quiet: bool = False
    ) -> Any:
        """Call one NVML query; ``None`` if unsupported, missing or failing.

        A failure other than "not supported" is logged once per query kind
        and GPU (a second GPU lost later gets its own line)."""
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - NVMLError or a pynvml bug: never abort a sample
            unsupported = isinstance(exc, self._nv.NVMLError_NotSupported)
            gpu = self._index_of.get(id(args[0])) if args else None
            key = what if gpu is None else f"{what}@{gpu}"
            if not (unsupported or quiet) and key not in self._failed:
                self._failed.add(key)
                on = "" if gpu is None else f" on GPU {gpu}"
                log.info("NVML %s not available%s: %s", what, on, exc)
            return None

    def sample(self, device: GpuDevice) -> GpuSample:
        """The fast loop's reading: only the 1–9 µs queries of :data:`FAST_CALLS`."""
        nv, h = self._nv, self._handles[device.index]
        util = self._query("utilization", nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._query("memory", nv.nvmlDeviceGetMemoryInfo, h)
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            util_pct=_num(getattr(util, "gpu", None), float),
            mem_used_bytes=_num(getattr(mem, "used", None), int),
            mem_total_bytes=_num(getattr(mem, "total", None), int),
            power_mw=_num(self._query("power", nv.nvmlDeviceGetPowerUsage, h), int),
            temp_c=_num(
                self._query("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                int,
            ),
            sm_clock_mhz=_num(
                self._query("sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM), int
            ),
            mem_util_pct=_num(getattr(util, "memory", None), float),
            clock_event_reasons=_num(self._query("clock_event_reasons", self._reasons_fn, h), int),
        )

    def slow_sample(self, device: GpuDevice) -> GpuSlowSample:
        """The slow loop's reading: energy, PCIe byte counters, GPM, violations."""
        nv, h = self._nv, self._handles[device.index]
        st = self._slow.setdefault(device.index, _SlowState())
        now = self._clock()
        dt = now - st.t_s if st.t_s is not None and now > st.t_s else None
        energy = self._query("energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
        energy_mw = None
        if energy is not None and st.energy_mj is not None and dt and energy >= st.energy_mj:
            energy_mw = (energy - st.energy_mj) / dt  # mJ/s = mW
        gpm = self._gpm(h, st)
        rx_mib, tx_mib = gpm.get(GPM_PCIE_RX_PER_SEC), gpm.get(GPM_PCIE_TX_PER_SEC)
        if rx_mib is not None and tx_mib is not None:
            rx_bps, tx_bps = rx_mib * MIB, tx_mib * MIB
        else:
            rx_bps, tx_bps = self._pcie_rates(h, st, dt)
        power_v, thermal_v = (
            self._query("power_violation", nv.nvmlDeviceGetViolationStatus, h, PERF_POLICY_POWER),
            self._query(
                "thermal_violation", nv.nvmlDeviceGetViolationStatus, h, PERF_POLICY_THERMAL
            ),
        )
        sample = GpuSlowSample(
            index=device.index,
            uuid=device.uuid,
            energy_mj=energy,
            energy_power_mw=energy_mw,
            pcie_rx_bytes_per_s=rx_bps,
            pcie_tx_bytes_per_s=tx_bps,
            gpm_sm_util_pct=gpm.get(GPM_SM_UTIL),
            gpm_sm_occupancy_pct=gpm.get(GPM_SM_OCCUPANCY),
            gpm_tensor_util_pct=gpm.get(GPM_ANY_TENSOR_UTIL),
            gpm_dram_bw_util_pct=gpm.get(GPM_DRAM_BW_UTIL),
            power_violation_ns=_violation_ns(power_v),
            thermal_violation_ns=_violation_ns(thermal_v),
            power_capped_pct=_capped_pct(st.violation[0], power_v),
            thermal_capped_pct=_capped_pct(st.violation[1], thermal_v),
        )
        st.t_s, st.energy_mj, st.violation = now, energy, (power_v, thermal_v)
        return sample

    def _pcie_rates(
        self, h: Any, st: _SlowState, dt: float | None
    ) -> tuple[float | None, float | None]:
        """Bytes/s each way from the PCIe byte counters (one field-values call);
        (None, None) when they are 32-bit (:data:`WIDE_VALUE_TYPES`)."""
        if not st.pcie_counters:
            return None, None
        values = self._query(
            "pcie_counters",
            self._nv.nvmlDeviceGetFieldValues,
            h,
            [FI_PCIE_RX_BYTES, FI_PCIE_TX_BYTES],
        )
        if values is None:
            st.pcie = (None, None, None)
            return None, None
        if any(v.nvmlReturn == 0 and v.valueType not in WIDE_VALUE_TYPES for v in values):
            st.pcie_counters = False
            log.debug("the GPU's PCIe byte counters are 32-bit: PCIe rates from GPM only")
            return None, None
        rx, tx = (_field_value(v) for v in values)
        stamp = int(values[0].timestamp) or None
        prev_rx, prev_tx, prev_stamp = st.pcie
        st.pcie = (rx, tx, stamp)
        span = (stamp - prev_stamp) / 1e6 if stamp and prev_stamp and stamp > prev_stamp else dt
        return _rate(prev_rx, rx, span), _rate(prev_tx, tx, span)

    def _gpm(self, h: Any, st: _SlowState) -> dict[int, float | None]:
        """GPM metrics between the previous slow tick's GPM sample and this one."""
        nv = self._nv
        if st.gpm_supported is None:
            support = self._query("gpm", getattr(nv, "nvmlGpmQueryDeviceSupport", None), h)
            st.gpm_supported = bool(support is not None and support.isSupportedDevice)
            if st.gpm_supported:
                st.gpm_prev = self._query("gpm_alloc", nv.nvmlGpmSampleAlloc)
                st.gpm_next = self._query("gpm_alloc", nv.nvmlGpmSampleAlloc)
                st.gpm_supported = (
                    st.gpm_prev is not None
                    and st.gpm_next is not None
                    and self._query("gpm_sample", nv.nvmlGpmSampleGet, h, st.gpm_prev) is not None
                )
            return {}
        if (
            not st.gpm_supported
            or self._query("gpm_sample", nv.nvmlGpmSampleGet, h, st.gpm_next) is None
        ):
            return {}
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version, get.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRICS)
        get.sample1, get.sample2 = st.gpm_prev, st.gpm_next
        for i, metric in enumerate(GPM_METRICS):
            get.metrics[i].metricId = metric
        st.gpm_prev, st.gpm_next = st.gpm_next, st.gpm_prev
        if self._query("gpm_metrics", nv.nvmlGpmMetricsGet, get) is None:
            return {}
        return {
            m.metricId: (float(m.value) if m.nvmlReturn == 0 and math.isfinite(m.value) else None)
            for m in (get.metrics[i] for i in range(len(GPM_METRICS)))
        }

    def close(self) -> None:
        for st in self._slow.values():
            for s in (st.gpm_prev, st.gpm_next):
                if s is not None:
                    self._query("gpm_free", getattr(self._nv, "nvmlGpmSampleFree", None), s)
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass


def _num(value: Any, kind: type[int] | type[float]) -> Any:
    """*value* as *kind* when it is a finite number >= 0, else None: a NaN,
    infinite, negative or non-numeric reading (a fake or buggy pynvml, a
    replayed trace's NaN) is "not available" and costs only its own field."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
        if not math.isfinite(f) or f < 0:
            return None
        return kind(value) if kind is float or isinstance(value, int) else int(f)
    except (TypeError, ValueError, OverflowError):
        return None


def _field_value(v: Any) -> int | None:
    """The number in one ``c_nvmlFieldValue_t``, or None if NVML refused it."""
    if v.nvmlReturn != 0 or not 0 <= v.valueType < len(_VALUE_MEMBER):
        return None
    return int(getattr(v.value, _VALUE_MEMBER[v.valueType]))


def _rate(prev: int | None, cur: int | None, span_s: float | None) -> float | None:
    """Per-second rate of a cumulative counter; None across a reset or gap."""
    if prev is None or cur is None or not span_s or cur < prev:
        return None
    return (cur - prev) / span_s


def _violation_ns(v: Any) -> int | None:
    return int(v.violationTime) if v is not None else None


def _capped_pct(prev: Any, cur: Any) -> float | None:
    """Share of the time between two violation readings spent capped, 0-100 %.

    ``violationTime`` is in ns and ``referenceTime`` in µs (nvml.h)."""
    if prev is None or cur is None or cur.referenceTime <= prev.referenceTime:
        return None
    capped_ns = cur.violationTime - prev.violationTime
    if capped_ns < 0:
        return None
    return min(100.0, 100.0 * capped_ns / ((cur.referenceTime - prev.referenceTime) * 1000))


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

    def _wave(self) -> float:
        return 0.5 + 0.5 * math.sin(self._clock() / 5.0)

    def sample(self, device: GpuDevice) -> GpuSample:
        wave = self._wave()
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            util_pct=round(40 + 50 * wave, 1),
            mem_used_bytes=int(self.MEM_TOTAL_BYTES * (0.3 + 0.2 * wave)),
            mem_total_bytes=self.MEM_TOTAL_BYTES,
            power_mw=int(150_000 + 250_000 * wave),
            temp_c=int(45 + 20 * wave),
            sm_clock_mhz=1980,
            mem_util_pct=round(20 + 30 * wave, 1),
            clock_event_reasons=0,
        )

    def slow_sample(self, device: GpuDevice) -> GpuSlowSample:
        """Made-up GPM percentages; no counters (energy, PCIe, violations)."""
        wave = self._wave()
        return GpuSlowSample(
            index=device.index,
            uuid=device.uuid,
            energy_mj=None,
            energy_power_mw=None,
            pcie_rx_bytes_per_s=None,
            pcie_tx_bytes_per_s=None,
            gpm_sm_util_pct=round(35 + 50 * wave, 1),
            gpm_sm_occupancy_pct=round(20 + 30 * wave, 1),
            gpm_tensor_util_pct=round(30 + 40 * wave, 1),
            gpm_dram_bw_util_pct=round(10 + 20 * wave, 1),
            power_violation_ns=None,
            thermal_violation_ns=None,
        )

    def close(self) -> None:
        pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _checked(backend: RealNvml, nv: Any) -> tuple[NvmlBackend | None, str | None]:
    """*backend* if it lists at least one GPU, else off with the note."""
    try:
        if not backend.devices():
            backend.close()
            log.info(NO_GPU_NOTE)
            return None, NO_GPU_NOTE
    except nv.NVMLError as exc:
        log.info("%s (%s)", NO_GPU_NOTE, exc)
        return None, NO_GPU_NOTE
    return backend, None
