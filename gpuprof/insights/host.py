"""Host rules from psutil samples: an I/O-bound loader, a cold page cache, a
page cache too small for the dataset, swapping, DataLoader workers that
do unequal shares of the loading, and other processes competing for the CPU.

They read the host aggregates of :class:`RunContext` (whole host, not just
the run: a neighbour's reads count too; the worker CPU is the run's own; a
torchrun job's ranks on the host count as the job's own CPU, not as others). A
reading the platform does not offer is None and the rule that needs it stays
silent.
"""

from __future__ import annotations

from gpuprof.insights.base import Insight, RunContext, WorkerPool, rule
from gpuprof.insights.loading import loader_cpu, source_saturated
from gpuprof.insights.steps import (
    CPU_BOUND_PCT,
    RUN_SHARE_OF_BUSY_CPU,
    STALL_FRACTION,
    STALL_FRACTION_HIGH,
    own_cpu_cores,
    stall_fraction,
)

_MB = 1e6

#: Seed rule table: the first third of the run reading ≥ 3× what the last
#: third reads means the page cache warmed up (epoch 1 from disk, later from RAM).
COLD_CACHE_READ_RATIO = 3.0
#: First-third reads below this (bytes/s) are too little to slow a loader:
#: a 3× drop from 3 MB/s of log and checkpoint traffic is not a cold cache.
COLD_CACHE_MIN_READ_BPS = 50 * _MB
#: Share of the iterations' speed-up (first third's median - last third's)
#: the loader wait's own drop must make: a wait easing 16 -> 15.9 ms while
#: iterations halve is warm-up or a quieter host, not the page cache.
COLD_CACHE_LOADER_SHARE_OF_SPEEDUP = 0.25
#: Seed rule table: page cache at ≥ 40 % of RAM is a cache that has filled
#: what the host could spare it (the rest is processes, pinned buffers).
CACHE_FULL_FRACTION = 0.40
#: Seed rule table: reads above 100 MB/s for over half the run (the median
#: sample) with the cache full: the dataset does not fit and is re-read.
THRASH_READ_BPS = 100 * _MB
#: Seed rule table: swapping in more than 1 MB/s on average is memory pressure
#: (an idle host swaps in ~0; a few pages now and then average far below).
SWAP_IN_BPS = 1 * _MB
#: Seed rule table: the hottest worker above 2.5× its fair share (the pool's
#: CPU seconds / its worker count). A worker can use at most N× the fair
#: share of N workers, so only pools of 3 or more workers can exceed it.
WORKER_IMBALANCE_RATIO = 2.5
#: A pool is judged only once its workers used this many CPU-seconds in all:
#: below it, start-up (fork, imports) and the host sampler's 0.5 s reads (a
#: worker's last half second before it exits is unseen) set the shares, and
#: so little loading work cannot hold training back.
WORKER_MIN_POOL_CPU_S = 1.0


@rule("io_bound_dataloader", supersedes=("dataloader_stall",))
def io_bound_dataloader(ctx: RunContext) -> Insight | None:
    """Fires on a loader stall (> :data:`STALL_FRACTION` of iteration time)
    while the disk is busy (:func:`gpuprof.insights.loading.source_saturated`)
    and the CPU has headroom (host CPU measured and ≤ :data:`CPU_BOUND_PCT`)."""
    frac = stall_fraction(ctx)
    cpu = ctx.host_cpu_pct
    if frac is None or frac <= STALL_FRACTION or cpu is None or cpu > CPU_BOUND_PCT:
        return None
    if not source_saturated(ctx):
        return None
    bps, iops = ctx.host_disk_read_bps, ctx.host_disk_read_iops
    reads = f"{(bps or 0) / _MB:.0f} MB/s" + (f", {iops:.0f} IOPS" if iops is not None else "")
    return Insight(
        rule="io_bound_dataloader",
        severity="HIGH" if frac > STALL_FRACTION_HIGH else "MED",
        title=f"Dataloader stall + busy disk ({reads} read, CPU {cpu:.0f}%) — workers "
        f"are I/O-bound ({frac:.0%} of step time waiting)",
        detail="The loop waits on batches while the disk reads flat out and the CPU has "
        "room: reading the data, not decoding it, is the bottleneck.",
        fix="Pack small files into shards (WebDataset, tar/parquet), copy the dataset to "
        "local NVMe or RAM (/dev/shm), or cache decoded samples; more workers only help "
        "when the disk has spare IOPS.",
        evidence={
            "stall_fraction": round(frac, 4),
            "disk_read_bps": None if bps is None else round(bps),
            "disk_read_iops": None if iops is None else round(iops, 1),
            "host_cpu_pct": round(cpu, 1),
        },
    )


