"""What fixing each finding is worth: its gain, from the iteration's parts.

The steady iteration (loader wait + step, mean over the steps after the
first :data:`~gpuprof.insights.base.WARMUP_STEPS`) splits into parts that
do not overlap (:class:`Iteration`):

* ``loader_wait``: the loader time the loop blocked on (the wait before the
  step and its ``data`` phase): what did not overlap compute;
* ``host_gap``: host work between the steps outside a timed loader's wait
  (a checkpoint, logging; :attr:`~gpuprof.insights.base.RunContext.gap_ms`);
* ``comm``: exposed collective time (the ``comm`` phase);
* ``slow_steps``: the slow steps' time above the steady median step;
* ``compute``: the rest of the step, within which a finding may claim
  ``cpu_contention`` (compute slowed by CPU the loader or other processes
  took), ``gpu_idle`` (the GPU idle inside the step), ``clock`` (a clock
  deficit), ``kernel_drift``, ``recompute`` and ``compute_efficiency``
  (compute above an attainable MFU);

Each rule that costs time has an estimator here (:data:`ESTIMATORS`) that
says which parts its finding would recover, in ms per iteration, and how
(one clause, its ``gain_method``). A finding's gain is the sum of its
claims: ``gain_ms_per_iteration``, ``gain_pct`` of the iteration,
``gain_speedup_max`` (the iteration over what is left of it),
``gain_run_s`` (over the run's steps) and ``gain_usd`` (on a GPU, at the
rate of the cost line). Findings that describe the same lost time claim
the same part (a stall and the GPU idle it causes both claim
``loader_wait``), and :func:`fix_all` takes each part once, at its largest
claim, capped by the part: a "fix all" figure is never a sum of gains and
never more than removing those parts gives. A finding whose gain cannot be
estimated says why in ``gain_method``, its figures None; one that costs no
time (the cost line, memory headroom) has no gain at all.

Pure: no I/O. ``bench/gain_accuracy.py`` holds the methods to the speed-up
their fixes really give.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprof.flops import TransformerArch
from gpuprof.gpus import find_gpu, normalize_dtype, peak_tflops
from gpuprof.insights.base import GAIN_KEYS, SEVERITIES, WARMUP_STEPS, Insight, RunContext
from gpuprof.insights.contention import contended
from gpuprof.insights.cost import gpu_rate
from gpuprof.insights.distributed import GroupContext
from gpuprof.insights.loading import competing_workers, gpu_starved_share, main_loader
from gpuprof.insights.steps import CPU_BOUND_PCT, VARIANCE_RATIO, gap_sync_share
from gpuprof.stats import mean, median, percentile

# The iteration's parts (the budget findings claim from).
LOADER = "loader_wait"
GAP = "host_gap"
COMM = "comm"
SLOW = "slow_steps"
CPU = "cpu_contention"
IDLE = "gpu_idle"
CLOCK = "clock"
EFFICIENCY = "compute_efficiency"
DRIFT = "kernel_drift"
RECOMPUTE = "recompute"
#: A group's parts: the job's exposed comm (:data:`COMM`) and the slowest
#: rank's step above the others'.
RANK = "rank_excess"
#: Parts inside the step's compute: together they can recover no more than it.
COMPUTE_PARTS = (CPU, IDLE, CLOCK, DRIFT, RECOMPUTE, EFFICIENCY)

#: What the headline calls each rule's fix: "Fixing the loader stall: ...".
LABELS: Mapping[str, str] = {
    "dataloader_stall": "the loader stall",
    "host_work_between_steps": "the work between steps",
    "cpu_bound_dataloader": "the loader stall",
    "io_bound_dataloader": "the loader stall",
    "prefetch_queue_starved": "the prefetch queue",
    "cold_cache": "the cold page cache",
    "worker_imbalance": "the worker imbalance",
    "host_cpu_contention": "the CPU contention",
    "compilation_warmup": "the warm-up",
    "first_step_outlier": "the slow first step",
    "high_step_variance": "the slow steps",
    "regression": "the regression",
    "low_mfu": "the low MFU",
    "small_batch": "the small kernels",
    "thermal_throttling": "the thermal throttling",
    "power_capping": "the power cap",
    "gpu_idle_between_steps": "the GPU's idle time",
    "kernel_drift": "the slowing kernel",
    "kernel_launch_overhead": "the launch overhead",
    "gradient_checkpointing_detected": "the recompute",
    "straggler_rank": "the straggler",
    "comm_dominant": "the exposed comm",
    "bucket_skew": "the late bucket",
    "rank_skew": "the slow rank",
}


@dataclass(frozen=True)
class Iteration:
    """The steady iteration's parts, mean ms per iteration (see the module doc)."""

    iteration_ms: float
    """Mean steady iteration (loader wait + step): what the gains are a share of."""
    loader_ms: float
    comm_ms: float
    slow_ms: float
    """The slow steps' (over :data:`~gpuprof.insights.steps.VARIANCE_RATIO` × the
    median) time above the steady median step, over all steady steps."""
    compute_ms: float
    """The rest of the step: ``iteration − loader − gap − comm − slow`` (≥ 0)."""
    median_step_ms: float
    """Median steady step (loader wait excluded)."""
    iterations: int
    """The run's steps (traced ones included): what a per-iteration gain is multiplied by."""
    gap_ms: float = 0.0
    """Host work between the steps outside a timed loader's wait (:data:`GAP`)."""

    def parts(self) -> dict[str, float]:
        """The parts, ms per iteration, rounded to µs."""
        return {
            LOADER: round(self.loader_ms, 3),
            GAP: round(self.gap_ms, 3),
            COMM: round(self.comm_ms, 3),
            SLOW: round(self.slow_ms, 3),
            "compute": round(self.compute_ms, 3),
        }


