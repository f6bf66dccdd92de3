"""What a stalled loader was doing while the loop waited, and the fix that fits.

The stall rules know the loader wait; this module adds what the evidence
says about its cause: whether the loading burns CPU (its workers' CPU,
else the run's own CPU beyond what its compute could use), and the
DataLoader settings the shim reported (``num_workers``,
``persistent_workers``, ``pin_memory``, ``prefetch_factor``), so a fix never
recommends what the run already does. Pure.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuprof.insights import frames
from gpuprof.insights.base import LoaderConfig, RunContext
from gpuprof.insights.gpu import GPU_USED_UTIL_PCT

#: Share of a pool's context switches that are preemptions at or above which
#: its workers want the CPU (computing, starved or not): a worker that
#: sleeps or reads switches voluntarily at every wait (the busy-host tests:
#: sleeping workers beside a hog ~0.05-0.2, CPU-bound ones ~0.9).
WORKER_STARVED_SWITCH_SHARE = 0.5
#: Mean cores per DataLoader worker at or above which its workers compute,
#: whatever their switches say: a worker decoding or augmenting uses a whole
#: core alone, a sleeping one ~0.01-0.1 (start-up and per-batch overhead).
WORKER_BUSY_CORES = 0.5
#: ... and below which workers of unknown switches (an older gpuprofd) sit idle.
WORKER_IDLE_CORES = 0.1
#: Without worker figures (``num_workers=0``, or unmeasured), the run's own
#: cores beyond the share of wall time its steps took (a step's compute keeps
#: at most about one core busy at one intra-op thread) that mean the loading
#: itself burned CPU: a sleeping loader burns none; 0.1 core is well above
#: the sampling noise of a tree of 1-3 processes.
INPROCESS_LOADER_MIN_CORES = 0.1
#: ... and, of the loader wait's share of wall time, the share of a core the
#: in-process loading must have kept busy to be judged computing (as
#: :data:`WORKER_BUSY_CORES` for a worker): a loading that computes keeps one
#: core busy through its wait, one that sleeps none, while the step's compute
#: can use more than the one core assumed above (intra-op threads). Seen here
#: on a 2-core box, 2026-12-04: a ``time.sleep`` loader waiting 89 % of each
#: iteration left 0.11 core beyond that share, and was called CPU-bound.
INPROCESS_LOADER_BUSY_SHARE = 0.5
#: What one batch costs to come through a DataLoader worker process (ms):
#: pickling it, the queue, unpickling in the training process. A loop whose
#: wait per batch is below it gets slower with workers, not faster. The
#: smallest hand-off ``bench/worker_batch_cost.py`` measured on the 2-core
#: box, 2026-12-04, in three runs at load averages 1.6-4.2: 0.72-1.00 ms for
#: a 32 x 32 float batch of a TensorDataset (0.05-0.10 ms in-process),
#: 0.77-1.32 ms for larger ones; the smallest, so that no wait a worker
#: could shorten goes without the advice.
WORKER_BATCH_COST_MS = 0.7
#: Host disk read rate (bytes/s, mean) above which the loader's source is
#: saturated: the disk, not the number of requests in flight, sets the pace
#: (the seed rule table's io-bound threshold).
DISK_BUSY_BPS = 500e6
#: Host disk read operations per second (mean) above which it is saturated
#: with small reads (many small image files) while the byte rate stays far
#: under :data:`DISK_BUSY_BPS` (5k reads of 4 KiB are 20 MB/s).
DISK_BUSY_IOPS = 5_000.0
#: Most workers advised for loading that waits: each is a process holding its
#: own copy of the dataset object and its prefetched batches in memory.
MAX_WAITING_WORKERS = 16
#: Share of the workers' stack samples in blocking calls
#: (:data:`gpuprof.insights.frames.BLOCKING_CALLS`) at or above which they
#: sat idle, whatever their CPU figures say: the stacks see what they did.
WORKER_BLOCKED_SHARE = 0.8


def gpu_starved_share(ctx: RunContext) -> float | None:
    """The most (0-1) of the run's step time its GPU can have waited for input:
    1 - NVML's mean utilization over the run's steps (the share of time no
    kernel or copy ran). A host wait the GPU did not feel is no stall: a
    ``loss.item()`` after ``optimizer.step()`` waits between the steps for the
    work still queued (seen on an H200, 2026-12-04: a GPT loop with random
    tokens waited 60 % of each step there while NVML read the GPU ~99 % busy).
    None when the GPU was not sampled or the run did not use it (mean
    utilization < :data:`gpuprof.insights.gpu.GPU_USED_UTIL_PCT`)."""
    g = ctx.gpu
    if g is None or g.util_mean_pct is None or g.util_mean_pct < GPU_USED_UTIL_PCT:
        return None
    return max(0.0, 1.0 - g.util_mean_pct / 100.0)


class LoaderCpu(NamedTuple):
    """What the loading did with the CPU while the loop waited."""

    busy: bool | None
    """True: the loading burned CPU; False: it sat idle; None: unknown."""
    cores: float | None
    """The figure it was judged by: cores per worker, or (in-process) the run's
    cores beyond its compute share."""
    workers: int
    """Workers measured (0: in-process or unmeasured)."""


def loader_cpu(ctx: RunContext, stall: float) -> LoaderCpu:
    """Judge the loading's CPU use: by the workers when measured (idle when
    ≥ :data:`WORKER_BLOCKED_SHARE` of their stack samples were in a blocking
    call; else busy at ≥
    :data:`WORKER_BUSY_CORES` each; below, busy when ≥
    :data:`WORKER_STARVED_SWITCH_SHARE` of their context switches were
    preemptions, or without switch counts at ≥ :data:`WORKER_IDLE_CORES`),
    else (in-process) idle when ≥ :data:`WORKER_BLOCKED_SHARE` of the
    training thread's samples between steps were in a blocking call, else by
    the run's own cores beyond ``1 - stall`` (its compute share): busy at ≥
    :data:`INPROCESS_LOADER_MIN_CORES` and ≥ :data:`INPROCESS_LOADER_BUSY_SHARE`
    × *stall*. *stall*: the stall fraction 0-1."""
    pools = [p for p in ctx.worker_pools if p.cores_per_worker is not None]
    if pools:
        procs = sum(len(p.cpu_s) for p in pools)
        per = sum(p.cores_per_worker * len(p.cpu_s) for p in pools) / procs  # type: ignore[operator]
        # the pools of one loader come one after the other (an epoch each
        # without persistent workers): its workers are the largest pool's
        n = max(len(p.cpu_s) for p in pools)
        shares = [p.involuntary_share for p in pools if p.involuntary_share is not None]
        blocked = frames.call_share(ctx.stack_frames, frames.BLOCKING_CALLS, source="loader")
        if blocked is not None and blocked >= WORKER_BLOCKED_SHARE:
            return LoaderCpu(False, per, n)
        if per >= WORKER_BUSY_CORES:
            return LoaderCpu(True, per, n)
        if shares:  # preempted while wanting the CPU: starved, not idle
            return LoaderCpu(max(shares) >= WORKER_STARVED_SWITCH_SHARE, per, n)
        return LoaderCpu(per >= WORKER_IDLE_CORES, per, n)
    own = ctx.run_cpu_cores
    extra = None if own is None else own - (1.0 - stall)
    # in-process loading runs on the training thread: its samples between steps see it
    blocked = frames.call_share(ctx.stack_frames, frames.BLOCKING_CALLS, source="main")
    if blocked is not None and blocked >= WORKER_BLOCKED_SHARE:
        return LoaderCpu(False, extra, 0)
    if extra is None:
        return LoaderCpu(None, None, 0)
    floor = max(INPROCESS_LOADER_MIN_CORES, INPROCESS_LOADER_BUSY_SHARE * stall)
    return LoaderCpu(extra >= floor, extra, 0)


#: A worker's CPU per batch (ms) at or above which making a batch is no
#: cheaper than its hand-off (:data:`WORKER_BATCH_COST_MS`): twice that cost,
#: as the worker's CPU holds its own half of the hand-off (pickling, the
#: queue). Seen here on the 2-core box, 2026-12-04: a TensorDataset indexed a
#: batch at a time 0.55-0.96 ms, batches of 2 on a busy host 0.9 ms, a
#: ``__getitem__`` making 32 random 3 x 32 x 32 images 1.3-2.0 ms.
MAKING_CPU_MAX_MS = 2.0 * WORKER_BATCH_COST_MS
#: The workers' voluntary context switches per batch at or above which making
#: a batch waits (a sleep, storage or network reads): a worker that only
#: computes switches about once a batch, waiting for its next indices. Seen
#: here on the 2-core box, 2026-12-04: a TensorDataset indexed a batch at a
#: time 1.1, batches of 2 on a busy host 1.0, a CPU-bound collate_fn beside a
#: busy core 6, a ``__getitem__`` sleeping 0.5 ms per sample (32 a batch) 30.
MAKING_WAITS_SWITCHES = 10.0


class Making(NamedTuple):
    """What the run measured of a batch's making in its workers."""

    cheap: bool | None
    """True: a batch costs less to make than to hand over from a worker;
    False: it costs more (or waits); None: the workers were not measured."""
    cpu_ms: float | None
    """The workers' CPU per batch (ms), None when unmeasured."""
    switches: float | None
    """The workers' voluntary context switches per batch, None when unknown."""