@rule("cold_cache")
def cold_cache(ctx: RunContext) -> Insight | None:
    """Fires when the first third of the run read ≥ :data:`COLD_CACHE_READ_RATIO`
    × the last third's disk bytes/s (and ≥ :data:`COLD_CACHE_MIN_READ_BPS`),
    the iterations sped up (last third's median < the first third's), and the
    loader was what held them back: its median wait ≥ :data:`STALL_FRACTION`
    of the median iteration in the first third, and lower in the last by at
    least :data:`COLD_CACHE_LOADER_SHARE_OF_SPEEDUP` of the iterations'
    speed-up (iterations also speed up as a run warms up or a busy host
    quiets; a cold cache slows the loader)."""
    disk, iters, loader = ctx.disk_read_bps_thirds, ctx.iteration_ms_thirds, ctx.loader_ms_thirds
    if disk is None or iters is None or loader is None:
        return None
    (first_bps, last_bps), (first_ms, last_ms), (first_wait, last_wait) = disk, iters, loader
    if first_bps < COLD_CACHE_MIN_READ_BPS or first_bps < COLD_CACHE_READ_RATIO * last_bps:
        return None
    if last_ms >= first_ms or first_ms <= 0:
        return None
    share = first_wait / first_ms
    drop, speed_up = first_wait - last_wait, first_ms - last_ms
    # speed_up > 0 here, so the wait must have fallen too
    if share < STALL_FRACTION or drop < COLD_CACHE_LOADER_SHARE_OF_SPEEDUP * speed_up:
        return None
    return Insight(
        rule="cold_cache",
        severity="MED",
        title=f"Cold page cache: the first third of the run read {first_bps / _MB:.0f} MB/s "
        f"from disk, the last {last_bps / _MB:.0f} MB/s, and the loader wait fell "
        f"{first_wait:.1f} → {last_wait:.1f} ms per step (iterations {first_ms:.1f} → "
        f"{last_ms:.1f} ms)",
        detail=f"Early on the loop waited on the loader for {share:.0%} of each iteration "
        "while the data was read from disk; once the OS page cache held it, later epochs "
        "read from RAM and the wait shrank. Early throughput understates the steady state.",
        fix="Warm the cache before timing (read the dataset once, e.g. vmtouch -t), "
        "benchmark after the first epoch, or stage the data on local NVMe.",
        evidence={
            "first_third_read_bps": round(first_bps),
            "last_third_read_bps": round(last_bps),
            "first_third_iteration_ms": round(first_ms, 3),
            "last_third_iteration_ms": round(last_ms, 3),
            "first_third_loader_ms": round(first_wait, 3),
            "last_third_loader_ms": round(last_wait, 3),
            "first_third_loader_share": round(share, 4),
        },
    )


@rule("cache_thrashing")
def cache_thrashing(ctx: RunContext) -> Insight | None:
    """Fires when the page cache averages ≥ :data:`CACHE_FULL_FRACTION` of RAM
    and the median disk read is > :data:`THRASH_READ_BPS` (sustained: over
    half the samples read more)."""
    frac, reads = ctx.page_cache_fraction, ctx.host_disk_read_bps_median
    if frac is None or reads is None or frac < CACHE_FULL_FRACTION or reads <= THRASH_READ_BPS:
        return None
    return Insight(
        rule="cache_thrashing",
        severity="MED",
        title=f"Page cache full ({frac:.0%} of RAM) yet the disk reads {reads / _MB:.0f} MB/s "
        "for most of the run — the dataset does not fit in the cache",
        detail="The OS caches what it can, but each epoch evicts what the next one needs, "
        "so every epoch reads the dataset from disk again.",
        fix="Shrink the dataset on disk (compressed shards, lower-resolution copies), "
        "read it sequentially (sharded streaming) so read-ahead helps, or use a host with "
        "more RAM or faster local storage.",
        evidence={"page_cache_fraction": round(frac, 3), "median_read_bps": round(reads)},
    )