def _steady(values: Sequence[float]) -> Sequence[float]:
    """*values* without the first :data:`WARMUP_STEPS` (kept on a short run)."""
    return values[WARMUP_STEPS:] if len(values) > 2 * WARMUP_STEPS else values


def iteration(ctx: RunContext) -> Iteration | None:
    """The run's :class:`Iteration`; None without steps (or a zero iteration)."""
    if not ctx.steps:
        return None
    total = mean(_steady(ctx.iteration_ms))
    if total <= 0:
        return None
    loader = mean(_steady(ctx.loader_ms))
    synced = gap_sync_share(ctx)
    if synced:  # the gap's device syncs waited on the GPU's compute
        loader *= 1.0 - synced
    starved = gpu_starved_share(ctx)
    if starved is not None:  # a wait the GPU did not feel (a sync) is its compute
        loader = min(loader, starved * total)
    gap = mean(_steady(ctx.gap_ms)) if ctx.gap_ms else 0.0
    comm = mean(_steady(ctx.comm_ms)) if ctx.comm_ms else 0.0
    steps = _steady(ctx.step_ms)
    p50 = median(steps)
    slow = sum(s - p50 for s in steps if s > VARIANCE_RATIO * p50) / len(steps)
    compute = max(0.0, total - loader - gap - comm - slow)
    return Iteration(
        total, loader, comm, slow, compute, p50, ctx.steps + ctx.traced_steps, gap_ms=gap
    )


@dataclass(frozen=True)
class CpuWork:
    """Who used the host's cores while the run was in its steps (means)."""

    cores: int
    """The host's cores."""
    own_cores: float
    """The run's process tree (training process + loader workers)."""
    worker_cores: float
    """Its DataLoader workers (0: none measured)."""
    other_cores: float
    """Other processes (host busy − this job's processes on the host)."""
    host_pct: float | None

    @property
    def main_cores(self) -> float:
        """The training process alone."""
        return max(0.0, self.own_cores - self.worker_cores)


def cpu_work(ctx: RunContext) -> CpuWork | None:
    """The run's :class:`CpuWork`; None when its own CPU or the host's cores
    were not measured. The workers' cores are their CPU seconds over their
    pools' spans (pools one after the other: time-weighted)."""
    if ctx.run_cpu_cores is None or not ctx.cpu_count:
        return None
    pools = [p for p in ctx.worker_pools if p.span_s and p.span_s > 0]
    span = sum(p.span_s or 0.0 for p in pools)
    workers = sum(c for p in pools for _, c in p.cpu_s) / span if span > 0 else 0.0
    job = ctx.job_cpu_cores if ctx.job_ranks > 1 and ctx.job_cpu_cores else ctx.run_cpu_cores
    busy = None if ctx.host_cpu_pct is None else ctx.host_cpu_pct / 100.0 * ctx.cpu_count
    others = 0.0 if busy is None else max(0.0, busy - job)
    return CpuWork(ctx.cpu_count, ctx.run_cpu_cores, workers, others, ctx.host_cpu_pct)


def pool_workers(ctx: RunContext) -> int:
    """The run's DataLoader worker processes: its largest measured pool's
    (the pools of one loader come one after the other); 0 when none."""
    return max((len(p.cpu_s) for p in ctx.worker_pools if p.span_s), default=0)


def clean_compute(ctx: RunContext, it: Iteration, cpu: CpuWork | None) -> tuple[float, bool]:
    """(the step's compute at full CPU, ms; whether it was corrected).

    On a CPU run whose host was saturated (≥ :data:`CPU_BOUND_PCT`) while
    loader workers ran beside the training process, the compute was slowed
    by the cores they took: what it needs is the training process's own CPU
    time per iteration (its cores × the iteration), when that is less than
    the compute measured. Otherwise (a GPU run, cores to spare, no workers
    measured, a multi-threaded compute using more CPU than wall time) the
    compute as measured."""
    c = it.compute_ms
    if ctx.gpu_model or cpu is None or cpu.worker_cores <= 0:
        return c, False
    if cpu.host_pct is None or cpu.host_pct < CPU_BOUND_PCT:
        return c, False
    main = cpu.main_cores * it.iteration_ms
    if main <= 0 or main >= c:
        return c, False
    return main, True


#: Percentile of the steady steps taken for a CPU run's step at full CPU when
#: its own busy loader workers took its cores
#: (:func:`gpuprof.insights.loading.competing_workers`): the steps that ran
#: while the workers were between batches. The training process's CPU time
#: does not say it once the step has intra-op threads (they spin while the
#: workers hold the cores): the new user's collate_fn loop, 2 workers on 2
#: cores, 2026-12-04, used 56 ms of CPU per iteration while its fastest
#: tenth of steps took 22 ms and the step without the workers 9 ms.
FAST_STEP_PERCENTILE = 10.0