def batches_after_first(ctx: RunContext) -> int:
    """The batches the loop took after step 0 (start-up): micro-batches when
    reported, else one per step; at least 1."""
    mbs = ctx.micro_batches[1:] if len(ctx.micro_batches) == ctx.steps else ()
    return max(1, sum(max(1, m) for m in mbs) if mbs else ctx.steps - 1)


def batch_making(ctx: RunContext) -> Making:
    """Judge from the workers' figures what making one batch costs, at the
    loop's pace (the loop's time per batch, step 0 left out: the workers
    deliver the batches as the loop takes them): their CPU per batch (cores ×
    workers × time per batch) and their voluntary switches per batch. Not
    cheap when ≥ :data:`WORKER_BLOCKED_SHARE` of their stack samples were
    in a blocking call, at ≥ :data:`MAKING_WAITS_SWITCHES` switches a batch
    (the making waits: in the training process the loop would wait that
    long), or at ≥ :data:`MAKING_CPU_MAX_MS` of CPU a batch; cheap
    otherwise; unknown (None) without worker figures."""
    n = ctx.steps - 1
    pools = [p for p in ctx.worker_pools if p.cores_per_worker is not None]
    if not pools or n <= 0:
        return Making(None, None, None)
    iteration_s = sum(ctx.iteration_ms[1:]) / batches_after_first(ctx) / 1000.0
    cpu = loader_cpu(ctx, 0.0)  # measured workers: their figures, not the stall's
    cpu_ms = (cpu.cores or 0.0) * cpu.workers * iteration_s * 1000.0
    timed = [p for p in pools if p.voluntary is not None and p.span_s]
    span = sum(p.span_s or 0.0 for p in timed)
    switches = (
        sum(p.voluntary or 0 for p in timed) / span * iteration_s if timed and span > 0 else None
    )
    blocked = frames.call_share(ctx.stack_frames, frames.BLOCKING_CALLS, source="loader")
    waits = (blocked is not None and blocked >= WORKER_BLOCKED_SHARE) or (
        switches is not None and switches >= MAKING_WAITS_SWITCHES
    )
    return Making(not waits and cpu_ms < MAKING_CPU_MAX_MS, cpu_ms, switches)


