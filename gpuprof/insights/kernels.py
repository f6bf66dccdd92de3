"""Kernel rules: what the GPU spent its time on, from per-window kernel aggregates.

:func:`kernel_stats` folds a run's stored kernel windows (``kernels`` events
from the shim's ``torch.profiler`` snapshots or continuous aggregates, or an
``nsys-import``; rows of :class:`gpuprof.kernels.KernelAgg`) into one
:class:`KernelStats` (pure: the caller queries); the rules read
``RunContext.kernels`` and stay silent when it is None.

Thresholds were chosen against real traces: the H200 GPT with fused SDPA
(cuDNN attention) and with hand-written attention
(``tests/fixtures/h200/``), and the A100 NCCL traces
(``tests/fixtures/kineto-a100/``); the figures quoted below are what
:func:`gpuprof.kernels.aggregate_trace` measured on them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprof.insights.aggregates import KernelStats, KernelTotal
from gpuprof.insights.base import WARMUP_STEPS, Insight, RunContext, rule
from gpuprof.kernels import KERNEL_CLASSES, OTHER_ROW_NAME, KernelAgg, display_name
from gpuprof.stats import median

_NS_PER_MS = 1e6

#: Kernels whose per-window time is kept as a series (for ``kernel_drift``):
#: the run's largest by device time. A kernel below the 16th rarely holds
#: more than a few % of device time, too little to move a step by itself.
SERIES_KERNELS = 16
#: Which windows a run's statistics read when it has several sources, best
#: first: continuous aggregates cover the whole run evenly; snapshots repeat
#: part of it (counting both would double the time); an nsys import is a
#: separate capture.
SOURCE_PREFERENCE = ("continuous", "snapshot", "nsys")


def _as_agg(row: Any) -> KernelAgg:
    """A stored row as :class:`KernelAgg`: one already, a ``kernel_stats`` row
    mapping (``name``, ``kind``, ``cls``, ``count``, ``total_ns``, ``self_ns``,
    ``flops``), or a wire row list."""
    if isinstance(row, KernelAgg):
        return row
    if isinstance(row, Mapping):
        flops = row.get("flops")
        return KernelAgg(
            str(row["name"]),
            str(row["kind"]),
            str(row["cls"]),
            int(row.get("count") or 0),
            int(row.get("total_ns") or 0),
            int(row.get("self_ns") or 0),
            None if flops is None else float(flops),
        )
    return KernelAgg.from_wire(row)


def _weighted_median(pairs: Sequence[tuple[float, int]]) -> float | None:
    """Median of values each repeated its weight times."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(w for _, w in pairs)
    if not total:
        return None
    acc = 0
    for value, weight in pairs:
        acc += weight
        if 2 * acc >= total:
            return value
    return pairs[-1][0]