def fast_compute(ctx: RunContext) -> float | None:
    """A CPU run's step at full CPU when its own loader workers took its
    cores: the :data:`FAST_STEP_PERCENTILE` of its steady steps (ms); None
    when the workers did not compete (:func:`competing_workers`)."""
    if competing_workers(ctx) is None:
        return None
    steady = _steady(ctx.step_ms)
    return percentile(steady, FAST_STEP_PERCENTILE) if steady else None


@dataclass(frozen=True)
class Estimate:
    """A finding's claims on the iteration's parts (ms per iteration) and how
    they were reckoned. ``claims`` None: not estimated, ``method`` says why."""

    claims: Mapping[str, float] | None
    method: str
    outside_ms: float | None = None
    """A gain outside the budget (the regression's distance to its baseline,
    the warm-up's one-off time): ms per iteration that no steady part holds;
    ``claims`` then empty."""
    base_ms: float | None = None
    """The iteration the gain is a share of, when not the steady one (the
    warm-up's: the mean over every step, the first ones included)."""


def _ms(x: float) -> str:
    return f"{x:.1f} ms" if x >= 0.95 else f"{x * 1e3:.0f} µs"


def _split(
    gain: float,
    it: Iteration,
    compute_part: str = CPU,
    keep_ms: float = 0.0,
    slow: bool = False,
) -> dict[str, float]:
    """*gain* claimed from ``loader_wait`` first, the rest from the compute,
    which keeps *keep_ms* (the step's compute at full CPU: a fix leaves it),
    then (*slow*: the slow steps are the same cause's) from ``slow_steps``."""
    loader = min(gain, it.loader_ms)
    out = {LOADER: loader}
    rest = min(gain - loader, max(0.0, it.compute_ms - keep_ms))
    if rest > 1e-9:
        out[compute_part] = rest
    bursts = min(gain - loader - max(rest, 0.0), it.slow_ms) if slow else 0.0
    if bursts > 1e-9:
        out[SLOW] = bursts
    return out