def source_saturated(ctx: RunContext) -> bool:
    """True when the host's disk read at a saturated rate (mean > :data:`DISK_BUSY_BPS`
    or > :data:`DISK_BUSY_IOPS`): more requests in flight will not read faster.
    False when it read less, or was not measured."""
    bps, iops = ctx.host_disk_read_bps, ctx.host_disk_read_iops
    return (bps is not None and bps > DISK_BUSY_BPS) or (iops is not None and iops > DISK_BUSY_IOPS)


def workers_to_hide_wait(ctx: RunContext, workers: int, batch_ms: float | None = None) -> int:
    """Workers that wait (latency, not a saturated source) needed to hide the
    wait: *workers* of them deliver one batch per iteration, so each batch
    takes them ~*workers* × the iteration (in the training process,
    *workers* = 0: *batch_ms*, its wait per batch); hiding it under the step
    takes that over the step's time. Mean steady iteration and step (step 0
    left out); at least *workers* + 1 (2 from none), at most
    :data:`MAX_WAITING_WORKERS`."""
    n = ctx.steps - 1
    step = sum(ctx.step_ms[1:]) / n if n > 0 else 0.0
    per_batch = workers * sum(ctx.iteration_ms[1:]) / n if workers and n > 0 else batch_ms
    need = per_batch / step if step > 0 and per_batch is not None else MAX_WAITING_WORKERS
    return int(min(MAX_WAITING_WORKERS, max(workers + 1, 2, -(-need // 1))))


#: Share of the host's cores that busy loader workers must hold, on a host
#: at least :data:`COMPETE_HOST_PCT` busy, to compete with a CPU run's
#: training step: the new user's 2-worker collate_fn on 2 cores, 2026-12-04,
#: held 1.0-1.4 of them, and its median step fell 37 -> 9 ms without them.
WORKER_COMPETE_SHARE = 0.25
#: Host CPU (%, all cores) at or above which the cores are all taken.
COMPETE_HOST_PCT = 80.0


def worker_cores(ctx: RunContext) -> float | None:
    """The run's DataLoader workers' mean cores while they ran: their CPU
    seconds over their pools' spans (pools one after the other); None when
    none was measured."""
    pools = [p for p in ctx.worker_pools if p.span_s and p.span_s > 0]
    span = sum(p.span_s or 0.0 for p in pools)
    if span <= 0:
        return None
    return sum(c for p in pools for _, c in p.cpu_s) / span


def competing_workers(ctx: RunContext) -> float | None:
    """The cores the loader workers took from a CPU run's step: on a run with
    no GPU, a host ≥ :data:`COMPETE_HOST_PCT` busy, workers computing
    (:func:`loader_cpu`: ≥ :data:`WORKER_BUSY_CORES` each, or preempted
    while they want the CPU, not asleep) and holding ≥
    :data:`WORKER_COMPETE_SHARE` of the cores; else None. The step's math
    runs on the same cores, so they slow it (a GPU run's step mostly waits
    on the GPU)."""
    if ctx.gpu_model or ctx.gpu_count or not ctx.cpu_count:
        return None
    host = ctx.host_cpu_pct
    held = worker_cores(ctx)
    if host is None or held is None or host < COMPETE_HOST_PCT:
        return None
    busy = loader_cpu(ctx, 0.0)  # measured workers: judged by their own figures
    if not busy.busy or not busy.workers or held < WORKER_COMPETE_SHARE * ctx.cpu_count:
        return None
    return held


def main_loader(ctx: RunContext) -> LoaderConfig | None:
    """The settings of the run's first reported DataLoader (the training
    loader: the one iterated first), or None when none was reported."""
    return ctx.loaders[0] if ctx.loaders else None


def setting_fixes(ctx: RunContext, cpu: LoaderCpu, wait_ms: float | None = None) -> list[str]:
    """The DataLoader settings worth changing, given what the run already
    does and what its workers did: each a short imperative phrase. *wait_ms*:
    the loop's mean wait per batch (ms); below :data:`WORKER_BATCH_COST_MS`
    worker processes are not advised (a batch through one costs more)."""
    cfg = main_loader(ctx)
    out: list[str] = []
    cores = ctx.cpu_count or 0
    worth_a_worker = wait_ms is None or wait_ms >= WORKER_BATCH_COST_MS
    if cfg is not None and cfg.num_workers == 0:
        if worth_a_worker:
            target = max(2, min(8, cores - 1)) if cores else 4
            if cpu.busy is False and wait_ms is not None:  # waits: not bounded by the cores
                target = workers_to_hide_wait(ctx, 0, wait_ms)
            out.append(f"load in worker processes (num_workers={target}; it is 0 now)")
    elif (
        cpu.busy is False
        and cpu.workers
        and cfg is not None
        and worth_a_worker
        and not source_saturated(ctx)
    ):
        target = workers_to_hide_wait(ctx, cfg.num_workers)
        if target > cfg.num_workers:
            out.append(
                f"raise num_workers from {cfg.num_workers} to about {target} (workers that "
                "wait use little CPU; each more keeps one more request in flight)"
            )
    elif cpu.busy and cfg is not None and cores and cfg.num_workers < cores - 1:
        out.append(
            f"raise num_workers from {cfg.num_workers} toward {cores - 1} "
            f"(the host has {cores} cores)"
        )
    if cfg is not None and cfg.num_workers > 0:
        if not cfg.persistent_workers and len(ctx.worker_pools) > 1:
            out.append("set persistent_workers=True (workers restart every epoch)")
        if cpu.busy is not False and (cfg.prefetch_factor or 2) < 4:
            out.append(f"raise prefetch_factor from {cfg.prefetch_factor or 2} to 4")
    if cfg is not None and ctx.gpu_model and not cfg.pin_memory:
        out.append("set pin_memory=True")
    if cfg is None:
        out.append(
            "raise DataLoader num_workers and prefetch_factor, set persistent_workers=True"
            + (" and pin_memory=True" if ctx.gpu_model else "")
        )
    return out


def config_evidence(ctx: RunContext) -> dict[str, object]:
    """The main loader's settings for a finding's evidence (empty: none reported)."""
    cfg = main_loader(ctx)
    return {} if cfg is None else {"loader": cfg._asdict()}