def kernel_stats(
    kernel_windows: Sequence[tuple[Mapping[str, Any], Sequence[Any]]],
) -> KernelStats | None:
    """Aggregate a run's stored kernel windows.

    Args:
        kernel_windows: ``(window, rows)`` pairs: *window* a mapping with
            ``t0``/``t1`` (ns, one clock), ``source`` (``"snapshot"``,
            ``"continuous"`` or ``"nsys"``) and ``steps`` (the step indices
            the window covered; empty or missing: unknown); *rows* its
            :class:`gpuprof.kernels.KernelAgg` rows (or ``kernel_stats`` row
            mappings, or wire rows). Only the windows of one source are read,
            the first of :data:`SOURCE_PREFERENCE` present.

    Returns:
        None when no window holds kernel time.
    """
    sources = {str(w.get("source") or "snapshot") for w, _ in kernel_windows}
    source = next((s for s in SOURCE_PREFERENCE if s in sources), min(sources, default=""))
    chosen = sorted(
        (
            (w, [_as_agg(r) for r in rows])
            for w, rows in kernel_windows
            if str(w.get("source") or "snapshot") == source
        ),
        key=lambda wr: wr[0].get("t0") or 0,
    )
    totals: dict[str, list[Any]] = {}  # name -> [cls, count, total_ns]
    ops: dict[str, list[Any]] = {}  # name -> [count, total, self, flops, cls]
    per_window: list[dict[str, int]] = []
    device_per_step: list[float] = []
    wall_per_step: list[float] = []
    launches_per_step: list[float] = []
    flops_in_stepped = 0.0
    steps_seen = 0
    for w, rows in chosen:
        by_name: dict[str, int] = {}
        n_steps = _n_steps(w)
        kernel_ns = launches = 0
        for r in rows:
            if r.kind == "kernel":
                t = totals.setdefault(r.name, [r.cls, 0, 0])
                t[1] += r.count
                t[2] += r.total_ns
                by_name[r.name] = by_name.get(r.name, 0) + r.total_ns
                kernel_ns += r.total_ns
                launches += r.count
            else:
                o = ops.setdefault(r.name, [0, 0, 0, None, r.cls])
                o[0] += r.count
                o[1] += r.total_ns
                o[2] += r.self_ns
                if r.flops is not None:
                    o[3] = (o[3] or 0.0) + r.flops
                    if n_steps:
                        flops_in_stepped += r.flops
        per_window.append(by_name)
        steps_seen += n_steps
        if n_steps and kernel_ns:
            device_per_step.append(kernel_ns / n_steps / _NS_PER_MS)
            wall_per_step.append((int(w["t1"]) - int(w["t0"])) / n_steps / _NS_PER_MS)
            launches_per_step.append(launches / n_steps)
    device_ns = sum(t[2] for t in totals.values())
    if not device_ns:
        return None
    kernels = tuple(
        sorted(
            (
                KernelTotal(name, cls, count, ns, ns / device_ns)
                for name, (cls, count, ns) in totals.items()
            ),
            key=lambda k: (-k.total_ns, k.name),
        )
    )
    by_class = dict.fromkeys(KERNEL_CLASSES, 0.0)
    for k in kernels:
        by_class[k.cls if k.cls in by_class else "other"] += k.share
    per_step = all(_n_steps(w) for w, _ in chosen)
    tracked = [k.name for k in kernels if k.name != OTHER_ROW_NAME][:SERIES_KERNELS]
    units = [_n_steps(w) if per_step else 1 for w, _ in chosen]
    series = {
        name: tuple(
            by_name.get(name, 0) / _NS_PER_MS / u
            for u, by_name in zip(units, per_window, strict=True)
        )
        for name in tracked
    }
    flops = [o[3] for o in ops.values() if o[3] is not None]
    return KernelStats(
        windows=len(chosen),
        source=source,
        device_ns=device_ns,
        kernels=kernels,
        ops=tuple(
            sorted(
                (KernelAgg(n, "op", k, c, t, s, f) for n, (c, t, s, f, k) in ops.items()),
                key=lambda o: (-o.total_ns, o.name),
            )
        ),
        class_share=by_class,
        series_unit="step" if per_step else "window",
        series=series,
        device_series=tuple(
            sum(b.values()) / _NS_PER_MS / u for u, b in zip(units, per_window, strict=True)
        ),
        device_ms_per_step=tuple(device_per_step),
        wall_ms_per_step=tuple(wall_per_step),
        kernels_per_step=median(launches_per_step) if launches_per_step else None,
        median_kernel_us=_weighted_median([(k.mean_us, k.count) for k in kernels]),
        op_flops=sum(flops) if flops else None,
        op_flops_per_step=flops_in_stepped / steps_seen if flops and steps_seen else None,
        series_weights=tuple(float(u) for u in units) if per_step else (),
        window_last_step=tuple(_last_step(w) for w, _ in chosen),
    )


def _last_step(w: Mapping[str, Any]) -> int | None:
    steps = [s for s in (w.get("steps") or ()) if type(s) is int]
    return max(steps) if steps else None


def _n_steps(w: Mapping[str, Any]) -> int:
    """Steps a window covered: its ``n_steps`` (a window merged by the
    daemon's compaction may store only the count), else its steps listed."""
    n = w.get("n_steps")
    return int(n) if n is not None else len(w.get("steps") or ())