def _stall(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    """Loader stalls: the wait the loop blocked on; for a CPU-bound loader
    also the compute its CPU slowed, or bounded by the cores its work needs
    (on an idle host, no fewer than its workers' CPU per batch over as many
    cores as it has workers). Cheaper loading beside other processes on a
    CPU run (the finding's ``other_cores_to_free``) gets the step its full
    CPU only with their cores freed too: the claim says it counts them, as
    the finding's fix asks (the run cannot tell how much of the workers'
    cores the others would take: beside one spinning process on 2 cores
    cheaper loading gave 2.8-3.8×, beside two 1.6-2.2×, from the same
    figures; bench/gain_accuracy.py ``contended_workers``, 2026-12-04)."""
    wait = _ms(it.loader_ms)
    if not ctx.explicit_wait:  # no timed loader: whatever ran between the steps
        return Estimate(
            {LOADER: it.loader_ms},
            f"the inter-step gap ({wait}): the host work between one step and the next, removed",
        )
    if ins.rule != "cpu_bound_dataloader":
        return Estimate(
            {LOADER: it.loader_ms},
            f"the loader wait the loop blocked on ({wait}, what did not overlap compute), "
            "removed; the compute unchanged",
        )
    cpu = cpu_work(ctx)
    if cpu is None:
        return Estimate({LOADER: it.loader_ms}, f"the loader wait ({wait}), removed")
    c, corrected = clean_compute(ctx, it, cpu)
    cfg = main_loader(ctx)
    in_process = cfg is not None and cfg.num_workers == 0
    work = cpu.own_cores * it.iteration_ms  # the run's CPU ms per iteration
    slowed = (
        f"; the compute its CPU slowed: the training process used {_ms(c)} of CPU per "
        f"iteration against a {_ms(it.compute_ms)} step"
        if corrected
        else ""
    )
    fast = fast_compute(ctx)
    competing = False
    if fast is not None and fast < c:  # the workers took the step's cores: its bursts too
        competing, c = True, fast
        slowed = (
            f"; the compute and the slow steps its workers' CPU slowed: its fastest tenth "
            f"of steps took {_ms(c)} against a {_ms(it.compute_ms)} step"
        )
    if ins.evidence.get("cause") == "contention":
        free = min(float(cpu.cores), cpu.own_cores + cpu.other_cores)
        floor = max(c, work / free) if free > 0 else c
        how = (
            f"on an idle host: the loader wait ({wait}){slowed}, down to the run's "
            f"{_ms(work)} of CPU per iteration spread over {free:.1f} cores"
        )
        lanes = min(float(pool_workers(ctx)), free)
        batch = cpu.worker_cores * it.iteration_ms  # the workers' CPU per batch
        if lanes > 0 and batch / lanes > floor:  # fewer workers than cores: not all usable
            floor = batch / lanes
            n = pool_workers(ctx)
            whose = f"{n} workers'" if n > 1 else "1 worker's"
            on = "1 core" if lanes == 1 else f"{lanes:.3g} cores"
            how += (
                f", and no less than its {whose} {_ms(batch)} of CPU per batch on {on} "
                "(a worker process computes on one)"
            )
    elif not in_process and cpu.host_pct is not None and cpu.host_pct > CPU_BOUND_PCT:
        floor = c
        how = f"cheaper loading: the loader wait ({wait}){slowed}"
        others = ins.evidence.get("other_cores_to_free")
        if others and c < it.compute_ms:  # the step at full CPU needs their cores back too
            how = (
                f"cheaper loading, with the {others:.1f} cores other processes held freed "
                f"too: the loader wait ({wait}){slowed}"
            )
    else:
        free = max(1.0, cpu.cores - cpu.other_cores)
        floor = max(c, work / free)
        how = (
            f"the loading spread over the idle cores: the loader wait ({wait}), down to "
            f"the run's {_ms(work)} of CPU per iteration over {free:.1f} cores"
        )
    gain = max(0.0, it.iteration_ms - min(floor, it.iteration_ms))
    return Estimate(_split(gain, it, keep_ms=c, slow=competing), how)


def _between_steps(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    """Host work between the steps outside the loader: all of it, removed
    (moved off the training thread, or run less often)."""
    return Estimate(
        {GAP: it.gap_ms},
        f"the host work between the steps ({_ms(it.gap_ms)} an iteration outside the loader "
        "wait), removed: moved off the training thread or run less often",
    )


def _contention(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    """Other processes' CPU: the contended steps' time above the median
    iteration of the steps that ran without contention (the run's own clean
    baseline); not estimated when too few steps ran without."""
    flags = contended(ctx)
    if not flags:
        return Estimate(None, "not estimated: the host's CPU was not sampled per step")
    lo = WARMUP_STEPS if ctx.steps > 2 * WARMUP_STEPS else 0
    steady = list(range(lo, ctx.steps))
    iters = ctx.iteration_ms
    clean = [iters[i] for i in steady if flags[i] is False]
    hit = [iters[i] for i in steady if flags[i]]
    if len(clean) < max(CONTENTION_MIN_CLEAN_STEPS, CONTENTION_MIN_CLEAN_SHARE * len(steady)):
        return Estimate(
            None,
            f"not estimated: {len(hit)} of {len(steady)} steady steps ran contended, too few "
            "without to compare with",
        )
    base = median(clean)
    lost = sum(max(0.0, x - base) for x in hit) / len(steady)
    compute = min(lost, it.compute_ms)
    claims = {CPU: compute}
    if lost - compute > 1e-9:
        claims[LOADER] = min(lost - compute, it.loader_ms)
    return Estimate(
        claims,
        f"the {len(hit)} contended steps' time above the median iteration "
        f"({_ms(base)}) of the {len(clean)} that ran without contention",
    )


#: Steps that ran without contention the contention gain needs as its
#: baseline: at least this many, and this share of the steady steps.
CONTENTION_MIN_CLEAN_STEPS = 10
CONTENTION_MIN_CLEAN_SHARE = 0.1


def _slow_steps(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    return Estimate(
        {SLOW: it.slow_ms},
        f"the slow steps' time above the steady median step ({_ms(it.median_step_ms)}), "
        "over every steady step",
    )


def _warm_up(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    """One-off time: outside the steady iteration, so a share of the mean
    over every step (the first ones included)."""
    excess = float(ins.evidence.get("excess_ms") or 0.0)
    n = ins.evidence.get("warmup_steps") or 1
    every = mean(ctx.iteration_ms)
    return Estimate(
        {},
        f"one-off: the first {n} step(s)' {excess / 1e3:.1f} s above the steady median, "
        f"spread over the run's {ctx.steps} steps (a compile cache or fewer recompiles "
        "saves it; leaving it out of measurements saves nothing)",
        outside_ms=excess / max(ctx.steps, 1),
        base_ms=every,
    )


def _regression(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    """Back to the baseline: the run's iteration (the steps' mean, or the
    stored medians' when the earlier steps are gone) above the earlier runs'."""
    ev = ins.evidence
    now = float(ev.get("mean_iteration_ms") or ev.get("median_step_ms") or 0.0)
    base = float(ev.get("baseline_ms") or 0.0)
    stat = "mean" if "mean_iteration_ms" in ev else "median"
    return Estimate(
        {},
        f"back to the earlier runs' {stat} iteration ({_ms(base)} against {_ms(now)}); "
        "outside the budget: the other findings say where the time went",
        outside_ms=max(0.0, min(now - base, it.iteration_ms)),
    )


def _prefetch(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    """The waits on the starved steps, spread over every steady step: a queue
    deep enough has the batch ready, so they go."""
    n = int(ins.evidence.get("starved_steps") or 0)
    steady = int(ins.evidence.get("steady_steps") or 0)
    wait = float(ins.evidence.get("mean_starved_wait_ms") or 0.0)
    per = wait * n / steady if steady else 0.0
    return Estimate(
        {LOADER: min(per, it.loader_ms)},
        f"the starved steps' waits ({_ms(wait)} on {n} of {steady} steps), spread over "
        "every step: a full queue has each batch ready",
    )


def _cold_cache(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    first = float(ins.evidence.get("first_third_loader_ms") or 0.0)
    last = float(ins.evidence.get("last_third_loader_ms") or 0.0)
    extra = max(0.0, first - last) / 3.0
    return Estimate(
        {LOADER: min(extra, it.loader_ms)},
        f"the first third's extra loader wait ({_ms(first - last)} per step), a third of "
        "the run's steps: a warm cache recovers it",
    )


def _imbalance(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    ratio = float(ins.evidence.get("fair_share_ratio") or 1.0)
    floor = max(it.compute_ms, it.iteration_ms / ratio)
    gain = min(max(0.0, it.iteration_ms - floor), it.loader_ms)
    return Estimate(
        {LOADER: gain},
        f"the loader wait if its pool ran at its fair share: the iteration / {ratio:.1f}, "
        f"no less than the compute ({_ms(it.compute_ms)})",
    )


def _gpu_idle(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    share = float(ins.evidence.get("idle_share") or 0.0)
    idle = share * it.iteration_ms
    return Estimate(
        _split(idle, it, IDLE),
        f"the GPU's idle time ({share:.0%} of its samples × the iteration), the loader "
        "wait first: the host work it waits on, removed",
    )


def _launch(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    step = float(ins.evidence.get("step_ms") or 0.0)
    kernels = float(ins.evidence.get("kernel_ms_per_step") or 0.0)
    gap = min(max(0.0, step - kernels), it.compute_ms)
    return Estimate(
        {IDLE: gap},
        f"the step's time beyond its kernels' device time ({_ms(step)} against "
        f"{_ms(kernels)}): kernels issued back to back (CUDA graphs, fusion)",
    )


def _clock(share_key: str, what: str) -> Callable[[RunContext, Iteration, Insight], Estimate]:
    def estimate(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
        drop = float(ins.evidence.get("clock_drop", ins.evidence.get("est_throughput_loss")) or 0)
        share = float(ins.evidence.get(share_key) or 0.0)
        busy = min(share * it.iteration_ms, it.compute_ms)
        return Estimate(
            {CLOCK: busy * drop},
            f"the SM clock deficit ({drop:.0%}) on the time the GPU ran {what} ({share:.0%} "
            "of its samples × the iteration): exact for compute-bound kernels, an upper "
            "bound for memory-bound ones",
        )

    return estimate


# Attainable MFU (0-1) by model size: MosaicML llm-foundry's MPT training
# benchmarks (scripts/train/benchmarking/README.md), bf16, sequence length 2048,
# 8 GPUs (70B: 64 GPUs; H100 3B: 16). (active parameters, A100, H100) per row.
_ATTAINABLE_SOURCE = "MosaicML llm-foundry MPT benchmarks, bf16, seq 2048"
_ATTAINABLE: tuple[tuple[float, float | None, float | None], ...] = (
    (125e6, 0.4479, None),
    (350e6, 0.5162, None),
    (760e6, 0.5685, 0.3490),
    (1.3e9, 0.5986, 0.4182),
    (2.7e9, 0.6211, 0.4373),
    (6.7e9, 0.6423, 0.4644),
    (13e9, 0.5957, 0.3979),
    (30e9, 0.5530, 0.3811),
    (65e9, 0.5333, 0.4257),
)
#: The table's columns: GPU families by the spec names of :mod:`gpuprof.gpus`.
_ATTAINABLE_FAMILY = {"A100 80GB": 1, "A100 40GB": 1, "H100 SXM": 2, "H200": 2}


def attainable_mfu(ctx: RunContext) -> tuple[float, str] | str:
    """(attainable MFU 0-1, its source) for the run's model size and GPU, or
    why there is none: the declared architecture's active parameters,
    nearest row of :data:`_ATTAINABLE` (log scale; below the H100 column's
    smallest model, its 760M figure), on an A100 / H100 / H200 in bf16 or fp16."""
    spec = find_gpu(ctx.gpu_model)
    col = _ATTAINABLE_FAMILY.get(spec.name) if spec else None
    if col is None:
        return f"no published attainable MFU for {ctx.gpu_model or 'this GPU'}"
    if normalize_dtype(ctx.dtype) not in ("bf16", "fp16"):
        return "the published attainable MFU figures are for bf16"
    try:
        params = TransformerArch.from_dict(ctx.arch).active_params if ctx.arch else None
    except (TypeError, ValueError, KeyError):
        params = None
    if not params:
        return "attainable MFU depends on the model's size: declare arch=TransformerArch(...)"
    rows = [(r[0], r[col]) for r in _ATTAINABLE if r[col] is not None]
    n, m = min(rows, key=lambda r: abs(math.log(r[0] / params)))
    assert spec is not None and m is not None
    return float(m), f"{_ATTAINABLE_SOURCE}, {n / 1e9:g}B params on {spec.name}"


def _mfu(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    got = attainable_mfu(ctx)
    if isinstance(got, str):
        return Estimate(None, f"not estimated: {got}")
    att, source = got
    peak = peak_tflops(ctx.gpu_model, ctx.dtype)
    if not ctx.flops_per_step or not peak or ctx.gpu_count < 1:
        return Estimate(None, "not estimated: FLOPs per step or the GPU's peak unknown")
    floor = ctx.flops_per_step / (att * peak * 1e12 * ctx.gpu_count) * 1e3  # ms
    gain = max(0.0, it.compute_ms - floor)
    return Estimate(
        {EFFICIENCY: gain},
        f"the step's compute ({_ms(it.compute_ms)}; loader wait, exposed comm and slow "
        f"steps are other findings') at an attainable MFU of {att:.0%} ({source})",
    )


def _drift(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
    if ins.evidence.get("unit") != "step":
        return Estimate(None, "not estimated: the kernel windows name no steps")
    added = float(ins.evidence.get("added_ms") or 0.0)
    return Estimate(
        {DRIFT: min(added, it.compute_ms)},
        f"the kernel's device time added per step ({_ms(added)}, second half against "
        "first), as at the run's end",
    )


def _recompute(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate | None:
    if ins.evidence.get("declared") is not False:
        return None  # declared but not seen: nothing is lost
    fwd = float(ins.evidence.get("forward_ms") or 0.0)
    bwd = float(ins.evidence.get("backward_ms") or 0.0)
    steps = max(ctx.steps, 1)
    extra = max(0.0, bwd - 2.0 * fwd) / steps
    return Estimate(
        {RECOMPUTE: min(extra, it.compute_ms)},
        "the backward beyond twice the forward (the recomputed forward), per step; "
        "it trades for the activations' memory",
    )


def _not_estimated(why: str) -> Callable[[RunContext, Iteration, Insight], Estimate]:
    def estimate(ctx: RunContext, it: Iteration, ins: Insight) -> Estimate:
        return Estimate(None, f"not estimated: {why}")

    return estimate


Estimator = Callable[[RunContext, Iteration, Insight], "Estimate | None"]

#: Per rule: its gain estimator. Rules not here cost no time (the cost line,
#: memory headroom, a FLOPs mismatch): their findings carry no gain.
ESTIMATORS: Mapping[str, Estimator] = {
    "dataloader_stall": _stall,
    "host_work_between_steps": _between_steps,
    "cpu_bound_dataloader": _stall,
    "io_bound_dataloader": _stall,
    "prefetch_queue_starved": _prefetch,
    "cold_cache": _cold_cache,
    "worker_imbalance": _imbalance,
    "host_cpu_contention": _contention,
    "compilation_warmup": _warm_up,
    "first_step_outlier": _warm_up,
    "high_step_variance": _slow_steps,
    "regression": _regression,
    "low_mfu": _mfu,
    "small_batch": _mfu,
    "thermal_throttling": _clock("thermal_share", "thermally slowed"),
    "power_capping": _clock("power_capped_share", "busy under the power cap"),
    "gpu_idle_between_steps": _gpu_idle,
    "kernel_launch_overhead": _launch,
    "kernel_drift": _drift,
    "gradient_checkpointing_detected": _recompute,
    "cache_thrashing": _not_estimated(
        "the re-reads cost what the loop waits on them: a stall finding carries that"
    ),
    "host_memory_pressure": _not_estimated(
        "swapping slows whoever touches a swapped page; its time is not measured"
    ),
    "sdpa_suboptimal": _not_estimated(
        "a fused kernel's saving depends on the sequence length and head size (the H200 "
        "GPT's step went from 27.0 to 11.1 ms)"
    ),
    "copy_bound_gpu": _not_estimated("how much of the copying the step needs is not measured"),
    "pcie_saturation": _not_estimated("a peak transfer rate says nothing of the time it costs"),
}


def gpu_usd_per_s(ctx: RunContext) -> float | None:
    """USD per second of the run's GPUs (the cost line's rate); None on a CPU run."""
    rate = gpu_rate(ctx)
    return None if rate is None else rate * ctx.gpu_count / 3600.0


def gain_fields(
    est: Estimate,
    iteration_ms: float,
    iterations: int,
    usd_per_s: float | None,
    label: str | None,
) -> dict[str, Any]:
    """The :data:`~gpuprof.insights.base.GAIN_KEYS` of *est* on an iteration of
    *iteration_ms* repeated *iterations* times, priced at *usd_per_s* (None:
    no price, ``gain_usd`` None)."""
    if est.claims is None:
        out = dict.fromkeys(GAIN_KEYS)
        out.update(gain_method=est.method, gain_label=label)
        return out
    claims = {k: round(v, 3) for k, v in est.claims.items() if v > 0}
    ms = sum(est.claims.values()) if est.outside_ms is None else est.outside_ms
    iteration_ms = est.base_ms or iteration_ms
    ms = min(max(ms, 0.0), iteration_ms)
    run_s = ms * iterations / 1e3
    left = iteration_ms - ms
    return {
        "gain_ms_per_iteration": round(ms, 3),
        "gain_pct": round(100.0 * ms / iteration_ms, 1),
        "gain_speedup_max": round(iteration_ms / left, 2) if left > 0 else None,
        "gain_run_s": round(run_s, 1),
        "gain_usd": None if usd_per_s is None else round(run_s * usd_per_s, 2),
        "gain_method": est.method,
        "gain_iteration_ms": round(iteration_ms, 3),
        "gain_parts_ms": claims,
        "gain_label": label,
    }


def _label(ins: Insight, ctx: RunContext | None = None) -> str | None:
    if ins.rule == "dataloader_stall" and ctx is not None and not ctx.explicit_wait:
        return "the inter-step gap"
    return LABELS.get(ins.rule)


def attach(ctx: RunContext, found: Sequence[Insight]) -> list[Insight]:
    """*found* with each finding's gain set (:data:`ESTIMATORS`; None for a
    rule that costs no time), in the same order. A failing estimator is a bug
    in gpuprof: that finding says its gain was not estimated."""
    it = iteration(ctx)
    usd = gpu_usd_per_s(ctx)
    out = []
    for ins in found:
        fn = ESTIMATORS.get(ins.rule)
        if fn is None:
            out.append(ins)
            continue
        if it is None:
            est: Estimate | None = Estimate(None, "not estimated: no steady steps timed")
        else:
            try:
                est = fn(ctx, it, ins)
            except Exception:  # noqa: BLE001 - a broken estimator must not lose the finding
                import logging

                logging.getLogger("gpuprof.insights").exception("gain of %s failed", ins.rule)
                est = Estimate(None, "not estimated: gpuprof could not compute it")
        if est is None:
            out.append(ins)
            continue
        base = it.iteration_ms if it is not None else 0.0
        n = it.iterations if it is not None else 0
        fields = (
            gain_fields(est, base, n, usd, _label(ins, ctx))
            if it is not None
            else gain_fields(est, 1.0, 0, None, _label(ins, ctx))
        )
        out.append(dataclasses.replace(ins, gain=fields))
    return out


def rank_key(ins: Mapping[str, Any]) -> tuple[int, float, float, int]:
    """Sort key of a finding (a ``to_dict`` mapping): the ones with a gain
    first, the most run time it saves first (ms per iteration where run time
    is not known), then by severity."""
    gain = ins.get("gain_ms_per_iteration")
    sev = str(ins.get("severity") or "").upper()
    order = SEVERITIES.index(sev) if sev in SEVERITIES else len(SEVERITIES)
    if gain is None:
        return (1, 0.0, 0.0, order)
    return (0, -float(ins.get("gain_run_s") or 0.0), -float(gain), order)


def ranked(insights: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """*insights* ranked by gain (:func:`rank_key`); stable among equals."""
    return sorted(insights, key=rank_key)


def rank_insights(found: Sequence[Insight]) -> list[Insight]:
    """:func:`ranked` for :class:`Insight` objects."""
    return sorted(found, key=lambda i: rank_key(i.to_dict()))


def fix_all(
    insights: Sequence[Mapping[str, Any]],
    parts: Mapping[str, float] | None = None,
    iteration_ms: float | None = None,
    iterations: int | None = None,
    usd_per_s: float | None = None,
) -> dict[str, Any] | None:
    """What fixing every finding together is worth: each part claimed once
    (its largest claim among *insights*' ``gain_parts_ms``), the parts inside
    the compute together at most the compute (*parts*: the iteration's
    :meth:`Iteration.parts`, when known), never more than the iteration.
    Findings outside the budget (a regression) are left out: their time is
    the others'. ``fix_all_ms_per_iteration``, ``fix_all_pct``,
    ``fix_all_speedup_max``, ``fix_all_run_s``, ``fix_all_usd`` (None: no
    price), ``findings`` (how many have a gain); None when none has.
    *iterations* and *usd_per_s* (the run's steps and GPU price per second)
    default to what the findings' own run seconds and dollars imply."""
    gained = [i for i in insights if i.get("gain_parts_ms") is not None]
    base = iteration_ms or next((i.get("gain_iteration_ms") for i in gained), None)
    if not gained or not base:
        return None
    best: dict[str, float] = {}
    for ins in gained:
        for part, ms in (ins.get("gain_parts_ms") or {}).items():
            best[part] = max(best.get(part, 0.0), float(ms))
    if parts is not None:
        for part in (LOADER, COMM, SLOW):
            if part in best and part in parts:
                best[part] = min(best[part], parts[part])
        inside = sum(best.get(p, 0.0) for p in COMPUTE_PARTS)
        if inside > parts.get("compute", inside):
            scale = parts["compute"] / inside if inside > 0 else 0.0
            for p in COMPUTE_PARTS:
                if p in best:
                    best[p] *= scale
    ms = min(sum(best.values()), float(base))
    # every finding's run seconds and dollars are its ms at one rate each
    ref = next((i for i in gained if i.get("gain_ms_per_iteration")), None)
    if iterations is not None:
        per_ms = iterations / 1e3
    else:
        per_ms = ref["gain_run_s"] / ref["gain_ms_per_iteration"] if ref else 0.0
        usd_per_s = (
            ref["gain_usd"] / ref["gain_run_s"]
            if ref and ref.get("gain_usd") is not None and ref.get("gain_run_s")
            else None
        )
    left = float(base) - ms
    run_s = ms * per_ms
    return {
        "fix_all_ms_per_iteration": round(ms, 3),
        "fix_all_pct": round(100.0 * ms / float(base), 1),
        "fix_all_speedup_max": round(float(base) / left, 2) if left > 0 else None,
        "fix_all_run_s": round(run_s, 1),
        "fix_all_usd": None if usd_per_s is None else round(run_s * usd_per_s, 2),
        "fix_all_parts_ms": {k: round(v, 3) for k, v in best.items() if v > 0},
        "findings": len([i for i in gained if i.get("gain_ms_per_iteration")]),
    }


def gains_block(ctx: RunContext, insights: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The summary's ``gains``: the iteration's parts (``iteration_ms``,
    ``parts_ms``) and :func:`fix_all` over *insights*; None without steps."""
    it = iteration(ctx)
    if it is None:
        return None
    out: dict[str, Any] = {
        "iteration_ms": round(it.iteration_ms, 3),
        "parts_ms": it.parts(),
        "iterations": it.iterations,
    }
    fixed = fix_all(insights, it.parts(), it.iteration_ms, it.iterations, gpu_usd_per_s(ctx))
    out.update(fixed or _no_fix_all())
    return out


def findings_gains_block(insights: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`gains_block`'s shape from the findings alone (stored findings,
    no context at hand): their iteration, no parts (``parts_ms``,
    ``iterations`` None), :func:`fix_all` without the compute's cap."""
    base = next((i.get("gain_iteration_ms") for i in insights if i.get("gain_parts_ms")), None)
    out: dict[str, Any] = {"iteration_ms": base, "parts_ms": None, "iterations": None}
    out.update(fix_all(insights) or _no_fix_all())
    return out


def _no_fix_all() -> dict[str, Any]:
    return dict.fromkeys(
        (
            "fix_all_ms_per_iteration",
            "fix_all_pct",
            "fix_all_speedup_max",
            "fix_all_run_s",
            "fix_all_usd",
            "fix_all_parts_ms",
        )
    ) | {"findings": 0}


# --- a group's findings ------------------------------------------------------


def group_iteration(ctx: GroupContext) -> tuple[float, float, int] | None:
    """(the job's iteration: the median over ranks of each rank's mean steady
    step, ms; the median rank's mean exposed comm, ms; steady steps) or None."""
    steps = [mean(_steady(r.step_ms)) for r in ctx.ranks if r.step_ms]
    if not steps:
        return None
    comm = [mean(_steady(r.comm_ms)) for r in ctx.ranks if r.comm_ms]
    n = min(len(r.step_ms) for r in ctx.ranks if r.step_ms)
    return median(steps), (median(comm) if comm else 0.0), n


def _group_estimate(ins: Insight, comm_ms: float, step_ms: float) -> Estimate | None:
    ev = ins.evidence
    if ins.rule == "straggler_rank":
        wait = float(ev.get("wait_ms") or 0.0)
        return Estimate(
            {COMM: min(wait, step_ms)},
            f"the other ranks' wait for its backward ({_ms(wait)} per step: their "
            "collective time above its own), removed by balancing it",
        )
    if ins.rule == "comm_dominant":
        shares = list((ev.get("comm_fraction_by_rank") or {}).values())
        share = median([float(s) for s in shares]) if shares else 0.0
        return Estimate(
            {COMM: min(share * step_ms, step_ms)},
            f"the exposed comm (median {share:.0%} of the step across ranks), hidden "
            "under backward",
        )
    if ins.rule == "bucket_skew":
        late = float(ev.get("median_delta_ms") or 0.0)
        return Estimate(
            {COMM: min(late, step_ms)},
            f"the median time the others wait for the late bucket ({_ms(late)} per step)",
        )
    if ins.rule == "rank_skew":
        excess = float(ev.get("median_step_ms") or 0.0) - float(
            ev.get("others_median_step_ms") or 0.0
        )
        return Estimate(
            {RANK: min(max(0.0, excess), step_ms)},
            f"the slow rank's median step above the others' ({_ms(excess)}), the pace "
            "the job runs at",
        )
    return None


def attach_group(ctx: GroupContext, found: Sequence[Insight]) -> list[Insight]:
    """The group rules' *found* with gains, on the job's iteration
    (:func:`group_iteration`) and its steps; no price (a group's GPUs and
    rate are its ranks')."""
    got = group_iteration(ctx)
    out = []
    for ins in found:
        est = None if got is None else _group_estimate(ins, got[1], got[0])
        if est is None or got is None:
            out.append(ins)
            continue
        fields = gain_fields(est, got[0], got[2], None, LABELS.get(ins.rule))
        out.append(dataclasses.replace(ins, gain=fields))
    return out


def group_gains_block(ctx: GroupContext, insights: Sequence[Mapping[str, Any]]) -> dict | None:
    """A group's ``gains``: the job's iteration, its exposed comm and :func:`fix_all`."""
    got = group_iteration(ctx)
    if got is None:
        return None
    parts = {COMM: round(got[1], 3)}
    out: dict[str, Any] = {
        "iteration_ms": round(got[0], 3),
        "parts_ms": parts,
        "iterations": got[2],
    }
    out.update(fix_all(insights, None, got[0], got[2]) or _no_fix_all())
    return out


# --- storage: a gain rides in the evidence ------------------------------------

#: The evidence key a stored finding keeps its gain under (the ``insights``
#: tables have no column of their own for it).
STORED_KEY = "gain"


def to_stored_evidence(ins: Mapping[str, Any]) -> dict[str, Any]:
    """A finding dict's evidence with its gain fields folded in, to store."""
    evidence = dict(ins.get("evidence") or {})
    gain = {k: ins.get(k) for k in GAIN_KEYS if ins.get(k) is not None}
    if gain:
        evidence[STORED_KEY] = gain
    return evidence


def from_stored(d: dict[str, Any]) -> dict[str, Any]:
    """A stored finding dict (evidence with :data:`STORED_KEY`) as
    :meth:`~gpuprof.insights.base.Insight.to_dict` gives it: the gain fields
    at the top level (None where absent)."""
    evidence = dict(d.get("evidence") or {})
    gain = evidence.pop(STORED_KEY, None)
    gain = gain if isinstance(gain, dict) else {}
    return {**d, "evidence": evidence, **{k: gain.get(k) for k in GAIN_KEYS}}
