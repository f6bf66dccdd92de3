"""The aggregates the rules read from ``RunContext``: one GPU's NVML samples
(:class:`GpuStats`, folded by :func:`gpuprof.insights.gpu.gpu_stats`) and a
run's kernel windows (:class:`KernelStats`, folded by
:func:`gpuprof.insights.kernels.kernel_stats`).

Plain data below :mod:`gpuprof.insights.base` (whose ``RunContext`` holds
them) and the rule modules (which fold and read them), so the imports run one way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuprof.kernels import KernelAgg

#: NVML ``nvmlDeviceGetPcieThroughput`` reports KB/s with 1 KB = 1000 bytes
#: (the fixture's 58.8e6 KB/s mean is the 58.8 GB/s its README states).
BYTES_PER_KB = 1000

#: Kernels listed in ``KernelStats.top`` (and by ``gpuprofctl insights``).
TOP_KERNELS = 10


@dataclass(frozen=True)
class GpuStats:
    """One GPU's NVML samples over a window (the run's steps), aggregated.

    None means no sample carried that reading ("not available").
    """

    samples: int
    """Samples aggregated (rows with ``util_gpu``)."""
    util_mean_pct: float | None
    """Mean NVML ``utilization.gpu`` (0-100 %): share of time any kernel or copy ran."""
    util_max_pct: float | None
    idle_share: float | None
    """Share (0-1) of samples with util ≤ :data:`IDLE_UTIL_PCT`: whole NVML
    windows in which the GPU ran (almost) nothing."""
    mem_used_max_bytes: int | None
    mem_total_bytes: int | None
    power_max_mw: float | None
    """Peak board power, milliwatts (mW)."""
    temp_max_c: float | None
    """Peak GPU temperature, °C."""
    sm_mhz_ref: float | None
    """Reference SM clock, MHz: the GPU's max SM clock when given, else the
    highest SM clock seen on a sample not parked idle (GpuIdle bit clear)."""
    reasons_seen: int | None
    """OR of every sample's clock-event reason bits."""
    power_capped_share: float | None
    """Share (0-1) of samples both busy (util ≥ :data:`BUSY_UTIL_PCT`) and
    under the SW power cap."""
    sm_mhz_power_capped: float | None
    """Mean SM clock over those busy, power-capped samples, MHz."""
    thermal_share: float | None
    """Share (0-1) of samples with a :data:`THERMAL_REASONS` bit."""
    sm_mhz_thermal: float | None
    """Mean SM clock over the thermally slowed samples, MHz."""
    pcie_rx_max_kbps: float | None
    """Peak PCIe receive (host → GPU) rate, KB/s (1 KB = 1000 bytes)."""
    pcie_tx_max_kbps: float | None
    """Peak PCIe transmit (GPU → host) rate, KB/s."""
    gpm_sm_util_pct: float | None
    """Mean GPM SM activity (0-100 %): SMs × time with a warp resident."""
    gpm_sm_occupancy_pct: float | None
    gpm_tensor_util_pct: float | None
    """Mean GPM any-tensor-core activity (0-100 %)."""
    gpm_dram_bw_util_pct: float | None

    @property
    def mem_used_fraction(self) -> float | None:
        """Peak used / total memory (0-1)."""
        if self.mem_used_max_bytes is None or not self.mem_total_bytes:
            return None
        return self.mem_used_max_bytes / self.mem_total_bytes

    @property
    def pcie_rx_max_bytes_per_s(self) -> float | None:
        if self.pcie_rx_max_kbps is None:
            return None
        return self.pcie_rx_max_kbps * BYTES_PER_KB


@dataclass(frozen=True)
class KernelTotal:
    """One kernel name's totals over the run's windows."""

    name: str
    cls: str
    count: int
    total_ns: int
    share: float
    """Share (0-1) of the run's kernel device time."""

    @property
    def mean_us(self) -> float:
        """Mean duration of one launch, µs."""
        return self.total_ns / self.count / 1e3 if self.count else 0.0


@dataclass(frozen=True)
class KernelStats:
    """A run's kernel windows, aggregated (:func:`kernel_stats`).

    Device time is the sum of kernel (and copy / fill) durations; kernels
    running concurrently on several streams (NCCL beside compute) count
    each, so it can exceed wall time.
    """

    windows: int
    """Windows read (those of :attr:`source`)."""
    source: str
    """The windows' source (``continuous``, ``snapshot`` or ``nsys``)."""
    device_ns: int
    """Kernel device time over the windows, ns."""
    kernels: tuple[KernelTotal, ...]
    """Every kernel name (``(other)`` rows included), most device time first."""
    ops: tuple[KernelAgg, ...] = ()
    """Operator rows summed over the windows (``aten::bmm``: total and self device
    ns, FLOP), most device time first; empty when the source gave none."""
    class_share: Mapping[str, float] = field(default_factory=dict)
    """Share (0-1) of kernel device time per class (:data:`gpuprof.kernels.KERNEL_CLASSES`)."""
    series_unit: str = "window"
    """``"step"`` when every window named its steps (series are then ms per step,
    comparable between windows of different lengths), else ``"window"``."""
    series: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Per kernel (the :data:`SERIES_KERNELS` largest, ``(other)`` excluded): its
    device ms per :attr:`series_unit` in each window, in time order (0.0 where a
    window did not list it)."""
    device_series: tuple[float, ...] = ()
    """All kernels' device ms per :attr:`series_unit` in each window, in time order."""
    device_ms_per_step: tuple[float, ...] = ()
    """Kernel device ms per step, one per window that named its steps."""
    wall_ms_per_step: tuple[float, ...] = ()
    """The same windows' wall time (``t1 - t0``) per step, ms."""
    kernels_per_step: float | None = None
    """Median kernel launches per step over those windows; None without steps."""
    median_kernel_us: float | None = None
    """Median launch duration, µs: the launch-weighted median of each kernel
    name's mean duration (rows carry totals, not single launches)."""
    op_flops: float | None = None
    """FLOP the profiler attributed to operators over the windows (``with_flops``);
    None when no row carried FLOPs."""
    op_flops_per_step: float | None = None
    """:attr:`op_flops` per step over the windows that named their steps."""
    series_weights: tuple[float, ...] = ()
    """Steps in each window of :attr:`series` when :attr:`series_unit` is
    ``"step"`` (windows merged by the daemon cover many), else empty: the
    halves of :func:`kernel_drifts` are split by steps, not by window count."""
    window_last_step: tuple[int | None, ...] = ()
    """The last step each window of :attr:`series` listed (None: none listed):
    :func:`kernel_drifts` leaves out warm-up windows (below :data:`DRIFT_FIRST_STEP`)."""

    @property
    def top(self) -> tuple[KernelTotal, ...]:
        """The :data:`TOP_KERNELS` kernels with the most device time."""
        return self.kernels[:TOP_KERNELS]

    def share_of(self, pattern: re.Pattern[str]) -> float:
        """Share (0-1) of kernel device time in kernels whose name matches *pattern*."""
        return sum(k.share for k in self.kernels if pattern.search(k.name))