# --------------------------------------------------------------------------
# sdpa_suboptimal
# --------------------------------------------------------------------------

#: Fused attention kernels: FlashAttention (``flash_fwd_kernel``, PyTorch's
#: ``pytorch_flash::``), memory-efficient attention (``fmha_cutlassF``,
#: ``efficient_attention``), cuDNN SDPA (``cudnn_generated_fort_native_sdpa_*``,
#: what the H200 fixture's SDPA trace ran), xFormers, FlexAttention
#: (``flex_attention``) and TensorRT/TE fused kernels (``fused_attn``).
FUSED_ATTENTION_RE = re.compile(
    r"flash|fmha|sdpa|efficient_attention|mem_eff|flex_attention|fused_attn|"
    r"fused_multihead_attention|xformers",
    re.IGNORECASE,
)
#: Operators that dispatch to a fused attention kernel (when kernel names are
#: opaque, e.g. renamed by a compiler).
FUSED_ATTENTION_OP_RE = re.compile(
    r"_scaled_dot_product_(flash|efficient|cudnn|fused)|_flash_attention|_efficient_attention|"
    r"flex_attention"
)
#: Softmax kernels: ``softmax_warp_forward/backward`` (PyTorch's
#: ``dim <= 1024`` path, what the hand-written attention trace ran),
#: ``cunn_SoftMaxForward*`` / ``cunn_SoftMaxBackward*`` and Triton's
#: ``triton_*softmax*``.
SOFTMAX_RE = re.compile(r"softmax", re.IGNORECASE)
#: Log-softmax (a classifier's cross-entropy, the ``LogSoftMax*Epilogue``
#: kernels in both H200 traces) is not attention; ``softmax_warp_*``'s fifth
#: template argument is ``is_log_softmax``.
_LOG_SOFTMAX_RE = re.compile(r"LogSoftMax|log_softmax", re.IGNORECASE)
_WARP_SOFTMAX_ARGS_RE = re.compile(r"softmax_warp_\w+<([^<>]*)>")
#: Matrix-multiply kernels: cuBLAS / cuBLASLt (``*gemm*``, Hopper's ``nvjet_*``,
#: ``sm90_xmma_*``), CUTLASS (``cutlass*``), Triton matmuls.
GEMM_RE = re.compile(r"gemm|nvjet|xmma|cutlass|matmul|bmm", re.IGNORECASE)
#: Share (0-1) of kernel time in (non-log) softmax at or above which softmax
#: is "hot". The hand-written attention trace spends 10.8 % there (forward
#: 4.7 %, backward 6.1 %: it softmaxes the T x T score matrix, T/d_head = 16x
#: the size of the activations); a softmax over logits or MoE router scores
#: is a fraction of a percent.
SOFTMAX_SHARE_MIN = 0.03
#: Share (0-1) of kernel time in matmul kernels at or above which a model's
#: matmuls are "hot" (the hand-written attention trace: 25 %, the SDPA trace
#: 44 %): softmax between matmuls, not softmax alone, is attention.
GEMM_SHARE_MIN = 0.10


def _is_log_softmax(name: str) -> bool:
    if _LOG_SOFTMAX_RE.search(name):
        return True
    m = _WARP_SOFTMAX_ARGS_RE.search(name)
    if m:
        args = [a.strip() for a in m.group(1).split(",")]
        return len(args) > 4 and args[4] == "true"
    return False


def softmax_kernels(stats: KernelStats) -> list[KernelTotal]:
    """The run's softmax kernels, log-softmax excluded, most time first."""
    return [k for k in stats.kernels if SOFTMAX_RE.search(k.name) and not _is_log_softmax(k.name)]


def has_fused_attention(stats: KernelStats) -> bool:
    """Whether any fused attention kernel (or an operator that runs one) ran."""
    return any(FUSED_ATTENTION_RE.search(k.name) for k in stats.kernels) or any(
        FUSED_ATTENTION_OP_RE.search(o.name) for o in stats.ops
    )


