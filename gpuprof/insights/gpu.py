"""GPU rules from NVML samples: memory, clocks (thermal, power cap), copies,
PCIe, small batches and an idle GPU.

:func:`gpu_stats` folds the run's NVML samples into one :class:`GpuStats`
(pure, no NVML here); the rules read ``RunContext.gpu``. A reading that no
sample carried is None ("not available"), never 0, and a rule that needs it
stays silent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.base import Insight, RunContext, rule
from gpuprof.insights.compute import run_mfu

# NVML clock-event reason bits: the values of nvidia-ml-py's pynvml constants
# ``nvmlClocksEventReason*`` (nvml.h), checked against nvidia-ml-py 13.615.71.
# Copied, not imported: gpuprof/ must not need pynvml.
#: ``nvmlClocksEventReasonGpuIdle``: nothing runs, clocks parked. Not throttling.
REASON_GPU_IDLE = 0x1
#: ``nvmlClocksEventReasonSwPowerCap``: the driver lowers clocks to stay under
#: the power limit.
REASON_SW_POWER_CAP = 0x4
#: ``nvmlClocksEventReasonHwSlowdown``: hardware slowdown (clocks halved or
#: worse) for temperature, an external power brake or power draw too high.
REASON_HW_SLOWDOWN = 0x8
#: ``nvmlClocksEventReasonSwThermalSlowdown``: the driver lowers clocks for
#: GPU or memory temperature.
REASON_SW_THERMAL = 0x20
#: ``nvmlClocksEventReasonHwThermalSlowdown``: hardware thermal slowdown.
REASON_HW_THERMAL = 0x40
#: ``nvmlClocksEventReasonHwPowerBrakeSlowdown``: external power brake.
REASON_HW_POWER_BRAKE = 0x80
#: Reasons the thermal rule counts. HW slowdown is included because NVML lists
#: temperature among its causes; the rule also requires a hot GPU.
THERMAL_REASONS = REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_SLOWDOWN

#: NVML ``utilization.gpu`` (% of its averaging window, 1/6 s to 1 s, in which
#: any kernel or copy ran) at or below which a sample counts as idle. Not 0:
#: the H200 fixture's loader_stall (~1 ms of matmuls per 80 ms busy-wait)
#: reads 1-2 %, an idle GPU 0-1 %.
IDLE_UTIL_PCT = 5.0
#: NVML util at or above which a sample counts as busy (the H200 fixture's
#: saturated phases read 94-100 %).
BUSY_UTIL_PCT = 80.0
#: Share (0-1) of the samples a clock-lowering reason must cover to matter:
#: a cap held for a moment (a boost transient, a phase's tail) costs
#: well under a percent of the window's throughput.
MIN_REASON_SHARE = 0.10

#: Seed rule table: peak memory above 90 % of total is close to an OOM
#: (allocator fragmentation needs the rest).
MEMORY_PRESSURE_FRACTION = 0.90
#: Above this the next larger batch or a longer sequence will not fit.
MEMORY_PRESSURE_HIGH_FRACTION = 0.97
#: Share (0-1) of total GPU memory that torch's allocator cache (peak reserved
#: minus peak allocated) or the memory outside torch (NVML used minus reserved)
#: must reach to be named the cause of memory pressure: 1 - 0.90, so freeing
#: that part alone would bring the peak back under the rule's threshold.
MEMORY_CAUSE_FRACTION = 1.0 - MEMORY_PRESSURE_FRACTION
#: Seed rule table: 82 °C is where data-center GPUs start thermal slowdown
#: (H100/H200 "GPU slowdown temp" is ~87-90 °C in ``nvidia-smi -q``; 82 warns first).
THERMAL_TEMP_C = 82.0
#: Seed rule table: SM clock more than 15 % below its reference = throttling,
#: not normal boost variation (a few bins of 15 MHz).
THERMAL_CLOCK_DROP = 0.15
#: Power-cap clock deficit that is worth a finding: 5 % of SM clock is ~5 % of
#: a compute-bound step; below it the cap is boost-table noise.
POWER_CAP_CLOCK_DROP = 0.05
#: NVML util (mean over the window, %) that reads as "the GPU is busy" for the
#: copy rule: the fixture's copy phases read 94-99 %, launch-bound tiny
#: kernels 30 %.
COPY_UTIL_PCT = BUSY_UTIL_PCT
#: GPM SM activity (mean, %) below which no SM is doing work: one SM kept busy
#: alone is 1/132 = 0.76 % on an H200 (0.93 % on an A100's 108), and the
#: fixture's copy phases read exactly 0 %.
COPY_SM_UTIL_PCT = 0.5
#: Seed rule table: PCIe RX above 20 GB/s (a Gen4 x16 link is ~25 GB/s usable,
#: Gen5 ~50-60: the fixture's pinned H2D copies peaked at 60 GB/s).
PCIE_RX_BYTES_PER_S = 20e9
#: Seed rule table: SMs busy more than 60 % ...
SMALL_BATCH_SM_BUSY_PCT = 60.0
#: ... while MFU stays under 25 %: many small kernels keep the SMs occupied
#: without using the tensor cores well.
SMALL_BATCH_MFU = 0.25
#: Share (0-1) of samples with the GPU idle above which it waits on the host:
#: under 30 % idle is ordinary (optimizer step, logging); above it the GPU
#: waits for the input pipeline or the Python loop.
GPU_IDLE_SHARE = 0.30
#: Mean NVML util (%) from which a run counts as using its GPU at all: one
#: ~1 ms burst of kernels per 100 ms step. The H200 trace's loader_stall
#: phase (1 ms of matmuls per 80 ms wait) reads 1.3 % over whole seconds; its
#: idle_end phase, only the NVML window's lag, 0.06 %.
GPU_USED_UTIL_PCT = 1.0
#: Above this share the GPU is idle most of the run.
GPU_IDLE_SHARE_HIGH = 0.60


@dataclass
class MinMeanMax:
    """Count, sum, min and max of one reading; merges exactly (mean = sum / n)."""

    n: int = 0
    total: float = 0.0
    lo: float | None = None
    hi: float | None = None

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.n += 1
        self.total += value
        self.lo = value if self.lo is None or value < self.lo else self.lo
        self.hi = value if self.hi is None or value > self.hi else self.hi

    def merge(self, other: MinMeanMax) -> None:
        if not other.n:
            return
        self.n += other.n
        self.total += other.total
        self.lo = other.lo if self.lo is None else min(self.lo, other.lo)  # type: ignore[type-var]
        self.hi = other.hi if self.hi is None else max(self.hi, other.hi)  # type: ignore[type-var]

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    @classmethod
    def of(cls, n: int, mean_: float | None, lo: float | None, hi: float | None) -> MinMeanMax:
        """Rebuild from stored (count, mean, min, max); empty when *mean_* is None."""
        if mean_ is None or n <= 0:
            return cls()
        return cls(n, mean_ * n, lo if lo is not None else mean_, hi if hi is not None else mean_)


@dataclass
class GpuAccumulator:
    """Partial aggregate of one GPU's samples: what :class:`GpuStats` needs,
    kept so that two partials merge into exactly the partial of their union.

    The daemon keeps one per GPU per second (its ``gpu_rollups`` rows) and
    merges a run's seconds; :func:`gpu_stats` folds raw rows through the same
    code, so rollups and raw samples give the same verdicts.
    """

    util: MinMeanMax = field(default_factory=MinMeanMax)
    """NVML util %; ``util.n`` counts the samples (rows with a util reading)."""
    idle_n: int = 0
    """Samples with util ≤ :data:`IDLE_UTIL_PCT`."""
    mem_used: MinMeanMax = field(default_factory=MinMeanMax)
    """Used memory, bytes."""
    mem_total_bytes: int | None = None
    power_mw: MinMeanMax = field(default_factory=MinMeanMax)
    temp_c: MinMeanMax = field(default_factory=MinMeanMax)
    sm_mhz: MinMeanMax = field(default_factory=MinMeanMax)
    sm_active_max_mhz: float | None = None
    """Highest SM clock on a sample without the GpuIdle bit, MHz."""
    sm_limit_mhz: float | None = None
    """The GPU's max SM clock (``nvmlDeviceGetMaxClockInfo``), MHz, when known."""
    mem_util: MinMeanMax = field(default_factory=MinMeanMax)
    reasons_n: int = 0
    """Samples that carried a clock-event reason bitmask."""
    reasons_any: int = 0
    """OR of their bitmasks."""
    capped_n: int = 0
    """Samples busy (util ≥ :data:`BUSY_UTIL_PCT`) under the SW power cap."""
    capped_sm_mhz: MinMeanMax = field(default_factory=MinMeanMax)
    thermal_n: int = 0
    """Samples with a :data:`THERMAL_REASONS` bit."""
    thermal_sm_mhz: MinMeanMax = field(default_factory=MinMeanMax)
    pcie_rx_max_kbps: float | None = None
    pcie_tx_max_kbps: float | None = None
    gpm_sm_util: MinMeanMax = field(default_factory=MinMeanMax)
    gpm_sm_occupancy: MinMeanMax = field(default_factory=MinMeanMax)
    gpm_tensor_util: MinMeanMax = field(default_factory=MinMeanMax)
    gpm_dram_bw_util: MinMeanMax = field(default_factory=MinMeanMax)

    def add(self, row: Mapping[str, Any]) -> None:
        """Fold in one sample row (the keys :func:`gpu_stats` documents).
        Rows without ``util_gpu`` are skipped whole, as :func:`gpu_stats` does."""
        util = row.get("util_gpu")
        if util is None:
            return
        self.util.add(util)
        self.idle_n += util <= IDLE_UTIL_PCT
        self.mem_used.add(row.get("mem_used"))
        total = row.get("mem_total")
        if total is not None:
            self.mem_total_bytes = max(int(total), self.mem_total_bytes or 0)
        self.power_mw.add(row.get("power_mW"))
        self.temp_c.add(row.get("temp_C"))
        sm = row.get("sm_MHz")
        self.sm_mhz.add(sm)
        self.mem_util.add(row.get("util_mem"))
        reasons = row.get("reasons")
        bits = int(reasons or 0)
        if sm is not None and not bits & REASON_GPU_IDLE:
            self.sm_active_max_mhz = max(sm, self.sm_active_max_mhz or sm)
        if reasons is not None:
            self.reasons_n += 1
            self.reasons_any |= bits
        if bits & REASON_SW_POWER_CAP and util >= BUSY_UTIL_PCT:
            self.capped_n += 1
            self.capped_sm_mhz.add(sm)
        if bits & THERMAL_REASONS:
            self.thermal_n += 1
            self.thermal_sm_mhz.add(sm)
        self.add_slow(row)

    def add_slow(self, row: Mapping[str, Any]) -> None:
        """Fold in one slow-loop row's readings (``pcie_rx_KBps``/``pcie_tx_KBps``
        KB/s, ``gpm_*`` %); it needs no util reading."""
        rx, tx = row.get("pcie_rx_KBps"), row.get("pcie_tx_KBps")
        if rx is not None:
            self.pcie_rx_max_kbps = max(rx, self.pcie_rx_max_kbps or rx)
        if tx is not None:
            self.pcie_tx_max_kbps = max(tx, self.pcie_tx_max_kbps or tx)
        self.gpm_sm_util.add(row.get("gpm_sm_util"))
        self.gpm_sm_occupancy.add(row.get("gpm_sm_occupancy"))
        self.gpm_tensor_util.add(row.get("gpm_any_tensor_util"))
        self.gpm_dram_bw_util.add(row.get("gpm_dram_bw_util"))

    def merge(self, other: GpuAccumulator) -> None:
        """Fold in another partial (e.g. the next second's)."""
        for name in _MERGED_AGGS:
            getattr(self, name).merge(getattr(other, name))
        for name in ("idle_n", "reasons_n", "capped_n", "thermal_n"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reasons_any |= other.reasons_any
        for name in (
            "mem_total_bytes",
            "sm_active_max_mhz",
            "sm_limit_mhz",
            "pcie_rx_max_kbps",
            "pcie_tx_max_kbps",
        ):
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is not None and (mine is None or theirs > mine):
                setattr(self, name, theirs)

    def stats(self, max_sm_mhz: float | None = None) -> GpuStats | None:
        """The :class:`GpuStats` of everything folded in; None without a util reading.
        *max_sm_mhz*: the GPU's max SM clock (``nvmlDeviceGetMaxClockInfo``), if known."""
        n = self.util.n
        if not n:
            return None
        refs = [c for c in (max_sm_mhz, self.sm_limit_mhz, self.sm_active_max_mhz) if c is not None]
        has_reasons = self.reasons_n > 0
        return GpuStats(
            samples=n,
            util_mean_pct=self.util.mean,
            util_max_pct=self.util.hi,
            idle_share=self.idle_n / n,
            mem_used_max_bytes=int(self.mem_used.hi) if self.mem_used.n else None,
            mem_total_bytes=self.mem_total_bytes,
            power_max_mw=self.power_mw.hi,
            temp_max_c=self.temp_c.hi,
            sm_mhz_ref=max(refs) if refs else None,
            reasons_seen=self.reasons_any if has_reasons else None,
            power_capped_share=self.capped_n / n if has_reasons else None,
            sm_mhz_power_capped=self.capped_sm_mhz.mean if has_reasons else None,
            thermal_share=self.thermal_n / n if has_reasons else None,
            sm_mhz_thermal=self.thermal_sm_mhz.mean if has_reasons else None,
            pcie_rx_max_kbps=self.pcie_rx_max_kbps,
            pcie_tx_max_kbps=self.pcie_tx_max_kbps,
            gpm_sm_util_pct=self.gpm_sm_util.mean,
            gpm_sm_occupancy_pct=self.gpm_sm_occupancy.mean,
            gpm_tensor_util_pct=self.gpm_tensor_util.mean,
            gpm_dram_bw_util_pct=self.gpm_dram_bw_util.mean,
        )


_MERGED_AGGS = (
    "util",
    "mem_used",
    "power_mw",
    "temp_c",
    "sm_mhz",
    "mem_util",
    "capped_sm_mhz",
    "thermal_sm_mhz",
    "gpm_sm_util",
    "gpm_sm_occupancy",
    "gpm_tensor_util",
    "gpm_dram_bw_util",
)


def gpu_stats(
    samples: Sequence[Mapping[str, Any]], max_sm_mhz: float | None = None
) -> GpuStats | None:
    """Aggregate NVML sample rows (the keys of the H200 fixture's
    ``nvml_trace.jsonl``: ``util_gpu`` %, ``mem_used``/``mem_total`` bytes,
    ``power_mW``, ``temp_C``, ``sm_MHz``, ``reasons`` bitmask, ``util_mem`` %,
    and on slow-loop rows only ``pcie_rx_KBps``/``pcie_tx_KBps`` and ``gpm_*`` %).

    Pass the samples taken while the run was in steps. *max_sm_mhz* is the
    GPU's max SM clock (``nvmlDeviceGetMaxClockInfo``), if queried. None when
    no sample has a utilization reading.
    """
    acc = GpuAccumulator()
    for s in samples:
        acc.add(s)
    return acc.stats(max_sm_mhz)


def _clock_drop(ref_mhz: float | None, mhz: float | None) -> float | None:
    """Fractional SM clock deficit (0-1) of *mhz* against *ref_mhz*."""
    if ref_mhz is None or mhz is None or ref_mhz <= 0:
        return None
    return max(0.0, 1.0 - mhz / ref_mhz)


_MEMORY_HEADROOM = (
    "Little headroom is left: a longer sequence, a larger batch or allocator "
    "fragmentation ends in CUDA out-of-memory."
)
#: memory_pressure's fix per cause (see :func:`_memory_cause`); None: torch
#: did not report its allocator, so the cause is unknown.
_MEMORY_FIXES = {
    "allocator_cache": "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so the "
    "allocator grows segments instead of caching odd-sized blocks, or lower the batch size.",
    "outside_torch": "Check for other processes on this GPU (nvidia-smi) and for memory "
    "allocated outside torch's allocator (NCCL buffers, CuPy/JAX/TensorFlow in the process).",
    "tensors": "Use activation checkpointing (torch.utils.checkpoint), a smaller micro-batch "
    "with gradient accumulation, bf16 autocast, or shard optimizer state (ZeRO / FSDP).",
    None: "Use activation checkpointing, bf16 autocast, a smaller micro-batch with "
    "gradient accumulation, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
}


def _memory_cause(ctx: RunContext, used: int, total: int) -> tuple[str | None, str]:
    """(cause, detail sentence) of memory pressure, from NVML's peak *used* and
    *total* bytes and torch's peak allocated and reserved bytes.

    NVML used > torch reserved > torch allocated is the normal picture (CUDA
    context and other processes; the allocator's cache): the cause is the part
    that takes :data:`MEMORY_CAUSE_FRACTION` of the GPU, the cache first, then
    memory outside torch; else the tensors themselves. The peaks need not
    coincide in time, so each difference is floored at 0.
    """
    allocated, reserved = ctx.torch_peak_allocated_bytes, ctx.torch_peak_reserved_bytes
    if allocated is None or reserved is None:
        return None, ""
    cache, outside = max(0, reserved - allocated), max(0, used - reserved)
    split = (
        f"At their peaks torch's allocator reserved {reserved / 1e9:.1f} GB, of which "
        f"tensors took {allocated / 1e9:.1f} GB (the rest is its cache), and "
        f"{outside / 1e9:.1f} GB of NVML's used memory lay outside it (CUDA context, "
        "NCCL and cuBLAS workspaces, other processes). "
    )
    limit = MEMORY_CAUSE_FRACTION * total
    if cache >= limit and cache >= outside:
        return "allocator_cache", split + (
            f"The {cache / 1e9:.1f} GB of cached, unused blocks is fragmentation, not live tensors."
        )
    if outside >= limit:
        return "outside_torch", split + "Most of the pressure is not torch's tensors."
    return "tensors", split + (
        "Live tensors (activations, gradients, optimizer state) fill the GPU themselves."
    )


@rule("memory_pressure")
def memory_pressure(ctx: RunContext) -> Insight | None:
    """Fires when NVML's peak used memory > :data:`MEMORY_PRESSURE_FRACTION` of
    total. When the shim reported torch's allocator (peak allocated and
    reserved bytes), the detail splits the peak and the fix fits the cause:
    :func:`_memory_cause`."""
    g = ctx.gpu
    frac = g.mem_used_fraction if g else None
    if g is None or frac is None or frac <= MEMORY_PRESSURE_FRACTION:
        return None
    used, total = g.mem_used_max_bytes, g.mem_total_bytes
    cause, split = _memory_cause(ctx, used, total)
    evidence: dict[str, Any] = {
        "mem_used_fraction": round(frac, 4),
        "mem_used_max_bytes": used,
        "mem_total_bytes": total,
    }
    if cause is not None:
        evidence.update(
            torch_peak_allocated_bytes=ctx.torch_peak_allocated_bytes,
            torch_peak_reserved_bytes=ctx.torch_peak_reserved_bytes,
            cause=cause,
        )
    return Insight(
        rule="memory_pressure",
        severity="HIGH" if frac > MEMORY_PRESSURE_HIGH_FRACTION else "MED",
        title=f"GPU memory {frac:.0%} full at peak ({used / 1e9:.1f} of {total / 1e9:.1f} GB)",
        detail=f"{split}{_MEMORY_HEADROOM}" if split else _MEMORY_HEADROOM,
        fix=_MEMORY_FIXES[cause],
        evidence=evidence,
    )


@rule("thermal_throttling")
def thermal_throttling(ctx: RunContext) -> Insight | None:
    """Fires when peak temperature > :data:`THERMAL_TEMP_C` and, on at least
    :data:`MIN_REASON_SHARE` of samples, a :data:`THERMAL_REASONS` bit held the
    SM clock > :data:`THERMAL_CLOCK_DROP` below its reference (the idle bit is
    not throttling)."""
    g = ctx.gpu
    if g is None or g.temp_max_c is None or g.temp_max_c <= THERMAL_TEMP_C:
        return None
    if g.thermal_share is None or g.thermal_share < MIN_REASON_SHARE:
        return None
    drop = _clock_drop(g.sm_mhz_ref, g.sm_mhz_thermal)
    if drop is None or drop <= THERMAL_CLOCK_DROP:
        return None
    return Insight(
        rule="thermal_throttling",
        severity="HIGH",
        title=f"GPU thermal throttling: {g.temp_max_c:.0f} °C, SM clock {drop:.0%} below "
        f"{g.sm_mhz_ref:.0f} MHz",
        detail=f"A thermal slowdown reason was set on {g.thermal_share:.0%} of samples; "
        f"the SM clock averaged {g.sm_mhz_thermal:.0f} MHz meanwhile.",
        fix="Check airflow, fans and inlet temperature (nvidia-smi -q -d TEMPERATURE); "
        "a hot node slows every rank that waits on it.",
        evidence={
            "temp_max_c": g.temp_max_c,
            "sm_mhz_ref": g.sm_mhz_ref,
            "sm_mhz_thermal": round(g.sm_mhz_thermal, 1),
            "clock_drop": round(drop, 4),
            "thermal_share": round(g.thermal_share, 4),
        },
    )


@rule("power_capping")
def power_capping(ctx: RunContext) -> Insight | None:
    """Fires when, on at least :data:`MIN_REASON_SHARE` of samples, the GPU was
    busy (util ≥ :data:`BUSY_UTIL_PCT`) under the SW power cap with the SM
    clock > :data:`POWER_CAP_CLOCK_DROP` below its reference.

    The throughput cost is estimated as that clock deficit: exact for
    compute-bound kernels, an upper bound for memory-bound ones.
    """
    g = ctx.gpu
    if g is None or g.power_capped_share is None or g.power_capped_share < MIN_REASON_SHARE:
        return None
    drop = _clock_drop(g.sm_mhz_ref, g.sm_mhz_power_capped)
    if drop is None or drop <= POWER_CAP_CLOCK_DROP:
        return None
    power = f" at {g.power_max_mw / 1e3:.0f} W peak" if g.power_max_mw is not None else ""
    return Insight(
        rule="power_capping",
        # MED, not HIGH: at the default limit it is the chip's normal ceiling
        # (the H200 fixture's dense bf16 matmuls ran capped at ~1445 of 1980 MHz).
        severity="MED",
        title=f"Power cap holds the SM clock {drop:.0%} below {g.sm_mhz_ref:.0f} MHz "
        f"(est. up to {drop:.0%} of compute throughput)",
        detail=f"On {g.power_capped_share:.0%} of samples the GPU was busy and capped{power}; "
        f"the SM clock averaged {g.sm_mhz_power_capped:.0f} MHz. The cost is an estimate: "
        "compute-bound kernels slow in proportion to the clock, memory-bound ones less.",
        fix="Check the power limit (nvidia-smi -q -d POWER); if it is below the board's "
        "default, raise it (nvidia-smi -pl). At the default, this is the chip's normal "
        "ceiling for dense bf16 work.",
        evidence={
            "power_capped_share": round(g.power_capped_share, 4),
            "sm_mhz_ref": g.sm_mhz_ref,
            "sm_mhz_power_capped": round(g.sm_mhz_power_capped, 1),
            "est_throughput_loss": round(drop, 4),
            "power_max_mw": g.power_max_mw,
        },
    )


@rule("copy_bound_gpu")
def copy_bound_gpu(ctx: RunContext) -> Insight | None:
    """Fires when NVML util averages ≥ :data:`COPY_UTIL_PCT` while GPM SM
    activity averages < :data:`COPY_SM_UTIL_PCT`: NVML's "utilization" counts
    copy-engine time, so the busy GPU is moving bytes, not computing. Needs GPM."""
    g = ctx.gpu
    if g is None or g.gpm_sm_util_pct is None or g.util_mean_pct is None:
        return None
    if g.util_mean_pct < COPY_UTIL_PCT or g.gpm_sm_util_pct >= COPY_SM_UTIL_PCT:
        return None
    return Insight(
        rule="copy_bound_gpu",
        severity="HIGH",
        title=f"GPU reads {g.util_mean_pct:.0f}% utilized but its SMs are "
        f"{g.gpm_sm_util_pct:.1f}% active: it is copying, not computing",
        detail="NVML utilization counts any kernel or copy; GPM SM activity shows the "
        "compute units idle. Host↔device (or device↔device) copies fill the time.",
        fix="Keep tensors on the GPU between steps, use pin_memory=True with "
        ".to(device, non_blocking=True) to overlap copies with compute, and avoid "
        ".cpu()/.item() in the loop.",
        evidence={
            "util_mean_pct": round(g.util_mean_pct, 1),
            "gpm_sm_util_pct": round(g.gpm_sm_util_pct, 3),
            "pcie_rx_max_kbps": g.pcie_rx_max_kbps,
            "pcie_tx_max_kbps": g.pcie_tx_max_kbps,
        },
    )


@rule("pcie_saturation")
def pcie_saturation(ctx: RunContext) -> Insight | None:
    """Fires when peak PCIe RX > :data:`PCIE_RX_BYTES_PER_S` (NVML KB/s ×
    :data:`BYTES_PER_KB`)."""
    g = ctx.gpu
    rx = g.pcie_rx_max_bytes_per_s if g else None
    if rx is None or rx <= PCIE_RX_BYTES_PER_S:
        return None
    return Insight(
        rule="pcie_saturation",
        severity="MED",
        title=f"PCIe host→GPU traffic peaks at {rx / 1e9:.1f} GB/s",
        detail="The input data crosses PCIe at a rate near the link's limit (NVML "
        "PCIe throughput, KB/s × 1000).",
        fix="Move less per step: keep the dataset or its decoded form on the GPU, send "
        "uint8 instead of float32, decode on the GPU (DALI, nvJPEG).",
        evidence={
            "pcie_rx_max_bytes_per_s": round(rx),
            "pcie_rx_max_kbps": g.pcie_rx_max_kbps,
        },
    )


@rule("small_batch")
def small_batch(ctx: RunContext) -> Insight | None:
    """Fires when SMs are busy > :data:`SMALL_BATCH_SM_BUSY_PCT` % (GPM SM
    activity when sampled, else NVML util) while MFU < :data:`SMALL_BATCH_MFU`.
    Silent when MFU is unknown."""
    g = ctx.gpu
    if g is None:
        return None
    busy = g.gpm_sm_util_pct if g.gpm_sm_util_pct is not None else g.util_mean_pct
    source = "GPM SM activity" if g.gpm_sm_util_pct is not None else "NVML utilization"
    if busy is None or busy <= SMALL_BATCH_SM_BUSY_PCT:
        return None
    m = run_mfu(ctx)
    if m is None or m.mfu >= SMALL_BATCH_MFU:
        return None
    return Insight(
        rule="small_batch",
        severity="MED",
        title=f"SMs {busy:.0f}% busy but MFU only {m.mfu:.1%}: kernels too small to fill the GPU",
        detail=f"{source} says the GPU is occupied, yet it delivers "
        f"{m.achieved_tflops:.0f} of {m.peak_tflops:.0f} TFLOP/s: many small, "
        "low-intensity kernels.",
        fix="Raise the batch size (gradient accumulation keeps the optimizer batch), "
        "fuse ops with torch.compile, and use bf16 so matmuls hit the tensor cores.",
        evidence={"sm_busy_pct": round(busy, 1), "sm_busy_source": source, "mfu": round(m.mfu, 4)},
    )


@rule("gpu_idle_between_steps")
def gpu_idle_between_steps(ctx: RunContext) -> Insight | None:
    """Fires when the GPU is idle (util ≤ :data:`IDLE_UTIL_PCT`) on more than
    :data:`GPU_IDLE_SHARE` of the samples taken during the run's steps, and
    used the GPU (mean util ≥ :data:`GPU_USED_UTIL_PCT`: a GPU the run never
    used is not this problem).

    Idle share counts whole NVML windows with (almost) no kernel: time the
    GPU waits on the host between bursts of work. Busy-but-launch-bound GPUs
    (short kernels in every window) read low util, not idle, and do not fire.
    """
    g = ctx.gpu
    if g is None or g.idle_share is None or g.util_max_pct is None:
        return None
    used = g.util_mean_pct is not None and g.util_mean_pct >= GPU_USED_UTIL_PCT
    if not used or g.idle_share <= GPU_IDLE_SHARE:
        return None
    return Insight(
        rule="gpu_idle_between_steps",
        severity="HIGH" if g.idle_share > GPU_IDLE_SHARE_HIGH else "MED",
        title=f"GPU idle on {g.idle_share:.0%} of samples during the steps "
        f"(mean utilization {g.util_mean_pct:.0f}%)",
        detail=f"NVML utilization was ≤ {IDLE_UTIL_PCT:.0f}% in {g.idle_share:.0%} of "
        f"{g.samples} samples: the GPU waits on the host (data loading, Python work, "
        "synchronizing calls) between bursts of work.",
        fix="Overlap the host work with the GPU: DataLoader num_workers and "
        "pin_memory=True, prefetch the next batch, drop .item()/.cpu() syncs.",
        evidence={
            "idle_share": round(g.idle_share, 4),
            "util_mean_pct": round(g.util_mean_pct, 1),
            "samples": g.samples,
        },
    )


GPU_RULES = (
    "memory_pressure",
    "thermal_throttling",
    "power_capping",
    "copy_bound_gpu",
    "pcie_saturation",
    "small_batch",
    "gpu_idle_between_steps",
)
"""The rules of this module, by name."""