@rule("host_memory_pressure")
def host_memory_pressure(ctx: RunContext) -> Insight | None:
    """Fires when the host swaps in > :data:`SWAP_IN_BPS` on average."""
    sin = ctx.host_swap_in_bps
    if sin is None or sin <= SWAP_IN_BPS:
        return None
    return Insight(
        rule="host_memory_pressure",
        severity="HIGH",
        title=f"Host is swapping: {sin / _MB:.1f} MB/s swapped in on average",
        detail="Memory pages are read back from swap while the run trains: some process "
        "(often DataLoader workers each holding a copy of the dataset) needs more RAM "
        "than the host has, and every swapped page stalls whoever touches it.",
        fix="Lower num_workers or prefetch_factor, keep datasets in shared or "
        "memory-mapped storage (numpy memmap, Arrow) instead of Python lists copied into "
        "each worker, or free host memory.",
        evidence={"swap_in_bps": round(sin)},
    )


def _hottest(pool: WorkerPool) -> tuple[int, float, float, float] | None:
    """(worker id, its CPU-s, the pool's CPU-s, hottest / fair share) of a pool
    that can be judged; None for a lone worker or too little CPU."""
    n = len(pool.cpu_s)
    total = sum(cpu for _, cpu in pool.cpu_s)
    if n < 2 or total < WORKER_MIN_POOL_CPU_S:
        return None
    worker_id, hot = max(pool.cpu_s, key=lambda w: (w[1], -w[0]))
    return worker_id, hot, total, hot / (total / n)


@rule("worker_imbalance")
def worker_imbalance(ctx: RunContext) -> Insight | None:
    """Fires when, in a DataLoader worker pool of ≥ 2 workers that used ≥
    :data:`WORKER_MIN_POOL_CPU_S` CPU-seconds, the hottest worker used >
    :data:`WORKER_IMBALANCE_RATIO` × the pool's fair share (its CPU seconds /
    its worker count); reports the most imbalanced pool."""
    judged = [(pool, h) for pool in ctx.worker_pools if (h := _hottest(pool)) is not None]
    hot = [(pool, h) for pool, h in judged if h[3] > WORKER_IMBALANCE_RATIO]
    if not hot:
        return None
    pool, (worker_id, cpu, total, ratio) = max(hot, key=lambda ph: ph[1][3])
    n = len(pool.cpu_s)
    pools = f"{len(hot)} of {len(judged)} worker pools" if len(judged) > 1 else "the worker pool"
    return Insight(
        rule="worker_imbalance",
        severity="MED",
        title=f"DataLoader worker {worker_id} did {ratio:.1f}× its fair share of the loading "
        f"({cpu:.1f} of {total:.1f} CPU-s across {n} workers)",
        detail=f"In {pools}, one worker does most of the work while the others wait: the "
        "loader runs at the speed of that one worker, not of all of them. Typical causes: "
        "an IterableDataset whose shards are split unevenly between workers (or not split, "
        "so one worker reads them), or samples of very uneven cost landing on one worker.",
        fix="Shard evenly by worker: in an IterableDataset (or worker_init_fn), give each "
        "worker an equal slice via torch.utils.data.get_worker_info() (round-robin over "
        "records, not whole files of unequal size); for samples of uneven cost, use a "
        "map-style dataset with shuffle=True so costly samples spread over the workers, "
        "or precompute the costly part once.",
        evidence={
            "loader_seq": pool.loader_seq,
            "worker_id": worker_id,
            "worker_cpu_s": round(cpu, 3),
            "pool_cpu_s": round(total, 3),
            "workers": n,
            "fair_share_ratio": round(ratio, 2),
            "pools_imbalanced": len(hot),
            "pools_judged": len(judged),
        },
    )


