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

from gpuprof.insights.base import LoaderConfig, RunContext

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
    """Judge the loading's CPU use: by the workers when measured (busy at ≥
    :data:`WORKER_BUSY_CORES` each; below, busy when ≥
    :data:`WORKER_STARVED_SWITCH_SHARE` of their context switches were
    preemptions, or without switch counts at ≥ :data:`WORKER_IDLE_CORES`),
    else by the run's own cores beyond ``1 - stall`` (its compute share).
    *stall*: the stall fraction 0-1."""
    pools = [p for p in ctx.worker_pools if p.cores_per_worker is not None]
    if pools:
        n = sum(len(p.cpu_s) for p in pools)
        per = sum(p.cores_per_worker * len(p.cpu_s) for p in pools) / n  # type: ignore[operator]
        shares = [p.involuntary_share for p in pools if p.involuntary_share is not None]
        if per >= WORKER_BUSY_CORES:
            return LoaderCpu(True, per, n)
        if shares:  # preempted while wanting the CPU: starved, not idle
            return LoaderCpu(max(shares) >= WORKER_STARVED_SWITCH_SHARE, per, n)
        return LoaderCpu(per >= WORKER_IDLE_CORES, per, n)
    own = ctx.run_cpu_cores
    if own is None:
        return LoaderCpu(None, None, 0)
    extra = own - (1.0 - stall)
    return LoaderCpu(extra >= INPROCESS_LOADER_MIN_CORES, extra, 0)


def main_loader(ctx: RunContext) -> LoaderConfig | None:
    """The settings of the run's first reported DataLoader (the training
    loader: the one iterated first), or None when none was reported."""
    return ctx.loaders[0] if ctx.loaders else None


def setting_fixes(ctx: RunContext, cpu: LoaderCpu) -> list[str]:
    """The DataLoader settings worth changing, given what the run already
    does and what its workers did: each a short imperative phrase."""
    cfg = main_loader(ctx)
    out: list[str] = []
    cores = ctx.cpu_count or 0
    if cfg is not None and cfg.num_workers == 0:
        target = max(2, min(8, cores - 1)) if cores else 4
        out.append(f"load in worker processes (num_workers={target}; it is 0 now)")
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
