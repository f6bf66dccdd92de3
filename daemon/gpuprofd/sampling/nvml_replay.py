"""A fake ``pynvml`` that plays a recorded NVML trace, so the real backend's
code (:class:`gpuprofd.sampling.nvml.RealNvml`) runs unchanged on a machine with no GPU.

The trace format is the H200 fixture's ``nvml_trace.jsonl``: line 1 a header
(``phases`` with ``phase``/``t0``/``t1`` in ``time.monotonic()`` seconds), then
one JSON object per sample with ``t`` (seconds) and the values::

    util_gpu, util_mem (%), mem_used, mem_total (bytes), power_mW, temp_C,
    sm_MHz, reasons (clock-event bitmask), energy_mJ (cumulative),
    pcie_rx_KBps, pcie_tx_KBps (KB/s, every 10th row),
    gpm_sm_util, gpm_sm_occupancy, gpm_any_tensor_util, gpm_dram_bw_util (%,
    every 10th row)

Every query answers with the row current at the replay clock (the last row
with ``t`` ≤ now). The PCIe byte counters that ``nvmlDeviceGetFieldValues``
serves are synthesized by integrating the recorded KB/s (1 KB = 1000 bytes,
as the fixture's README reads 58,779,434 KB/s as 58.8 GB/s), 32-bit as the
H200's are (``probe.json``: ``NVML_VALUE_TYPE_UNSIGNED_INT``) unless
``wide_pcie_counters``. GPM metrics are the mean of the GPM rows between the
two GPM samples; GPM's PCIe metrics (MiB/s) the mean of the KB/s rows. What the trace lacks
(violation counters, MIG, other clocks) raises pynvml's
``NVMLError_NotSupported``, as a real GPU does for what it lacks.

The replay loops: past the trace's end it starts again, with the cumulative
counters (energy, PCIe bytes) carried on so they never go backwards.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from gpuprofd.sampling import nvml

REPLAY_UUID = "GPU-00000000-0000-0000-0000-0000000replay"
"""The replayed GPU's UUID when no ``probe.json`` lies beside the trace."""
REPLAY_NAME = "Replay GPU"

CALLS_KEPT = 10_000
"""How many recent calls :attr:`ReplayPynvml.calls` keeps (a daemon replays for days)."""

_GPM_COLUMNS = {
    nvml.GPM_SM_UTIL: "gpm_sm_util",
    nvml.GPM_SM_OCCUPANCY: "gpm_sm_occupancy",
    nvml.GPM_ANY_TENSOR_UTIL: "gpm_any_tensor_util",
    nvml.GPM_DRAM_BW_UTIL: "gpm_dram_bw_util",
}
_PCIE_COLUMNS = {nvml.FI_PCIE_RX_BYTES: "pcie_rx_KBps", nvml.FI_PCIE_TX_BYTES: "pcie_tx_KBps"}
#: GPM's PCIe metrics (MiB/s) and the KB/s column each is read from.
_GPM_PCIE_COLUMNS = {
    nvml.GPM_PCIE_RX_PER_SEC: "pcie_rx_KBps",
    nvml.GPM_PCIE_TX_PER_SEC: "pcie_tx_KBps",
}
_KBPS_PER_MIBPS = nvml.MIB / 1000.0
_VALUE_TYPE_UINT = 1  # NVML_VALUE_TYPE_UNSIGNED_INT: the H200's PCIe counters
_VALUE_TYPE_ULL = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


