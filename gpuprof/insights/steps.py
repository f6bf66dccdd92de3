"""Rules on step timing: loader stalls, warm-up, outliers, variance."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

from gpuprof.insights import contention, frames, loading, pattern
from gpuprof.insights.base import WARMUP_STEPS, Insight, RunContext, rule
from gpuprof.insights.loading import DISK_BUSY_BPS
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


def host_wait_fraction(ctx: RunContext) -> float | None:
    """Share (0-1) of iteration time the host spent waiting on the loader —
    before each step and between its micro-batches — step 0 excluded (its wait
    covers model and worker start-up). None if < 2 steps."""
    if ctx.steps < 2:
        return None
    loader = sum(ctx.loader_ms[1:])
    total = sum(ctx.iteration_ms[1:])
    return loader / total if total > 0 else None


def gap_sync_share(ctx: RunContext) -> float | None:
    """Share (0-1) of the inter-step gap's stack samples spent in a device
    sync (:func:`gpuprof.insights.frames.sync_share`; step 0's start-up left
    out); None with timed ``next()`` calls (their wait is the loader's) or
    too few samples."""
    if ctx.explicit_wait:
        return None
    return frames.sync_share(ctx.stack_frames, exclude=ctx.numbers[:1])


def stall_fraction(ctx: RunContext) -> float | None:
    """Share (0-1) of iteration time the loop stalled on the loader: the host's
    wait (:func:`host_wait_fraction`) less what its sampled stacks spent in a
    device sync (:func:`gap_sync_share`: e.g. ``loss.item()`` waiting for the
    queued work), and no more than the GPU can have idled
    (:func:`gpuprof.insights.loading.gpu_starved_share`, when sampled). None
    if < 2 steps."""
    host = host_wait_fraction(ctx)
    if host is None:
        return None
    synced = gap_sync_share(ctx)
    frac = host * (1.0 - synced) if synced else host
    cap = loading.gpu_starved_share(ctx)
    return frac if cap is None else min(frac, cap)


def _wait_kind(ctx: RunContext) -> str:
    return "timed next() calls" if ctx.explicit_wait else "inter-step gap"


@rule("dataloader_stall")
def dataloader_stall(ctx: RunContext) -> Insight | None:
    """Fires when the loader stall (:func:`stall_fraction`: the host's wait,
    no more than the GPU idled) is > :data:`STALL_FRACTION` of iteration time.
    The fix fits what was seen: the DataLoader's settings (never what it
    already does) and whether its workers burned CPU or sat idle
    (:func:`gpuprof.insights.loading.loader_cpu`)."""
    frac = stall_fraction(ctx)
    if frac is None or frac <= STALL_FRACTION:
        return None
    found = _dataloader_stall(ctx, frac)
    host = host_wait_fraction(ctx)
    if host is None or frac >= host:
        return found
    synced = gap_sync_share(ctx)
    util = ctx.gpu.util_mean_pct if ctx.gpu is not None else None
    why = []
    if synced:
        why.append(f"{synced:.0%} of its sampled time was in a device sync (e.g. loss.item())")
    if util is not None:
        why.append(f"NVML read the GPU {util:.0f}% busy")
    return dataclasses.replace(
        found,
        detail=f"{found.detail} (The host waited {host:.0%} of the step time, but "
        f"{' and '.join(why)}: only {frac:.0%} kept the GPU waiting; the rest waited "
        "on work already queued.)",
        evidence={**found.evidence, "gap_sync_share": None if synced is None else round(synced, 4)},
    )


#: Calls of the DataLoader's own machinery: a sample between the steps
#: inside one is the loader wait (timed apart), not the host work around it.
LOADER_CALLS = "torch.utils.data."


@rule("host_work_between_steps")
def host_work_between_steps(ctx: RunContext) -> Insight | None:
    """Fires when the host time between the steps outside a timed loader's
    wait and evaluation (:attr:`~gpuprof.insights.base.RunContext.gap_ms`:
    a checkpoint, logging, a sleep) is > :data:`STALL_FRACTION` of the
    steady iteration time (HIGH above :data:`STALL_FRACTION_HIGH`). Names
    the user's frames the stack sampler caught in those gaps (the loader's
    own calls left out), and the period when the work comes every N steps.
    A loop without a timed loader has this time as its inter-step gap
    (:func:`dataloader_stall`)."""
    if not ctx.gap_ms:
        return None
    lo = WARMUP_STEPS if ctx.steps > 2 * WARMUP_STEPS else 0
    gaps, total = ctx.gap_ms[lo:], sum(ctx.steady_iteration_ms)
    if not gaps or total <= 0:
        return None
    frac = sum(gaps) / total
    if frac <= STALL_FRACTION:
        return None
    mean_gap = sum(gaps) / len(gaps)
    evidence: dict[str, object] = {
        "gap_fraction": round(frac, 4),
        "mean_gap_ms": round(mean_gap, 3),
    }
    host_frames = [f for f in ctx.stack_frames if not f.call.startswith(LOADER_CALLS)]
    periodic = _periodic_gap(ctx, ctx.gap_ms)
    when = ""
    if periodic is not None:
        every, slow_ms, slow_steps = periodic
        evidence.update(every_steps=every, periodic_gap_ms=round(slow_ms, 3))
        top = frames.top_frames(host_frames, steps=set(slow_steps))
        when = f" Every {every} steps it took ~{slow_ms:.0f} ms."
        of = "those pauses"
    else:
        top = frames.top_frames(host_frames, exclude=ctx.numbers[:1])
        of = "the time between steps"
    evidence["frames"] = [f.evidence() for f in top]
    named = (" " + frames.gap_sentence(top, of=of)) if top else ""
    where = f": {top[0].short()}" if top else ""
    every_n = f", every {periodic[0]} steps" if periodic is not None else ""
    if top:
        fix = f"Make {top[0].short()} cheaper, run it less often or off the training thread"
    else:
        fix = (
            "Find the work your loop does after optimizer.step() and before the next batch "
            "(logging, metrics, checkpoints) and make it cheaper, run it less often or off "
            "the training thread"
        )
    return Insight(
        rule="host_work_between_steps",
        severity="HIGH" if frac > STALL_FRACTION_HIGH else "MED",
        title=f"{frac:.0%} of step time spent between steps outside the DataLoader{every_n}{where}",
        detail=f"{mean_gap:.1f} ms per step on average passed between one optimizer step "
        "and the next, in the training loop's own code rather than waiting on the "
        f"DataLoader (its wait is timed apart).{when}{named} The model sits idle meanwhile.",
        fix=fix + " (e.g. save checkpoints from a background thread or with "
        "torch.distributed.checkpoint.async_save; log every N steps, not every step).",
        evidence=evidence,
    )


def wait_per_batch_ms(ctx: RunContext) -> float:
    """The host's mean loader wait per batch (ms): the loader time of every
    step but step 0 (start-up) over its batches (micro-batches when reported,
    else one per step)."""
    return sum(ctx.loader_ms[1:]) / loading.batches_after_first(ctx)


#: A wait per batch below this multiple of
#: :data:`gpuprof.insights.loading.WORKER_BATCH_COST_MS`, with workers that
#: sat idle, is the workers' hand-off itself (the new user's 2-worker
#: TensorDataset loop, 2026-12-04: 1.0 ms per batch, 0.07 ms of it indexing).
HANDOFF_WAIT_FACTOR = 2.0


def _severity(frac: float, per_batch: float) -> str:
    """HIGH above :data:`STALL_FRACTION_HIGH`, unless the wait per batch is
    below what a batch through a worker costs (a stall of microseconds: a
    share of a tiny iteration, not hours to win); else MED."""
    high = frac > STALL_FRACTION_HIGH and per_batch >= loading.WORKER_BATCH_COST_MS
    return "HIGH" if high else "MED"


def _reads(ctx: RunContext) -> str:
    """``the disk read 12 MB/s, 40 IOPS`` or ``the disk was not measured``."""
    bps, iops = ctx.host_disk_read_bps, ctx.host_disk_read_iops
    if bps is None:
        return "the disk was not measured"
    ops = f", {iops:.0f} IOPS" if iops is not None else ""
    return f"the disk read {bps / 1e6:.0f} MB/s{ops}"


def _dataloader_stall(ctx: RunContext, frac: float) -> Insight:
    host = host_wait_fraction(ctx) or frac
    # the wait the GPU felt: the host's, scaled down where NVML saw the GPU busy
    mean_wait = sum(ctx.loader_ms[1:]) / (ctx.steps - 1) * frac / host
    per_batch = wait_per_batch_ms(ctx)
    severity = _severity(frac, per_batch)
    cpu = loading.loader_cpu(ctx, frac)
    evidence: dict[str, object] = {
        "stall_fraction": round(frac, 4),
        "mean_wait_ms": round(mean_wait, 3),
        "wait_per_batch_ms": round(per_batch, 4),
    }
    if frac < host:
        evidence["host_wait_fraction"] = round(host, 4)
    periodic = _periodic_gap(ctx) if not ctx.explicit_wait else None
    if periodic is not None:  # one pause every N steps: periodic host work, not loading
        every, slow_ms, slow_steps = periodic
        evidence["every_steps"] = every
        evidence["periodic_gap_ms"] = round(slow_ms, 3)
        # the frames of the slow gaps: what the pause is
        top = frames.top_frames(ctx.stack_frames, steps=set(slow_steps))
        evidence["frames"] = [f.evidence() for f in top]
        what = f" ({top[0].short()})" if top else ""
        named = (" " + frames.gap_sentence(top, of="those pauses")) if top else ""
        return Insight(
            rule="dataloader_stall",
            severity=severity,
            title=f"{frac:.0%} of step time spent between steps, every {every} steps "
            f"(periodic inter-step gap{': ' + top[0].short() if top else ''})",
            detail=f"Every {every} steps, ~{slow_ms:.0f} ms between steps{what}; "
            f"{mean_wait:.1f} ms per step on average.{named} Periodic host work outside "
            "the steps (a checkpoint save, evaluation, a log flush), not the input pipeline.",
            fix="Make that periodic work cheaper or move it off the training thread (e.g. "
            "save checkpoints from a background thread or with "
            "torch.distributed.checkpoint.async_save), or run it less often.",
            evidence=evidence,
        )
    if not ctx.explicit_wait:  # no timed DataLoader: whatever ran between the steps
        # every gap but the first step's (start-up), those past the shim's
        # per-step bound (merged) included
        top = frames.top_frames(ctx.stack_frames, exclude=ctx.numbers[:1])
        evidence["frames"] = [f.evidence() for f in top]
        if top:
            named = " " + frames.gap_sentence(top)
            fix = (
                f"Make {top[0].short()} cheaper, run it less often or off the training "
                "thread; if it is your input pipeline, run it in a DataLoader with "
                "num_workers > 0, or wrap it with prof.wrap_dataloader() so gpuprof can time it."
            )
        else:
            named = ""
            fix = (
                "Find that work (e.g. torch.profiler around a few steps); if it is your input "
                "pipeline, run it in a DataLoader with num_workers > 0, or wrap it with "
                "prof.wrap_dataloader() so gpuprof can time it."
            )
        return Insight(
            rule="dataloader_stall",
            severity=severity,
            title=f"{frac:.0%} of step time spent between steps (inter-step gap)",
            detail=f"{mean_wait:.1f} ms per step on average passed between one optimizer "
            "step and the next forward, outside any timed DataLoader: making inputs, "
            f"logging, evaluation or other host work.{named}",
            fix=fix,
            evidence=evidence,
        )
    evidence["loader_busy"] = cpu.busy
    evidence["loader_cores"] = None if cpu.cores is None else round(cpu.cores, 3)
    evidence.update(loading.config_evidence(ctx))
    detail = (
        f"The training loop waited {mean_wait:.1f} ms per step on average for "
        "the next batch; the model sat idle meanwhile."
    )
    settings = loading.setting_fixes(ctx, cpu, per_batch)
    workers_top = frames.top_frames(ctx.stack_frames, source="loader")
    evidence["loader_frames"] = [f.evidence() for f in workers_top]
    cfg = loading.main_loader(ctx)
    cost = loading.WORKER_BATCH_COST_MS
    after = ""  # a sentence after the settings
    near_handoff = (
        cfg is not None and cfg.num_workers > 0 and per_batch < HANDOFF_WAIT_FACTOR * cost
    )
    making = loading.batch_making(ctx)
    if making.cpu_ms is not None:
        evidence["making_cpu_ms_per_batch"] = round(making.cpu_ms, 3)
    if making.switches is not None:
        evidence["making_switches_per_batch"] = round(making.switches, 1)
    # num_workers=0 only for batches measured cheaper to make than to hand over:
    # workers that wait on latency keep that latency off the loop
    handoff = (
        cfg is not None
        and cfg.num_workers > 0
        and making.cheap is True
        and (near_handoff or (making.cpu_ms or 0.0) < per_batch)
    )
    if near_handoff and making.cheap is None:
        detail += (
            f" The wait per batch ({per_batch:.2f} ms) is about what a batch through a "
            f"worker process costs (~{cost:.1f} ms), but the workers were not measured, "
            "so what a batch costs to make is not known: if it is cheaper than that, "
            "num_workers=0 is faster; if it waits (storage, network), more workers are."
        )
        fix = "Time one run with num_workers=0 against this one"
        settings = []
    elif handoff:  # batches cheap to make, a wait about one hand-off long
        idle = (
            f" Its {cpu.workers} worker(s) sat idle meanwhile ({cpu.cores:.2f} core each), and the"
            if cpu.busy is False and cpu.workers and cpu.cores is not None
            else " The"
        )
        than = (
            f"is about what a batch through a worker process costs (~{cost:.1f} ms)"
            if near_handoff
            else "is more than the workers' CPU to make one"
        )
        detail += (
            f"{idle} wait per batch ({per_batch:.2f} ms) {than}: the loop waits on the "
            "hand-off from the workers, not on the loading. They made each batch with "
            f"{making.cpu_ms or 0.0:.2f} ms of CPU and no waits, less than its hand-off costs."
        )
        fix = (
            "Load in the training process (num_workers=0): batches this cheap cost more "
            "to hand over from a worker than to make"
        )
        settings = []
    elif cpu.busy is False and cpu.workers:
        idle = f" Its {cpu.workers} worker(s) sat idle meanwhile ({cpu.cores:.2f} core each)"
        saturated = loading.source_saturated(ctx)
        evidence["source_saturated"] = saturated
        if saturated:
            detail += (
                f"{idle} while {_reads(ctx)}: the source is saturated (the disk reads at "
                "the rate it reaches), so more workers of the same kind will not make it "
                "faster."
            )
            if workers_top:
                detail += " " + frames.loader_sentence(workers_top, verb="wait")
            fix = (
                "Read less or from a faster source: copy the data to local NVMe or RAM "
                "(/dev/shm), pack small files into shards, or cache decoded samples"
            )
            settings = [x for x in settings if not x.startswith("raise num_workers")]
        else:
            detail += (
                f"{idle}: the loading waits (a sleep, network or storage latency, a lock) "
                f"rather than computes, and the source is not saturated ({_reads(ctx)}), "
                "so more workers, each waiting on its own batch, keep more of those waits "
                "in flight."
            )
            if workers_top:
                detail += " " + frames.loader_sentence(workers_top, verb="wait")
            fix = "Keep more batches in flight"
            after = (
                f" Or make {workers_top[0].short()} wait less (cache the data locally or "
                "read it asynchronously)."
                if workers_top
                else " Or find what __getitem__ or collate_fn waits on (py-spy dump --pid of "
                "a worker) and cache the data locally or read it asynchronously."
            )
    elif cfg is not None and cfg.num_workers == 0 and per_batch < cost:
        detail += (
            f" At {per_batch:.2f} ms per batch the loading is already cheaper than a batch "
            f"through a worker process costs (~{cost:.1f} ms), so worker processes would "
            "make it slower."
        )
        fix = (
            "Keep num_workers=0 and make each batch cheaper to fetch: index the data a batch "
            "at a time (for a TensorDataset: DataLoader(ds, batch_size=None, "
            "sampler=BatchSampler(RandomSampler(ds), batch_size, drop_last=False))), or use "
            "larger batches"
        )
        settings = [x for x in settings if x.startswith("set pin_memory")]
    elif cpu.busy is False:
        main_top = frames.top_frames(ctx.stack_frames, exclude=ctx.numbers[:1])
        evidence["frames"] = [f.evidence() for f in main_top]
        detail += " The loading burned no CPU meanwhile: it waits (I/O, a lock, a sleep)."
        if main_top:
            detail += " " + frames.gap_sentence(main_top)
        fix = (
            f"Overlap the waits in {main_top[0].short()}"
            if main_top
            else "Find what the loading waits on (storage or network latency, a sleep)"
        )
    else:
        fix = "Make loading keep up with the step"
        if not settings:
            settings = ["move augmentations to the GPU or precompute them"]
    fix = (fix + ": " + "; ".join(settings) + ".") if settings else fix + "."
    fix += after
    return Insight(
        rule="dataloader_stall",
        severity=severity,
        title=f"{frac:.0%} of step time waiting on the loader ({_wait_kind(ctx)})",
        detail=detail,
        fix=fix,
        evidence=evidence,
    )


#: A gap below this (ms) is never a slow one, whatever the median gap: loops
#: with next to nothing between steps have a median gap near 0 ms.
GAP_SLOW_MIN_MS = 1.0


def _periodic_gap(
    ctx: RunContext, per_step: Sequence[float] | None = None
) -> tuple[int, float, list[int]] | None:
    """(N, median slow gap ms, the slow gaps' step numbers) when the
    inter-step gap (*per_step*, ms: the loader time by default) is long
    every N steps
    through the whole steady run, with :func:`high_step_variance`'s guards
    (≥ :data:`VARIANCE_MIN_STEPS` steady steps, ≥ :data:`VARIANCE_MIN_SLOW_STEPS`
    gaps over :data:`VARIANCE_RATIO` × the median gap losing ≥
    :data:`VARIANCE_MIN_EXCESS_MS`, more repeats on a contended host); else None."""
    all_gaps = ctx.loader_ms if per_step is None else per_step
    gaps = all_gaps[WARMUP_STEPS:]
    if len(gaps) < VARIANCE_MIN_STEPS:
        return None
    p50 = percentile(gaps, 50)
    floor = max(VARIANCE_RATIO * p50, GAP_SLOW_MIN_MS)
    slow_idx = [WARMUP_STEPS + i for i, g in enumerate(gaps) if g > floor]
    excess = [all_gaps[i] - p50 for i in slow_idx]
    if len(slow_idx) < VARIANCE_MIN_SLOW_STEPS or sum(excess) < VARIANCE_MIN_EXCESS_MS:
        return None
    during, _ = _others_slow_rest(ctx, slow_idx, excess)
    busy = _host_contended(ctx, during)
    repeats = VARIANCE_PERIOD_MIN_REPEATS_CONTENDED if busy else pattern.PERIODIC_MIN_REPEATS
    numbers = ctx.numbers
    slow_at = [numbers[i] for i in slow_idx]
    found = pattern.period(slow_at, numbers[WARMUP_STEPS:], excess, repeats)
    if found is None:
        return None
    return found.every, median([all_gaps[i] for i in slow_idx]), slow_at


def _loader_starved(ctx: RunContext) -> tuple[float, float | None] | None:
    """(cores other processes held, share of steps contended or None) when
    others starve the run: host CPU during the steps > :data:`CPU_BOUND_PCT`,
    others hold ≥ :data:`gpuprof.insights.contention.CONTENDED_OTHER_CORES`
    and the run's own processes (:func:`own_cpu_cores`) less than
    :data:`RUN_SHARE_OF_BUSY_CPU` of the busy cores; else None."""
    host, n = ctx.host_cpu_pct, ctx.cpu_count
    own, _ = own_cpu_cores(ctx)
    if host is None or own is None or not n or host <= CPU_BOUND_PCT:
        return None
    busy = host / 100.0 * n
    others = max(0.0, busy - own)
    if others < contention.CONTENDED_OTHER_CORES or own >= RUN_SHARE_OF_BUSY_CPU * busy:
        return None
    return others, contention.contended_share(ctx, 1)


# A CPU-bound stall is also a stall; when others starve the workers, it is the
# stall with contention as its cause, so it also carries host_cpu_contention.
@rule(
    "cpu_bound_dataloader",
    supersedes=("dataloader_stall", "host_cpu_contention"),
    folds={"host_cpu_contention": ("cause", "contention")},
)
def cpu_bound_dataloader(ctx: RunContext) -> Insight | None:
    """Fires on a stall (> :data:`STALL_FRACTION`) of a timed DataLoader (an
    untimed inter-step gap is :func:`dataloader_stall`'s) whose loading burns CPU
    (:func:`gpuprof.insights.loading.loader_cpu`; silent when that is
    unmeasured: a pegged host alone does not say whose CPU it is) while the disk is not the
    busy part (< :data:`DISK_BUSY_BPS` read, or unmeasured). The cause named:
    other processes hold the CPU while the run's own use is the smaller part
    (:func:`_loader_starved`): the workers are starved; else the
    host is pegged (> :data:`CPU_BOUND_PCT`) by the run itself: the loading's
    work is too much for the cores; else cores sat idle: more workers help.
    A CPU run's own CPU-bound loading measured under contention
    (:func:`gpuprof.insights.contention.measured_under_contention`) is also
    told to free the cores the other processes held (evidence
    ``other_cores_to_free``): its step's full CPU, which the gain counts,
    needs them too."""
    frac = stall_fraction(ctx)
    if frac is None or frac <= STALL_FRACTION:
        return None
    if not ctx.explicit_wait:  # no timed DataLoader: the gap is host work, not loader workers
        return None
    if ctx.host_disk_read_bps is not None and ctx.host_disk_read_bps > DISK_BUSY_BPS:
        return None
    cpu = loading.loader_cpu(ctx, frac)
    host = ctx.host_cpu_pct
    if not cpu.busy:  # idle, or unmeasured: a pegged host alone does not say whose CPU
        return None
    cfg = loading.main_loader(ctx)
    in_process = cfg is not None and cfg.num_workers == 0
    per_batch = wait_per_batch_ms(ctx)
    if in_process and per_batch < loading.WORKER_BATCH_COST_MS:
        return None  # cheaper than a worker's hand-off: the stall finding says what helps
    making = loading.batch_making(ctx)
    if (
        not in_process
        and making.cheap
        and (
            per_batch < HANDOFF_WAIT_FACTOR * loading.WORKER_BATCH_COST_MS
            or (making.cpu_ms or 0.0) < per_batch
        )
    ):
        # batches cheaper to make than to hand over, busy host or not: the
        # stall finding's hand-off advice is what helps
        return None
    who = "the loading (num_workers=0) is" if in_process else "the workers are"
    own, ranks = own_cpu_cores(ctx)
    n = ctx.cpu_count
    of = f" of {n}" if n else ""
    starved = _loader_starved(ctx)
    settings = loading.setting_fixes(ctx, cpu, per_batch)
    on_gpu = bool(ctx.gpu_model or ctx.gpu_count)  # a CPU run has no GPU to move work to
    head = f"{frac:.0%} of step time waiting on the loader"
    to_free: float | None = None  # the cores others held, freed in the gain (own stall, CPU run)
    if starved is not None:
        others, share = starved
        title = f"{head}; {who} starved of CPU: other processes hold {others:.1f}{of} cores"
        during = f" during {share:.0%} of the steps" if share is not None else ""
        detail = (
            f"The loading burns CPU, and other processes kept the host busy{during} "
            f"(host CPU {host:.0f}%, this run {own:.1f} cores): the loader gets a fraction "
            "of the cores it asks for, so the loop waits. This run's timings are slower "
            "than on an idle host."
        )
        fix = (
            "Run on an idle node or reserve cores for the job (Slurm --exclusive, cgroup "
            "cpusets, taskset); find the other processes with top. More DataLoader "
            "workers compete for the same cores and won't help."
        )
        pools = len(ctx.worker_pools)
        if cfg is not None and cfg.num_workers > 0 and not cfg.persistent_workers and pools > 1:
            # each epoch's new workers start (spawn, imports, dataset copy) on the
            # same scarce cores, and the loop waits for their first batches
            fix += (
                f" Meanwhile set persistent_workers=True: the workers started anew "
                f"{pools} times in this run (each epoch), every start a wait on those cores."
            )
    elif host is not None and host > CPU_BOUND_PCT:
        across = f" across {n} cores" if n else ""
        title = f"{head}; {who} CPU-bound (host CPU {host:.0f}%{across})"
        detail = (
            "The loop waits on batches while every core is busy with the run's own "
            "loading: its Python work (decoding, augmentation) is the bottleneck."
        )
        fix = (
            "Move augmentations to the GPU (torchvision.transforms.v2 on CUDA tensors, "
            "kornia) or precompute them; more workers won't help on cores already busy."
            if on_gpu
            else "Precompute the augmentations or make them cheaper (fewer passes, smaller "
            "inputs, vectorised ops); more workers won't help on cores already busy."
        )
        # a CPU run's step also lost the cores others held: cheaper loading alone
        # gives them back to whoever wants them, so the fix names both
        busy = None if on_gpu else contention.measured_under_contention(ctx)
        if busy is not None and busy["other_cores"] is not None:
            to_free = busy["other_cores"]
            fix += (
                f" Other processes also held {to_free:.1f}{of} cores during "
                f"{busy['share_of_steps']:.0%} of the steps, slowing the step as the workers "
                "do: stop them or reserve cores for the job (Slurm --exclusive, cgroup "
                "cpusets, taskset); find them with top."
            )
    else:
        idle = f" with {100 - host:.0f}% of the host idle" if host is not None else ""
        title = f"{head}; the loading is CPU-bound{idle}"
        detail = (
            "The loading computes (decoding, augmentation) and does not keep up, while "
            "the host still has cores to spare."
        )
        fix = (
            "Spread the loading over the idle cores"
            + (": " + "; ".join(settings) if settings else "")
            + (
                "; or move augmentations to the GPU or precompute them."
                if on_gpu
                else "; or precompute the augmentations."
            )
        )
    held = loading.competing_workers(ctx) if starved is None else None
    if held is not None:  # a CPU run: the workers' cores are the step's too
        detail += (
            f" The workers also slow the step: they held {held:.1f} of the {n} cores its "
            "compute runs on, so cheaper loading speeds the compute too."
        )
    # which of the loading's code burns it (the workers' sampled stacks)
    hot = frames.top_frames(ctx.stack_frames, source="loader")
    if hot:
        detail += " " + frames.loader_sentence(hot)
        fix = f"Make {hot[0].short()} cheaper. {fix}"
    return Insight(
        rule="cpu_bound_dataloader",
        severity="HIGH",
        title=title,
        detail=detail,
        fix=fix,
        evidence={
            "loader_frames": [f.evidence() for f in hot],
            "stall_fraction": round(frac, 4),
            "host_cpu_pct": None if host is None else round(host, 1),
            "run_cpu_cores": None if ctx.run_cpu_cores is None else round(ctx.run_cpu_cores, 2),
            "own_cpu_cores": None if own is None else round(own, 2),
            "job_ranks": ranks,
            "loader_cores": None if cpu.cores is None else round(cpu.cores, 3),
            # the run's own CPU unmeasured: the host is pegged, by whom is not known
            "cause": "contention" if starved else "own" if own is not None else None,
            "other_cores": None if starved is None else round(starved[0], 2),
            # the run's own CPU-bound loading beside other processes on a CPU run:
            # the cores they held during the contended steps, freed too in the gain
            "other_cores_to_free": None if to_free is None else round(to_free, 2),
            # the cores busy workers took from a CPU run's step (None: not that case)
            "worker_cores_competing": None if held is None else round(held, 2),
            **loading.config_evidence(ctx),
        },
    )


def _warmup_excess(ctx: RunContext, reference_ms: float) -> tuple[int, float]:
    """(leading steps slower than :data:`WARMUP_RATIO` × *reference_ms*, the
    time they took beyond it in ms)."""
    slow = next(
        (i for i, s in enumerate(ctx.step_ms) if s <= WARMUP_RATIO * reference_ms), ctx.steps
    )
    return slow, sum(s - reference_ms for s in ctx.step_ms[:slow])


#: A later step at least this share of step 0's time means the slowness recurs:
#: step 0 was not one-off work (a loop whose later steps reach 420 ms from CPU
#: competition is not warming up at 86 ms); a 3.2 s torch.compile step 0 is
#: never approached by a 200 ms checkpoint step.
WARMUP_RECUR_FRACTION = 0.5
#: Share of the slow first steps that ran contended, above that of the steady
#: steps, at which they were slowed by other processes, not by one-off work.
WARMUP_CONTENDED_EXCESS = 0.3


def _one_off(ctx: RunContext, slow: int) -> bool:
    """True when the first *slow* steps' slowness is one-off: no later step
    comes within :data:`WARMUP_RECUR_FRACTION` of step 0, and the slow steps
    were not contended much more than the rest (:mod:`gpuprof.insights.contention`)."""
    first = ctx.step_ms[0]
    if any(s >= WARMUP_RECUR_FRACTION * first for s in ctx.step_ms[max(slow, 1) :]):
        return False
    flags = contention.contended(ctx)
    lead = [f for f in flags[:slow] if f is not None]
    rest = [f for f in flags[slow:] if f is not None]
    if lead and rest:
        return sum(lead) / len(lead) - sum(rest) / len(rest) < WARMUP_CONTENDED_EXCESS
    return True


def _exclude(slow: int) -> str:
    return "step 0" if slow <= 1 else f"steps 0–{slow - 1}"


@rule("compilation_warmup")
def compilation_warmup(ctx: RunContext) -> Insight | None:
    """Fires when step 0's compute takes > :data:`WARMUP_RATIO` × the
    steady-state median (steps after the first :data:`WARMUP_STEPS`), the
    slow first steps cost ≥ :data:`MIN_WARMUP_EXCESS_MS` beyond it, and the
    slowness is one-off (:func:`_one_off`: it does not recur later and was
    not contention)."""
    if ctx.steps <= 2 * WARMUP_STEPS:
        return None
    steady = median(ctx.step_ms[WARMUP_STEPS:])
    first = ctx.step_ms[0]
    if steady <= 0 or first <= WARMUP_RATIO * steady:
        return None
    slow, excess = _warmup_excess(ctx, steady)
    if excess < MIN_WARMUP_EXCESS_MS or not _one_off(ctx, slow):
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
    of one-off time as :func:`compilation_warmup` (which it then replaces),
    one-off as there (:func:`_one_off`)."""
    if ctx.steps < 3:
        return None
    rest = median(ctx.step_ms[1:])
    first = ctx.step_ms[0]
    if rest <= 0 or first <= FIRST_STEP_OUTLIER_RATIO * rest:
        return None
    slow, excess = _warmup_excess(ctx, rest)
    if excess < MIN_WARMUP_EXCESS_MS or not _one_off(ctx, slow):
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


#: Share of the time the slow steps lost that must be lost on contended
#: steps, with others' cores on them (weighted by that time) above the
#: rest's by :data:`VARIANCE_CONTENTION_EXCESS_CORES`, for the spread to
#: coincide with other processes' CPU. Weighted by lost time, as
#: :func:`gpuprof.insights.pattern.period` is: on a busy host a loaded
#: scheduler leaves many short slow steps all through the run, and they must
#: not outvote the few bursts that lost most of the time.
VARIANCE_CONTENDED_SHARE = 0.6
VARIANCE_CONTENTION_EXCESS_CORES = 0.3


def _contended_loss(ctx: RunContext, slow: list[int], excess: list[float]) -> float | None:
    """Share (0-1) of the time the slow steps at *slow* lost (*excess*, ms
    each) that was lost on contended steps (:func:`gpuprof.insights.contention.contended`),
    among those sampled; None when none was."""
    flags = contention.contended(ctx)
    sampled = [
        (flags[i], w)
        for i, w in zip(slow, excess, strict=True)
        if i < len(flags) and flags[i] is not None
    ]
    lost = sum(w for _, w in sampled)
    return sum(w for f, w in sampled if f) / lost if lost > 0 else None


def _others_slow_rest(
    ctx: RunContext, slow: list[int], excess: list[float]
) -> tuple[float | None, float | None]:
    """(others' cores on the slow steps, weighted by the ms each lost; their
    mean on the other steady steps); None where unsampled."""
    slow_set = set(slow)
    rest = [i for i in range(WARMUP_STEPS, ctx.steps) if i not in slow_set]
    return contention.others_on(ctx, slow, excess), contention.others_on(ctx, rest)


def _coincide(share: float | None, during: float | None, rest: float | None) -> bool:
    """True when the slow steps coincide with other processes' CPU: at least
    :data:`VARIANCE_CONTENDED_SHARE` of their lost time (*share*,
    :func:`_contended_loss`) on contended steps, and others' cores on them
    (*during*) above those on the *rest* by :data:`VARIANCE_CONTENTION_EXCESS_CORES`."""
    return (
        share is not None
        and share >= VARIANCE_CONTENDED_SHARE
        and during is not None
        and rest is not None
        and during - rest >= VARIANCE_CONTENTION_EXCESS_CORES
    )


#: Repetitions the interval needs when other processes contended the host
#: during the run (:func:`_host_contended`) instead of
#: :data:`gpuprof.insights.pattern.PERIODIC_MIN_REPEATS`: a busy host's
#: scheduler leaves short slow steps all through the run and in episodes of
#: load, and among so many, four to nine that fall N apart over a short run
#: are chance often enough; ten in a row, across the run, are not.
VARIANCE_PERIOD_MIN_REPEATS_CONTENDED = 10
#: Share of the time the slow steps lost that must be lost on steps right
#: after one gpuprof profiled (its trace windows, its FLOP count: left out of
#: the timing figures) for the spread to be put on gpuprof's tracing, as
#: :data:`VARIANCE_CONTENDED_SHARE` puts it on other processes.
VARIANCE_AFTER_TRACE_SHARE = 0.6


def _host_contended(ctx: RunContext, during: float | None) -> bool:
    """True when other processes contended the host during the steady run: at
    least :data:`gpuprof.insights.contention.MEASURED_UNDER_CONTENTION_SHARE`
    of its sampled steps were contended, or others held ≥
    :data:`gpuprof.insights.contention.CONTENDED_OTHER_CORES` on the slow
    steps (*during*: weighted by the time each lost)."""
    share = contention.contended_share(ctx, WARMUP_STEPS)
    return (share is not None and share >= contention.MEASURED_UNDER_CONTENTION_SHARE) or (
        during is not None and during >= contention.CONTENDED_OTHER_CORES
    )


def _after_trace(ctx: RunContext, slow: list[int], excess: list[float]) -> tuple[int, float]:
    """(how many of the slow steps numbered *slow* ran right after a step
    gpuprof profiled, the share (0-1) of the time they lost, *excess* ms each,
    that those lost)."""
    traced = set(ctx.traced_step_numbers)
    if not traced:
        return 0, 0.0
    # the step before n is the one recorded last before it, timed or traced:
    # n - 1 only when the loop numbers its steps 0, 1, 2 (prof.step(i * 32) does not)
    recorded = sorted(traced.union(ctx.numbers))
    hit = [
        w
        for n, w in zip(slow, excess, strict=True)
        if (k := bisect.bisect_left(recorded, n)) and recorded[k - 1] in traced
    ]
    total = sum(excess)
    return len(hit), sum(hit) / total if total > 0 else 0.0


@rule("high_step_variance")
def high_step_variance(ctx: RunContext) -> Insight | None:
    """Fires when steady-state p99/p50 of step compute time (loader wait
    excluded: that is the stall rules' job) > :data:`VARIANCE_RATIO` (needs
    :data:`VARIANCE_MIN_STEPS` steady steps, of which at least
    :data:`VARIANCE_MIN_SLOW_STEPS` are that slow, losing
    ≥ :data:`VARIANCE_MIN_EXCESS_MS` in all). Steps are named by their
    numbers in the run (:attr:`RunContext.numbers`). Says the slow steps
    follow gpuprof's own trace windows when they lost ≥
    :data:`VARIANCE_AFTER_TRACE_SHARE` of the time right after them
    (:func:`_after_trace`); says "every N steps" only when the slow steps
    recur at a regular interval through the whole steady run
    (:func:`gpuprof.insights.pattern.period`; at least
    :data:`VARIANCE_PERIOD_MIN_REPEATS_CONTENDED` times on a host other
    processes contended, :func:`_host_contended`), else names the bursts
    (:func:`gpuprof.insights.pattern.bursts`; the ones that lost the most
    time when there are many); and says when they coincide with other
    processes' CPU (:func:`_coincide`), or ran while others held the host as
    much as in the rest of the run (then it names no cause in the loop)."""
    steady = ctx.step_ms[WARMUP_STEPS:]
    if len(steady) < VARIANCE_MIN_STEPS:
        return None
    p50, p99 = percentile(steady, 50), percentile(steady, 99)
    if p50 <= 0 or p99 <= VARIANCE_RATIO * p50:
        return None
    slow_idx = [WARMUP_STEPS + i for i, ms in enumerate(steady) if ms > VARIANCE_RATIO * p50]
    slow = len(slow_idx)
    excess_ms = sum(ctx.step_ms[i] - p50 for i in slow_idx)
    if slow < VARIANCE_MIN_SLOW_STEPS or excess_ms < VARIANCE_MIN_EXCESS_MS:
        return None
    excess = [ctx.step_ms[i] - p50 for i in slow_idx]
    numbers = ctx.numbers
    slow_at = [numbers[i] for i in slow_idx]
    share = _contended_loss(ctx, slow_idx, excess)
    during, rest = _others_slow_rest(ctx, slow_idx, excess)
    busy = _host_contended(ctx, during)
    repeats = VARIANCE_PERIOD_MIN_REPEATS_CONTENDED if busy else pattern.PERIODIC_MIN_REPEATS
    found = pattern.period(slow_at, numbers[WARMUP_STEPS:], excess, repeats)
    every = found.every if found is not None else None
    runs = pattern.bursts(slow_at)
    lost = pattern.burst_loss(runs, slow_at, excess)
    at = pattern.bursts_text(runs, lost)
    traced, traced_share = _after_trace(ctx, slow_at, excess)
    head = (
        f"Step compute time is erratic: p99 {p99:.1f} ms is {p99 / p50:.1f}× the "
        f"median ({p50:.1f} ms)"
    )
    ran = f"{slow} steps ran over {VARIANCE_RATIO:g}× the median"
    if traced_share >= VARIANCE_AFTER_TRACE_SHARE:
        where = f"every {every} steps," if every is not None else f"steps at {at}"
        title = f"{head}; slow {where} right after gpuprof's own trace windows"
        detail = (
            f"{ran}; {traced} of them ran right after a step gpuprof profiled (a trace "
            f"window or its FLOP count, left out of the timing figures) and lost "
            f"{traced_share:.0%} of the time: the slowdown follows gpuprof's tracing, "
            "not your training loop."
        )
        fix = (
            "Trace less often (a larger trace_every_n_steps, a lower continuous_traces_hz) "
            "or not at all while you time the run; if steps stay slow without tracing, "
            "profile one of them (torch.profiler with a schedule around it)."
        )
    elif found is not None:
        title = f"{head}; slow every {every} steps"
        on = [n for n in slow_at if n % found.every == found.phase]
        detail = (
            f"{ran}, one every {every} steps through the whole steady run (steps "
            f"{on[0]} to {on[-1]}, slow {found.repeats} of the {found.lattice} times): "
            "periodic work inside the loop."
        )
        fix = (
            f"Look for what runs every {every} steps: logging, checkpointing, evaluation "
            "or .item() syncs; make it rarer or asynchronous."
        )
    elif _coincide(share, during, rest):
        title = f"{head}; slow steps at {at} coincide with other processes' CPU"
        detail = (
            f"{ran}, and other processes used {during:.2f} cores during them against "
            f"{rest:.2f} in the rest of the run: the spread is the host's, not the "
            "training code's."
        )
        fix = (
            "Measure on an idle node or reserve cores (Slurm --exclusive, cgroup cpusets, "
            "taskset); find the other processes with top."
        )
    elif share is not None and share >= VARIANCE_CONTENDED_SHARE and during is not None:
        # contended, and so was the rest: the host's share and the loop's own
        # causes cannot be told apart, so no cause in the loop is named
        elsewhere = f", {rest:.2f} on the other steps" if rest is not None else ""
        title = f"{head}; slow in bursts at steps {at}, on a host busy with other processes"
        detail = (
            f"{ran}, in irregular bursts (no regular interval), while other processes "
            f"held the host ({during:.2f} cores during them{elsewhere}): on a host this "
            "busy the CPU the loop gets comes and goes, and the spread cannot be told "
            "apart from the host's."
        )
        fix = (
            "Measure on an idle node or reserve cores (Slurm --exclusive, cgroup cpusets, "
            "taskset) first; if the bursts remain, profile one (torch.profiler with a "
            "schedule around those steps)."
        )
    elif (held := loading.competing_workers(ctx)) is not None:
        # no one else's CPU: the run's own loader workers took the step's cores
        n = ctx.cpu_count
        title = (
            f"{head}; slow in bursts at steps {at}, while the DataLoader workers held "
            f"{held:.1f} of {n} cores"
        )
        detail = (
            f"{ran}, in irregular bursts, while the run's own DataLoader workers used "
            f"{held:.1f} of the host's {n} cores (host CPU {ctx.host_cpu_pct:.0f}%): the "
            "training step computes on the same cores and gets what the workers leave, "
            "so its compute is slower and uneven."
        )
        hot = frames.top_frames(ctx.stack_frames, source="loader")
        if hot:
            detail += " " + frames.loader_sentence(hot)
        what = f"the workers' {hot[0].short()}" if hot else "the workers' work"
        fix = (
            f"Make {what} cheaper or precompute it, or leave the step its cores: fewer "
            "workers, or torch.set_num_threads() to the cores the workers leave."
        )
    else:
        title = f"{head}; slow in bursts at steps {at}"
        quiet = (
            ", while other processes held little CPU"
            if during is not None and during < contention.CONTENDED_OTHER_CORES
            else ""
        )
        detail = f"{ran}, in irregular bursts (no regular interval){quiet}."
        fix = (
            "Profile a slow burst (torch.profiler with a schedule around those steps); "
            "look for GC pauses (gc.freeze() after setup), memory growth or a "
            "background thread."
        )
    return Insight(
        rule="high_step_variance",
        severity="MED",
        title=title,
        detail=detail,
        fix=fix,
        evidence={
            "p50_ms": round(p50, 3),
            "p99_ms": round(p99, 3),
            "slow_steps": slow,
            "excess_ms": round(excess_ms, 1),
            "slow_step_numbers": slow_at[:64],
            "period_steps": every,
            # slow steps on the interval's lattice, the lattice's steps over the
            # steady run, the repetitions it needed (more on a contended host)
            "period_repeats": None if found is None else found.repeats,
            "period_lattice_steps": None if found is None else found.lattice,
            "period_min_repeats": repeats,
            "host_contended": busy,
            # slow steps right after a step gpuprof profiled, the share of the time they lost
            "after_trace_steps": traced,
            "after_trace_loss_share": round(traced_share, 3),
            # the heaviest (by time lost), in step order; burst_count: all of them
            "bursts": [list(r) for r in pattern.heaviest(runs, lost, 32)],
            "burst_count": len(runs),
            # others' cores on the slow steps (weighted by the time each lost), on
            # the rest; the share of the lost time lost on contended steps
            "other_cores_slow": None if during is None else round(during, 2),
            "other_cores_rest": None if rest is None else round(rest, 2),
            "contended_loss_share": None if share is None else round(share, 3),
        },
    )
