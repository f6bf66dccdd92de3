"""Rules on step timing: loader stalls, warm-up, outliers, variance."""

from __future__ import annotations

from gpuprof.insights.base import WARMUP_STEPS, Insight, RunContext, rule
from gpuprof.stats import median, percentile

#: Seed rule table: a loader wait above 15 % of the iteration is a stall worth fixing.
STALL_FRACTION = 0.15
#: Above this share the GPU is starved for most of the run.
STALL_FRACTION_HIGH = 0.30
#: Seed rule table: host CPU above 80 % (all cores) during a stall = CPU-bound workers.
CPU_BOUND_PCT = 80.0
#: Share of the host's busy cores that the run's own process tree must use for
#: its workers to be the CPU hogs; below it another tenant pegs the host.
RUN_SHARE_OF_BUSY_CPU = 0.5
#: The io_bound rule's threshold (seed): above it the disk, not the CPU, is busy.
DISK_BUSY_BPS = 500e6
#: Seed: first step > 3× the steady-state median is compilation / autotune warm-up.
WARMUP_RATIO = 3.0
#: Seed: step 0 > 10× the median of the rest is an outlier to filter, not a warm-up curve.
FIRST_STEP_OUTLIER_RATIO = 10.0
#: Seed: p99/p50 above 2 means periodic stalls inside the loop.
VARIANCE_RATIO = 2.0
#: One-off start-up time below this (ms, summed over the slow first steps)
#: skews no throughput figure worth a finding: a 1 ms step 0 that is 4× a
#: 0.25 ms median is true but useless.
MIN_WARMUP_EXCESS_MS = 100.0
#: p99 of fewer steady steps than this is the maximum, not a tail.
VARIANCE_MIN_STEPS = 20
#: Slow steps (> VARIANCE_RATIO × median) needed to call it periodic: one GC
#: pause or one log flush in a short run is not (seen on 20-60-step runs,
#: where p99 is the single slowest step).
VARIANCE_MIN_SLOW_STEPS = 3
#: Time the slow steps lose beyond the median, summed (ms), below which the
#: spread costs nothing worth a finding: 0.3 ms steps with a 1.6 ms p99 are
#: erratic but lose a few ms in a whole run, less than one GC pause.
VARIANCE_MIN_EXCESS_MS = 50.0


def own_cpu_cores(ctx: RunContext) -> tuple[float | None, int]:
    """(cores, ranks): the CPU that is this job's own on this host: its ranks
    here together (a torchrun job's ranks share the host and are not "other
    processes" to each other), else the run's own process tree; None unsampled."""
    if ctx.job_cpu_cores is not None and ctx.job_ranks > 1:
        return ctx.job_cpu_cores, ctx.job_ranks
    return ctx.run_cpu_cores, 1


def stall_fraction(ctx: RunContext) -> float | None:
    """Share (0-1) of iteration time spent waiting on the loader — before each
    step and between its micro-batches — step 0 excluded (its wait covers model
    and worker start-up). None if < 2 steps."""
    if ctx.steps < 2:
        return None
    loader = sum(ctx.loader_ms[1:])
    total = sum(ctx.iteration_ms[1:])
    return loader / total if total > 0 else None


def _wait_kind(ctx: RunContext) -> str:
    return "timed next() calls" if ctx.explicit_wait else "inter-step gap"


@rule("dataloader_stall")
def dataloader_stall(ctx: RunContext) -> Insight | None:
    """Fires when the loader wait is > :data:`STALL_FRACTION` of iteration time."""
    frac = stall_fraction(ctx)
    if frac is None or frac <= STALL_FRACTION:
        return None
    mean_wait = sum(ctx.loader_ms[1:]) / (ctx.steps - 1)
    severity = "HIGH" if frac > STALL_FRACTION_HIGH else "MED"
    evidence = {"stall_fraction": round(frac, 4), "mean_wait_ms": round(mean_wait, 3)}
    if not ctx.explicit_wait:  # no timed DataLoader: whatever ran between the steps
        return Insight(
            rule="dataloader_stall",
            severity=severity,
            title=f"{frac:.0%} of step time spent between steps (inter-step gap)",
            detail=f"{mean_wait:.1f} ms per step on average passed between one optimizer "
            "step and the next forward, outside any timed DataLoader: making inputs, "
            "logging, evaluation or other host work.",
            fix="Find that work (e.g. torch.profiler around a few steps); if it is your input "
            "pipeline, run it in a DataLoader with num_workers > 0, or wrap it with "
            "prof.wrap_dataloader() so gpuprof can time it.",
            evidence=evidence,
        )
    return Insight(
        rule="dataloader_stall",
        severity=severity,
        title=f"{frac:.0%} of step time waiting on the loader ({_wait_kind(ctx)})",
        detail=f"The training loop waited {mean_wait:.1f} ms per step on average for "
        "the next batch; the model sat idle meanwhile.",
        fix="Raise DataLoader num_workers and prefetch_factor, set pin_memory=True and "
        "persistent_workers=True, or move augmentations to the GPU.",
        evidence=evidence,
    )