@dataclass(frozen=True)
class Trace:
    """A recorded trace: rows sorted by ``t`` (monotonic seconds) and the header."""

    rows: list[dict[str, Any]]
    header: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Trace:
        """Read a JSONL trace.

        Raises:
            OSError: unreadable file.
            ValueError: not JSON lines, or no sample rows with a ``t``.
        """
        objs = []
        for n, ln in enumerate(Path(path).read_text().splitlines(), 1):
            if not ln.strip():
                continue
            obj = json.loads(ln)
            if not isinstance(obj, dict):
                raise ValueError(f"line {n} is not a JSON object")
            objs.append(obj)
        header = objs[0] if objs and "t" not in objs[0] else {}
        # a NaN t would break the sort and the replay clock's arithmetic; true is no time
        rows = sorted((o for o in objs if _finite(o.get("t"))), key=lambda o: o["t"])
        if not rows:
            raise ValueError("no sample rows with a 't'")
        return cls(rows, header)

    @property
    def t_start(self) -> float:
        return float(self.rows[0]["t"])

    @property
    def duration_s(self) -> float:
        return float(self.rows[-1]["t"]) - self.t_start

    def phase(self, name: str) -> tuple[float, float]:
        """``(t0, t1)`` of the header's phase *name*, in trace seconds."""
        for p in self.header.get("phases", []):
            if p.get("phase") == name:
                return float(p["t0"]), float(p["t1"])
        raise KeyError(name)


class _Handle:
    """Device handle of the replayed GPU (index 0)."""

    index = 0


class _GpmSample:
    """What ``nvmlGpmSampleAlloc`` hands out: the trace time it was taken at."""

    t: float | None = None


class _GpmMetricsGet:
    """The fields of pynvml's ``c_nvmlGpmMetricsGet_t`` that the backend uses."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [
            SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
            for _ in range(pynvml.NVML_GPM_METRIC_MAX)
        ]


def _recorded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Record the call (name, thread) and charge its cost before answering."""

    def call(self: ReplayPynvml, *args: Any) -> Any:
        self.calls.append((fn.__name__, threading.current_thread().name))
        self._cost(fn.__name__)
        return fn(self, *args)

    call.__name__ = fn.__name__
    call.__doc__ = fn.__doc__
    return call