#: Cores other processes must keep busy (on average) to be worth a finding:
#: less than one core is background noise (sshd, the daemon, a shell).
CONTENTION_MIN_OTHER_CORES = 1.0
#: Cores the run's own process tree must use for contention to slow it: a
#: run below a quarter core mostly waits on something else (a sleeping or
#: I/O-bound loader, the GPU), and its stall is its own.
CONTENTION_MIN_RUN_CORES = 0.25
#: Share of the host's cores used by other processes above which they, not
#: the run, set the pace: HIGH.
CONTENTION_HIGH_SHARE = 0.5


# Contention is a cause, not a replacement: the stall and the erratic steps
# stay findings of their own (each says when contention explains it; a
# CPU-bound stall starved by others carries this finding and replaces it).
@rule("host_cpu_contention")
def host_cpu_contention(ctx: RunContext) -> Insight | None:
    """Fires when host CPU averages > :data:`CPU_BOUND_PCT` while the run's own
    process tree — with the job's other ranks on this host, whose CPU is the
    job's own (:func:`own_cpu_cores`) — uses less than
    :data:`RUN_SHARE_OF_BUSY_CPU` of the busy cores and other processes keep ≥
    :data:`CONTENTION_MIN_OTHER_CORES` busy. Silent when the run's own CPU was
    not measured (another PID namespace) or is under
    :data:`CONTENTION_MIN_RUN_CORES` (a run that needs no CPU is not slowed by
    its lack), or when it waits > :data:`STALL_FRACTION_HIGH` of the time on a
    loader whose measured workers sat idle (:func:`gpuprof.insights.loading.loader_cpu`:
    its pace is its loader's waits, and the stall is reported plainly)."""
    cpu, cores = ctx.host_cpu_pct, ctx.cpu_count
    run, ranks = own_cpu_cores(ctx)
    if cpu is None or run is None or not cores or cpu <= CPU_BOUND_PCT:
        return None
    if run < CONTENTION_MIN_RUN_CORES:
        return None
    stall = stall_fraction(ctx)
    idle = loader_cpu(ctx, stall) if stall is not None else None
    if (
        stall is not None
        and stall > STALL_FRACTION_HIGH
        and idle
        and idle.workers
        and idle.busy is False
    ):
        return None  # the loop's pace is its idle (sleeping, I/O-bound) workers', not the CPU's
    busy = cpu / 100.0 * cores
    others = max(0.0, busy - run)
    if run >= RUN_SHARE_OF_BUSY_CPU * busy or others < CONTENTION_MIN_OTHER_CORES:
        return None
    # without timed next() calls the wait is the inter-step gap: no loader may exist
    where = "waiting on the loader" if ctx.explicit_wait else "spent between steps"
    waiting = f"; {stall:.0%} of step time {where}" if stall else ""
    who = f"this job's {ranks} ranks here" if ranks > 1 else "this run"
    return Insight(
        rule="host_cpu_contention",
        severity="HIGH" if others >= CONTENTION_HIGH_SHARE * cores else "MED",
        title=f"Other processes keep {others:.1f} of {cores} cores busy ({cpu:.0f}% host "
        f"CPU); {who} used {run:.1f}",
        detail=f"The host is saturated by work outside {'this job' if ranks > 1 else 'this run'}, "
        "so its steps, loader "
        f"waits and step-time spread reflect CPU contention, not the training code{waiting}. "
        "A regression against earlier runs may have the same cause.",
        fix="Run on an idle node or reserve cores (Slurm --exclusive, cgroup cpusets, "
        "taskset); find the other processes with top. More DataLoader workers won't help.",
        evidence={
            "host_cpu_pct": round(cpu, 1),
            "run_cpu_cores": None if ctx.run_cpu_cores is None else round(ctx.run_cpu_cores, 2),
            "own_cpu_cores": round(run, 2),
            "job_ranks": ranks,
            "other_cores": round(others, 2),
            "cpu_count": cores,
        },
    )