# CPU-bound workers also slow the training process's own compute unevenly,
# so they explain an erratic step time too.
@rule("cpu_bound_dataloader", supersedes=("dataloader_stall", "high_step_variance"))
def cpu_bound_dataloader(ctx: RunContext) -> Insight | None:
    """Fires on a stall while host CPU averages > :data:`CPU_BOUND_PCT`, the
    run's own processes (with the job's other ranks on this host:
    :func:`own_cpu_cores`) use ≥ :data:`RUN_SHARE_OF_BUSY_CPU` of the busy
    cores (when measured), and the disk is not the busy part (<
    :data:`DISK_BUSY_BPS` read, or unmeasured)."""
    frac = stall_fraction(ctx)
    cpu = ctx.host_cpu_pct
    if frac is None or frac <= STALL_FRACTION or cpu is None or cpu <= CPU_BOUND_PCT:
        return None
    if ctx.host_disk_read_bps is not None and ctx.host_disk_read_bps > DISK_BUSY_BPS:
        return None
    own, ranks = own_cpu_cores(ctx)
    if own is not None and ctx.cpu_count:
        busy_cores = cpu / 100.0 * ctx.cpu_count
        if own < RUN_SHARE_OF_BUSY_CPU * busy_cores:
            return None
    cores = f" across {ctx.cpu_count} cores" if ctx.cpu_count else ""
    return Insight(
        rule="cpu_bound_dataloader",
        severity="HIGH",
        title=f"Dataloader stall + CPU pegged ({cpu:.0f}% avg{cores}) — workers are "
        f"CPU-bound ({frac:.0%} of step time waiting)",
        detail="The loop waits on batches while every core is busy: the loader's "
        "Python work (decoding, augmentation) is the bottleneck.",
        fix="Move augmentations to the GPU (torchvision.transforms.v2 on CUDA tensors, "
        "kornia) or precompute them; num_workers won't help.",
        evidence={
            "stall_fraction": round(frac, 4),
            "host_cpu_pct": round(cpu, 1),
            "run_cpu_cores": None if ctx.run_cpu_cores is None else round(ctx.run_cpu_cores, 2),
            "own_cpu_cores": None if own is None else round(own, 2),
            "job_ranks": ranks,
        },
    )


def _warmup_excess(ctx: RunContext, reference_ms: float) -> tuple[int, float]:
    """(leading steps slower than :data:`WARMUP_RATIO` × *reference_ms*, the
    time they took beyond it in ms)."""
    slow = next(
        (i for i, s in enumerate(ctx.step_ms) if s <= WARMUP_RATIO * reference_ms), ctx.steps
    )
    return slow, sum(s - reference_ms for s in ctx.step_ms[:slow])


def _exclude(slow: int) -> str:
    return "step 0" if slow <= 1 else f"steps 0–{slow - 1}"