@rule("sdpa_suboptimal")
def sdpa_suboptimal(ctx: RunContext) -> Insight | None:
    """Fires when softmax kernels hold >= :data:`SOFTMAX_SHARE_MIN` and matmul
    kernels >= :data:`GEMM_SHARE_MIN` of kernel time and no fused attention
    kernel ran: attention written as ``q @ k.T``, mask, ``softmax``, ``@ v``."""
    k = ctx.kernels
    if k is None or has_fused_attention(k):
        return None
    soft = softmax_kernels(k)
    soft_share = sum(s.share for s in soft)
    gemm_share = k.share_of(GEMM_RE)
    if soft_share < SOFTMAX_SHARE_MIN or gemm_share < GEMM_SHARE_MIN:
        return None
    return Insight(
        rule="sdpa_suboptimal",
        severity="HIGH",
        title=f"Attention runs unfused: softmax kernels take {soft_share:.1%} of GPU time "
        "between matmuls, and no fused attention kernel ran",
        detail=f"Softmax ({display_name(soft[0].name, 60)} and {len(soft) - 1} more) holds "
        f"{soft_share:.1%} and matmul kernels {gemm_share:.1%} of kernel time; the score "
        "matrix is written, masked, softmaxed and read back through memory. On an H200 the "
        "same GPT took 27.0 ms per step this way and 11.1 ms with fused attention.",
        fix="Replace q @ k.transpose(-2, -1), masked_fill, softmax and @ v with "
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) (bf16/fp16 "
        "inputs pick the flash / cuDNN kernels).",
        evidence={
            "softmax_share": round(soft_share, 4),
            "gemm_share": round(gemm_share, 4),
            "softmax_kernels": [s.name for s in soft[:4]],
        },
    )


# --------------------------------------------------------------------------
# kernel_drift
# --------------------------------------------------------------------------

#: A kernel whose time per window grew more than 50 % between the first and
#: the second half of the run's windows: beyond window-to-window noise.
DRIFT_GROWTH = 0.50
#: Fewest windows to compare halves (two per half; one window is one sample).
MIN_DRIFT_WINDOWS = 4
#: Windows whose steps all come before this one are warm-up (the shim's
#: automatic snapshots of steps 0, 1 and 5; no continuous window starts
#: earlier): autotuning, lazy init and optimizer state creation run other
#: kernels there, so a kernel missing from them is not one that slowed later.
DRIFT_FIRST_STEP = 10
#: Smallest growth worth a finding, as a share (0-1) of the first half's mean
#: device time per window: a 3 µs kernel doubling is noise. The A100 DLRM
#: baseline's steps vary 69-92 ms of kernel time (±15 %) with no trend.
DRIFT_MIN_ADDED_SHARE = 0.05
#: Growth (share of first-half device time) above which drift is HIGH.
DRIFT_HIGH_ADDED_SHARE = 0.20

_DRIFT_FIX = {
    "comm": "Collectives slowed down: look for a straggler rank (the others wait inside the "
    "collective), network / NVLink contention from other jobs, or a changed bucket size; "
    "compare ranks' step times in gpuprofctl.",
    "memcpy": "Copies grew: check for tensors moved to the CPU and back (.item(), .cpu(), "
    "logging), pinned-memory exhaustion, or growing batches.",
}
_DRIFT_FIX_DEFAULT = (
    "Check whether its inputs grew (sequence length, padding, dynamic shapes), whether "
    "clocks dropped (thermal or power rules), and whether the code path changed mid-run."
)


@dataclass(frozen=True)
class Drift:
    """One kernel's growth between the halves of a run's windows (ms per unit)."""

    name: str
    cls: str
    first_ms: float
    second_ms: float
    baseline_device_ms: float
    """Mean kernel device ms per unit over the first half (all kernels)."""

    @property
    def added_ms(self) -> float:
        return self.second_ms - self.first_ms

    @property
    def growth(self) -> float:
        return self.second_ms / self.first_ms - 1.0