class ReplayPynvml:
    """A ``pynvml`` stand-in with one GPU that answers from a :class:`Trace`.

    Args:
        trace: the recording.
        clock: monotonic seconds; replay time is the trace's start plus the
            time since this object was made (modulo the trace's length).
        uuid, name: the device's identity (see :meth:`from_file`).
        cost: called with each pynvml function's name before it answers
            (tests make a query "cost" time on a fake clock).
    """

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = _GpmMetricsGet

    def __init__(
        self,
        trace: Trace,
        clock: Callable[[], float] = time.monotonic,
        uuid: str = REPLAY_UUID,
        name: str = REPLAY_NAME,
        cost: Callable[[str], None] | None = None,
        max_sm_mhz: int | None = None,
        power_limit_mw: int | None = None,
        wide_pcie_counters: bool = False,
    ) -> None:
        self.trace = trace
        self.wide_pcie_counters = wide_pcie_counters
        """Serve 64-bit PCIe byte counters (a GPU whose counters do not wrap)."""
        self.max_sm_mhz = max_sm_mhz
        """Max SM clock, MHz (probe.json's ``max_clock_sm_MHz``); None: not supported."""
        self.power_limit_mw = power_limit_mw
        """Enforced power limit, mW (probe.json's ``enforced_power_limit_mW``); None: not
        supported."""
        self.clock = clock
        self.device_uuid, self.device_name = uuid, name
        self.calls: deque[tuple[str, str]] = deque(maxlen=CALLS_KEPT)
        """(pynvml function, calling thread's name) of the latest calls, in order."""
        self._cost = cost or (lambda _name: None)
        self._t0 = clock()
        self._times = [float(r["t"]) for r in trace.rows]
        self._columns = set().union(*(r.keys() for r in trace.rows))
        self._counters = {
            fid: _integrate(trace.rows, col)
            for fid, col in _PCIE_COLUMNS.items()
            if col in self._columns
        }

    @classmethod
    def from_file(cls, path: Path, **kwargs: Any) -> ReplayPynvml:
        """Replay the trace at *path*; the GPU's name and UUID come from a
        ``probe.json`` beside it when there is one, else :data:`REPLAY_UUID`.

        Raises:
            OSError, ValueError: unreadable trace.
        """
        probe = _probe_identity(Path(path).with_name("probe.json"))
        kwargs.setdefault("uuid", probe.get("uuid", REPLAY_UUID))
        kwargs.setdefault("name", probe.get("name", REPLAY_NAME))
        if "max_clock_sm_MHz" in probe:
            kwargs.setdefault("max_sm_mhz", int(probe["max_clock_sm_MHz"]))
        if "enforced_power_limit_mW" in probe:
            kwargs.setdefault("power_limit_mw", int(probe["enforced_power_limit_mW"]))
        return cls(Trace.load(path), **kwargs)

    # --- the replay clock ---------------------------------------------------

    def _now(self) -> tuple[float, int]:
        """(trace time, how many times the trace has wrapped around)."""
        elapsed = max(0.0, self.clock() - self._t0)
        span = self.trace.duration_s
        loops = int(elapsed // span) if span > 0 else 0
        return self.trace.t_start + (elapsed - loops * span), loops

    def _row(self) -> dict[str, Any]:
        t, _ = self._now()
        return self.trace.rows[max(0, bisect.bisect_right(self._times, t) - 1)]

    def _value(self, column: str) -> Any:
        row = self._row()
        if row.get(column) is None:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return row[column]

    def _cumulative(self, value_at: Callable[[float], float]) -> int:
        """A counter that keeps growing across wrap-arounds of the replay."""
        t, loops = self._now()
        per_loop = value_at(float(self.trace.rows[-1]["t"])) - value_at(self.trace.t_start)
        return int(value_at(t) + loops * per_loop)

    # --- pynvml's API -------------------------------------------------------

    @_recorded
    def nvmlInit(self) -> None:
        """Nothing to initialise."""

    @_recorded
    def nvmlShutdown(self) -> None:
        """Nothing to release."""

    @_recorded
    def nvmlDeviceGetCount(self) -> int:
        return 1

    @_recorded
    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle()

    @_recorded
    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self.device_uuid

    @_recorded
    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self.device_name

    @_recorded
    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @_recorded
    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._value("util_gpu"), memory=self._value("util_mem"))

    @_recorded
    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:
        used, total = self._value("mem_used"), self._value("mem_total")
        return SimpleNamespace(used=used, total=total, free=total - used)

    @_recorded
    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        """Board power, mW."""
        return int(self._value("power_mW"))

    @_recorded
    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        """GPU core temperature, °C."""
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._value("temp_C"))

    @_recorded
    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        """SM clock, MHz (the trace records no other clock)."""
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._value("sm_MHz"))

    @_recorded
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        """The enforced power limit, mW, as the probe recorded it."""
        if self.power_limit_mw is None:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.power_limit_mw

    @_recorded
    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, clock_type: int) -> int:
        """Max SM clock, MHz, as the probe recorded it."""
        if clock_type != pynvml.NVML_CLOCK_SM or self.max_sm_mhz is None:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.max_sm_mhz

    @_recorded
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return int(self._value("reasons"))

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    @_recorded
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        """Energy since the driver loaded, mJ."""
        self._value("energy_mJ")  # NotSupported if the current row lacks it
        return self._cumulative(self._energy_at)

    @_recorded
    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: Iterable[Any]) -> list[Any]:
        """PCIe byte counters (synthesized, bytes); other fields are refused
        per value (``nvmlReturn`` NOT_SUPPORTED), as NVML does."""
        t, _ = self._now()
        out = []
        for fid in field_ids:
            fid = fid[0] if isinstance(fid, tuple) else fid
            counter = self._counters.get(fid)
            ret = pynvml.NVML_SUCCESS if counter else pynvml.NVML_ERROR_NOT_SUPPORTED
            value = self._cumulative(counter) if counter else 0
            wide = self.wide_pcie_counters
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=0,
                    timestamp=int(t * 1e6),
                    latencyUsec=0,
                    valueType=_VALUE_TYPE_ULL if wide else _VALUE_TYPE_UINT,
                    nvmlReturn=ret,
                    value=SimpleNamespace(ullVal=value)
                    if wide
                    else SimpleNamespace(uiVal=value % (1 << 32)),
                )
            )
        return out

    @_recorded
    def nvmlDeviceGetViolationStatus(self, handle: _Handle, policy: int) -> Any:
        raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @_recorded
    def nvmlDeviceGetPcieThroughput(self, handle: _Handle, counter: int) -> int:
        """KB/s, the last recorded value. Exists so that tests can prove the sampler
        never calls it (~21 ms on an H200) and the bench can show what it costs."""
        t, _ = self._now()
        vals = _window(self.trace.rows, "pcie_rx_KBps" if counter else "pcie_tx_KBps", t, t)
        if not vals:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(vals[0])

    @_recorded
    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> SimpleNamespace:
        cols = (*_GPM_COLUMNS.values(), *_GPM_PCIE_COLUMNS.values())
        supported = any(col in self._columns for col in cols)
        return SimpleNamespace(version=1, isSupportedDevice=int(supported))

    @_recorded
    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        return _GpmSample()

    @_recorded
    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        """Nothing to free."""

    @_recorded
    def nvmlGpmSampleGet(self, handle: _Handle, sample: _GpmSample) -> _GpmSample:
        sample.t, _ = self._now()
        return sample

    @_recorded
    def nvmlGpmMetricsGet(self, get: _GpmMetricsGet) -> _GpmMetricsGet:
        """Each metric: the mean of the trace's GPM rows between the samples
        (the last one before the second sample if none lies between)."""
        if get.sample1 is None or get.sample2 is None or get.sample2.t is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        t1, t2 = get.sample1.t or 0.0, get.sample2.t
        for m in get.metrics[: get.numMetrics]:
            col = _GPM_COLUMNS.get(m.metricId) or _GPM_PCIE_COLUMNS.get(m.metricId)
            vals = _window(self.trace.rows, col, t1, t2) if col else []
            m.nvmlReturn = pynvml.NVML_SUCCESS if vals else pynvml.NVML_ERROR_NOT_SUPPORTED
            m.value = sum(vals) / len(vals) if vals else 0.0
            if m.metricId in _GPM_PCIE_COLUMNS:
                m.value /= _KBPS_PER_MIBPS
        return get

    def _energy_at(self, t: float) -> float:
        i = max(0, bisect.bisect_right(self._times, t) - 1)
        while i > 0 and self.trace.rows[i].get("energy_mJ") is None:
            i -= 1
        return float(self.trace.rows[i].get("energy_mJ") or 0)