@rule("compilation_warmup")
def compilation_warmup(ctx: RunContext) -> Insight | None:
    """Fires when step 0's compute takes > :data:`WARMUP_RATIO` × the
    steady-state median (steps after the first :data:`WARMUP_STEPS`) and the
    slow first steps cost ≥ :data:`MIN_WARMUP_EXCESS_MS` beyond it."""
    if ctx.steps <= 2 * WARMUP_STEPS:
        return None
    steady = median(ctx.step_ms[WARMUP_STEPS:])
    first = ctx.step_ms[0]
    if steady <= 0 or first <= WARMUP_RATIO * steady:
        return None
    slow, excess = _warmup_excess(ctx, steady)
    if excess < MIN_WARMUP_EXCESS_MS:
        return None
    return Insight(
        rule="compilation_warmup",
        severity="MED",
        title=f"Warm-up: step 0 took {first:.0f} ms, {first / steady:.1f}× the "
        f"steady-state median ({steady:.1f} ms)",
        detail=f"The first {slow} step(s) spent {excess:.0f} ms on one-off work (lazy "
        "initialization, allocator growth, torch.compile or kernel autotuning); averages "
        "that include them understate throughput.",
        fix=f"Exclude {_exclude(slow)} from throughput measurements.",
        evidence={
            "first_step_ms": round(first, 3),
            "steady_median_ms": round(steady, 3),
            "warmup_steps": slow,
            "excess_ms": round(excess, 3),
        },
    )


@rule("first_step_outlier", supersedes=("compilation_warmup",))
def first_step_outlier(ctx: RunContext) -> Insight | None:
    """Fires when step 0's compute takes > :data:`FIRST_STEP_OUTLIER_RATIO` ×
    the median of all later steps, with the same ≥ :data:`MIN_WARMUP_EXCESS_MS`
    of one-off time as :func:`compilation_warmup` (which it then replaces)."""
    if ctx.steps < 3:
        return None
    rest = median(ctx.step_ms[1:])
    first = ctx.step_ms[0]
    if rest <= 0 or first <= FIRST_STEP_OUTLIER_RATIO * rest:
        return None
    slow, excess = _warmup_excess(ctx, rest)
    if excess < MIN_WARMUP_EXCESS_MS:
        return None
    return Insight(
        rule="first_step_outlier",
        severity="MED",
        title=f"Step 0 took {first:.0f} ms, {first / rest:.0f}× the median of the rest "
        f"({rest:.1f} ms)",
        detail="One-off start-up work (torch.compile tracing, cuBLAS/cuDNN autotune, "
        "lazy allocation) landed in the first step.",
        fix=f"Filter {_exclude(slow)} out of timing; if it recurs, check recompiles with "
        "TORCH_LOGS=recompiles.",
        evidence={
            "first_step_ms": round(first, 3),
            "median_rest_ms": round(rest, 3),
            "warmup_steps": slow,
            "excess_ms": round(excess, 3),
        },
    )


@rule("high_step_variance")
def high_step_variance(ctx: RunContext) -> Insight | None:
    """Fires when steady-state p99/p50 of step compute time (loader wait
    excluded: that is the stall rules' job) > :data:`VARIANCE_RATIO` (needs
    :data:`VARIANCE_MIN_STEPS` steady steps, of which at least
    :data:`VARIANCE_MIN_SLOW_STEPS` are that slow, losing
    ≥ :data:`VARIANCE_MIN_EXCESS_MS` in all)."""
    steady = ctx.step_ms[WARMUP_STEPS:]
    if len(steady) < VARIANCE_MIN_STEPS:
        return None
    p50, p99 = percentile(steady, 50), percentile(steady, 99)
    if p50 <= 0 or p99 <= VARIANCE_RATIO * p50:
        return None
    slow_ms = [ms for ms in steady if ms > VARIANCE_RATIO * p50]
    slow = len(slow_ms)
    excess_ms = sum(ms - p50 for ms in slow_ms)
    if slow < VARIANCE_MIN_SLOW_STEPS or excess_ms < VARIANCE_MIN_EXCESS_MS:
        return None
    return Insight(
        rule="high_step_variance",
        severity="MED",
        title=f"Step compute time is erratic: p99 {p99:.1f} ms is {p99 / p50:.1f}× the "
        f"median ({p50:.1f} ms)",
        detail="Some steps take far longer than the rest: periodic work inside the loop.",
        fix="Look for logging, checkpointing or .item() syncs every N steps, and GC pauses "
        "(gc.freeze() after setup).",
        evidence={
            "p50_ms": round(p50, 3),
            "p99_ms": round(p99, 3),
            "slow_steps": slow,
            "excess_ms": round(excess_ms, 1),
        },
    )