def kernel_drifts(k: KernelStats) -> list[Drift]:
    """Kernels of the series whose mean time per unit grew > :data:`DRIFT_GROWTH`
    from the first to the second half of the windows (the middle window of an
    odd count in neither) by >= :data:`DRIFT_MIN_ADDED_SHARE` of the first
    half's device time, most time added first. A kernel absent from the first
    half is not drift (an evaluation pass, a checkpoint save). Warm-up windows
    (all their steps before :data:`DRIFT_FIRST_STEP`) are left out."""
    last = k.window_last_step if len(k.window_last_step) == k.windows else (None,) * k.windows
    keep = [i for i, s in enumerate(last) if s is None or s >= DRIFT_FIRST_STEP]
    n = len(keep)
    if n < MIN_DRIFT_WINDOWS or not k.series:
        return []
    weights = [k.series_weights[i] for i in keep] if len(k.series_weights) == k.windows else []
    first, second = ([(keep[j], wj) for j, wj in part] for part in _halves(n, weights))
    if not first or not second:
        return []
    base = _weighted_mean(k.device_series, first)
    found = []
    cls = {kt.name: kt.cls for kt in k.kernels}
    for name, s in k.series.items():
        a, b = _weighted_mean(s, first), _weighted_mean(s, second)
        if a > 0 and b > a * (1 + DRIFT_GROWTH) and b - a >= DRIFT_MIN_ADDED_SHARE * base:
            found.append(Drift(name, cls.get(name, "compute"), a, b, base))
    return sorted(found, key=lambda d: -d.added_ms)