def _window(rows: list[dict[str, Any]], col: str, t1: float, t2: float) -> list[float]:
    """Values of *col* in rows with t1 < t ≤ t2, else the last one at or before t2."""
    inside = [float(r[col]) for r in rows if t1 < r["t"] <= t2 and _finite(r.get(col))]
    if inside:
        return inside
    before = [float(r[col]) for r in rows if r["t"] <= t2 and _finite(r.get(col))]
    return before[-1:]


def _finite(value: Any) -> bool:
    """A number that can be replayed: not NaN, infinite or a boolean (a NaN is a
    reading not taken)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integrate(rows: list[dict[str, Any]], col: str) -> Callable[[float], float]:
    """Bytes moved up to time t by a KB/s column held constant until its next
    reading (the synthesized ``NVML_FI_DEV_PCIE_COUNT_*_BYTES`` counter)."""
    points = [(float(r["t"]), float(r[col]) * 1000.0) for r in rows if _finite(r.get(col))]
    times = [t for t, _ in points]
    totals = [0.0]
    for (ta, rate), (tb, _) in zip(points, points[1:], strict=False):
        totals.append(totals[-1] + rate * (tb - ta))

    def at(t: float) -> float:
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return 0.0
        return totals[i] + points[i][1] * (t - points[i][0])

    return at


def _probe_identity(path: Path) -> Mapping[str, str]:
    """``{"uuid": …, "name": …, "max_clock_sm_MHz": …, "enforced_power_limit_mW": …}``
    from a probe.json (what it holds of them), or ``{}``."""
    try:
        calls = json.loads(path.read_text())["calls"]
        keys = ("uuid", "name", "max_clock_sm_MHz", "enforced_power_limit_mW")
        return {k: str(calls[k]["value"]) for k in keys if "value" in calls.get(k, {})}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