def _halves(
    n: int, weights: Sequence[float]
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(index, weight) of the windows in the first and second half of *n*
    windows by cumulative *weight* (steps; empty: 1 each): a window wholly
    before the midpoint is in the first, wholly after it in the second, one
    across it in neither (equal weights: the middle window of an odd count)."""
    w = list(weights) if len(weights) == n else [1.0] * n
    mid = sum(w) / 2
    first, second, at = [], [], 0.0
    for i, wi in enumerate(w):
        if at + wi <= mid:
            first.append((i, wi))
        elif at >= mid:
            second.append((i, wi))
        at += wi
    return first, second


def _weighted_mean(series: Sequence[float], part: Sequence[tuple[int, float]]) -> float:
    """Mean of *series* over *part*'s windows weighted by their steps: ms per step."""
    total = sum(wi for _, wi in part)
    return sum(series[i] * wi for i, wi in part) / total if total else 0.0


@rule("kernel_drift")
def kernel_drift(ctx: RunContext) -> Insight | None:
    """Fires when a kernel's time per window (per step when windows name their
    steps) grew > :data:`DRIFT_GROWTH` between the first and second half of the
    run's windows; names the kernel and the ms it added."""
    if ctx.kernels is None:
        return None
    drifts = kernel_drifts(ctx.kernels)
    if not drifts:
        return None
    d = drifts[0]
    unit = ctx.kernels.series_unit
    others = ", ".join(
        f"{display_name(o.name, 60)} +{o.added_ms:.1f} ms (+{o.growth:.0%})" for o in drifts[1:4]
    )
    others = f" Also grew: {others}." if others else ""
    return Insight(
        rule="kernel_drift",
        severity="HIGH" if d.added_ms >= DRIFT_HIGH_ADDED_SHARE * d.baseline_device_ms else "MED",
        title=f"Kernel {display_name(d.name, 60)} slowed down: +{d.added_ms:.1f} ms per {unit} "
        f"(+{d.growth:.0%}) from the first to the second half of the run",
        detail=f"Its time went from {d.first_ms:.2f} to {d.second_ms:.2f} ms per {unit} "
        f"(mean over each half of {ctx.kernels.windows} windows; all kernels: "
        f"{d.baseline_device_ms:.1f} ms per {unit} in the first half).{others}",
        fix=_DRIFT_FIX.get(d.cls, _DRIFT_FIX_DEFAULT),
        evidence={
            "kernel": d.name,
            "class": d.cls,
            "first_half_ms": round(d.first_ms, 3),
            "second_half_ms": round(d.second_ms, 3),
            "added_ms": round(d.added_ms, 3),
            "first_half_device_ms": round(d.baseline_device_ms, 3),
            "unit": unit,
            "windows": ctx.kernels.windows,
            "grown": [
                {"kernel": o.name, "added_ms": round(o.added_ms, 3), "growth": round(o.growth, 3)}
                for o in drifts
            ],
        },
    )


# --------------------------------------------------------------------------
# kernel_launch_overhead
# --------------------------------------------------------------------------

#: Step wall time more than 10 % above the GPU's kernel time per step: the
#: GPU idles between launches for a tenth of the step.
LAUNCH_GAP_MIN = 0.10
#: Median launch shorter than this (µs) is "tiny": a kernel that short ends
#: before eager PyTorch can issue the next one (``cudaLaunchKernel`` alone
#: took a median 5.9-6.3 µs of CPU in the H200 traces, plus the operator's
#: dispatch). The fixtures' medians: hand-written attention GPT 32 µs, SDPA GPT
#: 15 µs (its step is 16 % above its kernel time, yet its GPU is busy with
#: real work: this keeps it silent), A100 DLRM 13 µs, ResNet 14 µs.
TINY_KERNEL_US = 10.0
#: Fewest kernel launches per step for launch overhead to add up (100 launches
#: x ~10 µs of CPU each = 1 ms; the SDPA GPT launches 312 per step).
MIN_KERNELS_PER_STEP = 100
#: Most idle GPU time per launch (µs) that launches can explain: eager
#: dispatch + launch costs ~10-50 µs of CPU per operator. Larger gaps are
#: something else (a loader, host work, a sync): the A100 ResNet's steps
#: (222 ms wall, 51 ms of kernels, 1,258 launches) leave 136 µs per launch.
MAX_IDLE_PER_LAUNCH_US = 50.0


@rule("kernel_launch_overhead")
def kernel_launch_overhead(ctx: RunContext) -> Insight | None:
    """Fires when the median step exceeds the kernel time per step by >
    :data:`LAUNCH_GAP_MIN`, the median launch is < :data:`TINY_KERNEL_US`, a
    step launches >= :data:`MIN_KERNELS_PER_STEP` kernels and the idle time per
    launch is <= :data:`MAX_IDLE_PER_LAUNCH_US`: the CPU cannot issue kernels as
    fast as the GPU runs them."""
    k = ctx.kernels
    if k is None or not k.device_ms_per_step or k.kernels_per_step is None:
        return None
    steady = ctx.step_ms[WARMUP_STEPS:] if len(ctx.step_ms) > 2 * WARMUP_STEPS else ctx.step_ms
    step_ms = median(steady) if steady else median(k.wall_ms_per_step)
    device_ms = median(k.device_ms_per_step)
    if step_ms <= 0 or k.median_kernel_us is None:
        return None
    gap = (step_ms - device_ms) / step_ms
    idle_per_launch_us = (step_ms - device_ms) * 1e3 / k.kernels_per_step
    if (
        gap <= LAUNCH_GAP_MIN
        or k.median_kernel_us >= TINY_KERNEL_US
        or k.kernels_per_step < MIN_KERNELS_PER_STEP
        or idle_per_launch_us > MAX_IDLE_PER_LAUNCH_US
    ):
        return None
    return Insight(
        rule="kernel_launch_overhead",
        severity="HIGH" if gap >= 0.5 else "MED",
        title=f"Launch-bound: the GPU idles {gap:.0%} of each step between "
        f"{k.kernels_per_step:.0f} tiny kernels (median {k.median_kernel_us:.1f} µs)",
        detail=f"A step takes {step_ms:.2f} ms but its kernels run {device_ms:.2f} ms: "
        f"{idle_per_launch_us:.1f} µs idle per launch, the CPU's cost of issuing each one.",
        fix="Fuse the small ops: torch.compile(model) (mode='reduce-overhead' adds CUDA graphs), "
        "fused / foreach optimizers (fused=True), or a larger batch per step.",
        evidence={
            "step_ms": round(step_ms, 3),
            "kernel_ms_per_step": round(device_ms, 3),
            "gap": round(gap, 4),
            "kernels_per_step": round(k.kernels_per_step, 1),
            "median_kernel_us": round(k.median_kernel_us, 2),
            "idle_per_launch_us": round(idle_per_launch_us, 2),
        },
    )


# --------------------------------------------------------------------------
# gradient_checkpointing_detected
# --------------------------------------------------------------------------

#: Backward/forward time ratio at or above which the backward recomputes the
#: forward. Backward does ~2x the forward's FLOPs (gradients for inputs and
#: for weights), ~3x with full activation checkpointing (one forward re-run);
#: 2.5 is the midpoint. The H200 GPT measured 1.85 (SDPA) and 1.48
#: (hand-written attention: its forward is the slower half) without
#: checkpointing (``steps.json``, 20 steps each).
RECOMPUTE_RATIO_MIN = 2.5
#: Ratio at or below which a declared checkpointing is not in effect (clearly
#: on the no-recompute side of the midpoint; selective checkpointing of
#: attention alone lands between).
NO_RECOMPUTE_RATIO_MAX = 2.2
#: Share (0-1) of kernel time in collectives above which the ratio says
#: nothing: DDP/FSDP gradient all-reduces and waits land in the backward phase.
COMM_SHARE_MAX = 0.20
#: Least forward time (ms, over the run) for the ratio to be measured.
MIN_FORWARD_MS = 10.0


@rule("gradient_checkpointing_detected")
def gradient_checkpointing_detected(ctx: RunContext) -> Insight | None:
    """Fires when the backward/forward time ratio (``phase_ms``) says the
    backward recomputes the forward (>= :data:`RECOMPUTE_RATIO_MIN`) but the
    declared architecture says no checkpointing, or the reverse (declared,
    ratio <= :data:`NO_RECOMPUTE_RATIO_MAX`). Silent when checkpointing was
    not declared either way (``ctx.checkpointing_declared`` None) or
    collectives hold > :data:`COMM_SHARE_MAX` of kernel time."""
    declared = ctx.checkpointing_declared
    fwd, bwd = ctx.phase_ms.get("forward", 0.0), ctx.phase_ms.get("backward", 0.0)
    if declared is None or fwd < MIN_FORWARD_MS or bwd <= 0:
        return None
    if ctx.kernels is not None and ctx.kernels.class_share.get("comm", 0.0) > COMM_SHARE_MAX:
        return None
    ratio = bwd / fwd
    evidence = {
        "backward_forward_ratio": round(ratio, 3),
        "declared": declared,
        "forward_ms": round(fwd, 2),
        "backward_ms": round(bwd, 2),
    }
    if not declared and ratio >= RECOMPUTE_RATIO_MIN:
        return Insight(
            rule="gradient_checkpointing_detected",
            severity="MED",
            title=f"Backward takes {ratio:.1f}x the forward: activations are recomputed, "
            "but the architecture declares no checkpointing",
            detail=f"Forward {fwd:.0f} ms, backward {bwd:.0f} ms over the run; ~2x is a plain "
            "backward, ~3x a backward that re-runs the forward. MFU counts model FLOPs, so "
            "the recomputed forward shows up as lost utilization.",
            fix="If checkpointing is intended, declare it (gpuprof.TransformerArch("
            "checkpointing=True)) so the recompute is counted as hardware FLOPs, not read as "
            "lost MFU; if not, remove torch.utils.checkpoint / gradient_checkpointing_enable() "
            "and trade memory for ~25 % less step time.",
            evidence=evidence,
        )
    if declared and ratio <= NO_RECOMPUTE_RATIO_MAX:
        return Insight(
            rule="gradient_checkpointing_detected",
            severity="LOW",
            title=f"Checkpointing is declared but backward takes only {ratio:.1f}x the "
            "forward: nothing seems recomputed",
            detail=f"Forward {fwd:.0f} ms, backward {bwd:.0f} ms over the run; a backward "
            "that re-runs the forward takes ~3x, a plain one ~2x.",
            fix="Check that checkpointing is on (model.gradient_checkpointing_enable(), or "
            "torch.utils.checkpoint around the blocks with use_reentrant=False); if it is off "
            "on purpose, declare TransformerArch(checkpointing=False) so the hardware FLOPs "
            "do not count a recompute that does not happen.",
            evidence=evidence,
        )
    return None
