"""Build a :class:`RunContext` from stored rows (pure: the caller queries)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof.comm import COMM_PHASE
from gpuprof.insights import hostcpu
from gpuprof.insights.aggregates import GpuStats, KernelStats
from gpuprof.insights.base import CommTotals, LoaderConfig, RunContext, WorkerPool, steady
from gpuprof.insights.frames import from_rows
from gpuprof.insights.gpu import gpu_stats
from gpuprof.insights.kernels import kernel_stats
from gpuprof.protocol import DATA_PHASE, OWN_TIME_PHASE
from gpuprof.stats import mean, median

_NS_PER_MS = 1e6


def _column(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """The non-None values of *key* in *rows* (missing or None: not available)."""
    return [r[key] for r in rows if r.get(key) is not None]


def _mean_or_none(values: Sequence[float]) -> float | None:
    return mean(values) if values else None


def _thirds(values: Sequence[float], agg: Any) -> tuple[float, float] | None:
    """(*agg* of the first third of *values*, *agg* of the last third); None
    with fewer than 3 values."""
    n = len(values) // 3
    return (agg(values[:n]), agg(values[-n:])) if n else None


def _step_numbers(steps: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each step's number in the run: the index it was recorded with
    (``step``) when every step has one and they rise in time order; else its
    position among all the steps, traced ones included (a manual loop that
    numbers each epoch's steps from 0 again has no run-wide number)."""
    got = [s.get("step") for s in steps]
    if all(type(n) is int for n in got) and all(a < b for a, b in zip(got, got[1:], strict=False)):
        return got  # type: ignore[return-value]
    return list(range(len(steps)))


def _step_ms(s: Mapping[str, Any]) -> float:
    """A step's duration (ms): its ``t0`` to ``t1`` without gpuprof's own
    time inside it (sending events is not the step's)."""
    return (s["t1"] - s["t0"] - (s.get("phases") or {}).get(OWN_TIME_PHASE, 0)) / _NS_PER_MS


def steady_iterations(steps: Sequence[Mapping[str, Any]], whole: bool = True) -> tuple[float, ...]:
    """The steady iteration times (loader wait + step, ms) of *steps* (in
    step order, :func:`build_context`'s shape), as
    :attr:`RunContext.steady_iteration_ms` has them: traced steps left out
    (unless every step is), then, when *whole* (the run's every step), the
    warm-up steps; *whole* False: the run's last steps, past its warm-up."""
    timed = [s for s in steps if not s.get("traced")] or list(steps)
    ms = [_step_ms(s) + s["wait"] / _NS_PER_MS for s in timed]
    return tuple(steady(ms) if whole else ms)


def _phase_ns(steps: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Total ns per phase over *steps*. Steps with the same phases (a run's
    steps mostly have) are summed column-wise: a day's 172,800 steps in one
    pass, not a dictionary update per phase per step."""
    by_names: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
    for s in steps:
        phases = s.get("phases")
        if phases:
            by_names.setdefault(tuple(phases), []).append(tuple(phases.values()))
    totals: dict[str, int] = {}
    for names, rows in by_names.items():
        for name, column in zip(names, zip(*rows, strict=True), strict=True):
            totals[name] = totals.get(name, 0) + sum(column)
    return totals


def _phase_totals(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Total ms per phase over *steps*."""
    return {name: ns / _NS_PER_MS for name, ns in _phase_ns(steps).items()}


def _phase_totals_and_steady(
    steps: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, float], dict[str, float]]:
    """(:func:`_phase_totals` of *steps*, of ``steady(steps)``) in one pass:
    the warm-up steps summed apart and added (ns are integers: the same sums)."""
    rest = steady(steps)
    if len(rest) == len(steps):
        totals = _phase_totals(steps)
        return totals, dict(totals)
    warm, later = _phase_ns(steps[: len(steps) - len(rest)]), _phase_ns(rest)
    names = list(warm) + [n for n in later if n not in warm]
    every = {n: (warm.get(n, 0) + later.get(n, 0)) / _NS_PER_MS for n in names}
    return every, {n: ns / _NS_PER_MS for n, ns in later.items()}


def _during_steps(
    host: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]
) -> Sequence[Mapping[str, Any]]:
    """The host rows taken between the first step's start and the last step's
    end (rows without ``mono_ns`` are kept): what the run read before its first
    step (the model, a checkpoint) is start-up, not a cold cache."""
    if not steps:
        return host
    t0, t1 = steps[0]["t0"], steps[-1]["t1"]
    return [h for h in host if h.get("mono_ns") is None or t0 <= h["mono_ns"] <= t1]


def _host_aggregates(
    host: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The :class:`RunContext` fields read from host samples (time order)."""
    disk = _column(host, "disk_read_bps")
    cache = [
        h["page_cache_bytes"] / h["mem_total_bytes"]
        for h in host
        if h.get("page_cache_bytes") is not None and h.get("mem_total_bytes")
    ]
    return {
        "host_disk_read_bps": _mean_or_none(disk),
        "host_disk_read_bps_median": median(disk) if disk else None,
        "host_disk_read_iops": _mean_or_none(_column(host, "disk_read_iops")),
        "page_cache_fraction": _mean_or_none(cache),
        "host_swap_in_bps": _mean_or_none(_column(host, "swap_in_bps")),
        "disk_read_bps_thirds": _thirds(_column(_during_steps(host, steps), "disk_read_bps"), mean),
    }


def _cpu_figures(
    host: Sequence[Mapping[str, Any]],
    run_cpu: Sequence[Mapping[str, Any]],
    timed: Sequence[Mapping[str, Any]],
    cpu_count: int | None,
    job_cores: float | None,
    job_ranks: int,
) -> dict[str, Any]:
    """The :class:`RunContext` CPU fields: host CPU % and the run's own cores
    while it was in its steps (time-weighted over the host samples that
    overlap them), and the per-step figures (:func:`hostcpu.step_figures`).
    Without timed steps or sample times: plain means over the rows."""
    spans = hostcpu.intervals(host, run_cpu)
    own_rows = [c["cores"] for c in run_cpu if c.get("cores") is not None]
    host_pct = _mean_or_none(_column(host, "cpu_pct"))
    own = mean(own_rows) if own_rows else None
    windows = [(s["t0"] - s["wait"], s["t1"]) for s in timed]
    if not spans or not windows:
        return {"host_cpu_pct": host_pct, "run_cpu_cores": own}
    # each iteration and, last, the whole span of the steps: one pass
    hosts, owns = hostcpu.weighted(spans, [*windows, (windows[0][0], windows[-1][1])])
    busy, mine = hosts.pop(), owns.pop()
    count = cpu_count or int(host[-1].get("cpu_count") or 0) or None
    if busy is not None and count:
        host_pct = min(100.0, 100.0 * busy / count)
    if mine is not None:
        own = mine
    siblings = max(0.0, job_cores - own) if job_ranks > 1 and job_cores and own else 0.0
    per_step = hostcpu.step_figures(hosts, owns, count, siblings)
    return {
        "host_cpu_pct": host_pct,
        "run_cpu_cores": own,
        "step_host_pct": per_step.host_pct,
        "step_own_cores": per_step.own_cores,
        "step_other_cores": per_step.other_cores,
    }


#: DataLoader settings kept per run (a train and an eval loader, a few more).
MAX_LOADERS = 8


def _loaders(options: Mapping[str, Any]) -> tuple[LoaderConfig, ...]:
    """``options["loaders"]`` (the shim's reports, validated by the protocol)
    as :class:`LoaderConfig` tuples; entries of another shape are skipped."""
    out = []
    for d in options.get("loaders") or ():
        try:
            out.append(
                LoaderConfig(
                    int(d["num_workers"]),
                    bool(d["persistent_workers"]),
                    bool(d["pin_memory"]),
                    None if d.get("prefetch_factor") is None else int(d["prefetch_factor"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out[:MAX_LOADERS])


def _torch_memory(steps: Sequence[Mapping[str, Any]]) -> dict[str, int | None]:
    """The :class:`RunContext` torch-memory peaks (bytes) from the steps that
    carry ``mem`` (``[allocated, reserved, peak]``); None where none does."""
    mems = [s["mem"] for s in steps if s.get("mem")]
    return {
        "torch_peak_allocated_bytes": max(m[2] for m in mems) if mems else None,
        "torch_peak_reserved_bytes": max(m[1] for m in mems) if mems else None,
    }


def _worker_pools(rows: Sequence[Mapping[str, Any]]) -> tuple[WorkerPool, ...]:
    """Worker rows grouped into pools by ``loader_seq`` (ascending), each
    worker's ``cpu_s`` by worker id (a worker id seen twice in a pool: summed)."""
    pools: dict[int, dict[int, float]] = {}
    spans: dict[int, list[int]] = {}
    switches: dict[int, list[int]] = {}  # seq -> [voluntary, involuntary]
    for r in rows:
        if r.get("cpu_s") is None or r.get("loader_seq") is None or r.get("worker_id") is None:
            continue
        seq = int(r["loader_seq"])
        pool = pools.setdefault(seq, {})
        pool[int(r["worker_id"])] = pool.get(int(r["worker_id"]), 0.0) + float(r["cpu_s"])
        if r.get("first_mono_ns") is not None and r.get("last_mono_ns") is not None:
            span = spans.setdefault(seq, [r["first_mono_ns"], r["last_mono_ns"]])
            span[0], span[1] = min(span[0], r["first_mono_ns"]), max(span[1], r["last_mono_ns"])
        if r.get("ctx_voluntary") is not None and r.get("ctx_involuntary") is not None:
            sw = switches.setdefault(seq, [0, 0])
            sw[0] += int(r["ctx_voluntary"])
            sw[1] += int(r["ctx_involuntary"])

    def share(seq: int) -> float | None:
        vol, invol = switches.get(seq, (0, 0))
        return invol / (vol + invol) if vol + invol else None

    return tuple(
        WorkerPool(
            seq,
            tuple(sorted(pools[seq].items())),
            (spans[seq][1] - spans[seq][0]) / 1e9 if seq in spans else None,
            share(seq),
        )
        for seq in sorted(pools)
    )


def _optimizer_totals(
    steps: Sequence[Mapping[str, Any]],
) -> tuple[tuple[str, int, int, float, int], ...]:
    """(name, updates, skipped, ms, steps) per optimizer, in order of first use."""
    totals: dict[str, list[float]] = {}
    for s in steps:
        for o in s.get("optimizers") or ():
            t = totals.setdefault(o["name"], [0, 0, 0.0, 0])
            t[0] += o["updates"]
            t[1] += o["skipped"]
            t[2] += o["ns"] / _NS_PER_MS
            t[3] += 1
    return tuple(
        (name, int(u), int(k), round(ms, 3), int(n)) for name, (u, k, ms, n) in totals.items()
    )


def _checkpointing_declared(options: Mapping[str, Any]) -> bool | None:
    """``options["arch"]["checkpointing"]`` as a bool; None when the run declared
    no architecture or the architecture does not say."""
    arch = options.get("arch")
    flag = arch.get("checkpointing") if isinstance(arch, Mapping) else None
    return flag if isinstance(flag, bool) else None


def _positive_int(x: Any) -> int | None:
    """*x* when a positive int (a declared count), else None."""
    return x if type(x) is int and x > 0 else None


def _comm_totals(comm: Mapping[str, Any] | None) -> CommTotals | None:
    if not comm or not comm.get("steps"):
        return None
    buckets, nbytes = int(comm.get("buckets") or 0), int(comm.get("bytes") or 0)
    return CommTotals(int(comm["steps"]), buckets, nbytes)


def build_context(
    run: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    host: Sequence[Mapping[str, Any]] = (),
    history_median_step_ms: Sequence[float] = (),
    gpu_rate_usd_per_hour: float | None = None,
    run_cpu: Sequence[Mapping[str, Any]] = (),
    gpu_samples: Sequence[Mapping[str, Any]] = (),
    workers: Sequence[Mapping[str, Any]] = (),
    gpu: GpuStats | None = None,
    kernel_windows: Sequence[tuple[Mapping[str, Any], Sequence[Any]]] = (),
    comm: Mapping[str, Any] | None = None,
    job_cpu: Sequence[Mapping[str, Any]] = (),
    history_iteration_ms: Sequence[Sequence[float]] = (),
    stacks: Sequence[Mapping[str, Any]] = (),
) -> RunContext:
    """Aggregate one run's rows into the context the rules read.

    Args:
        run: ``run_name``, ``status``, ``start_mono_ns``, ``end_mono_ns``
            (None while live), ``options`` (dict: ``flops_per_step`` FLOP,
            ``flops_source``, ``flops_counted`` FLOP, ``dtype``, ``arch``,
            ``loaders``: the shim's DataLoader settings), ``gpu_model``
            (None: no GPU), ``gpu_count``, ``cpu_count``.
        steps: in step order, each with ``t0``/``t1`` (monotonic ns),
            ``wait`` (ns), ``explicit`` (bool), ``micro``, ``phases``
            (phase name → ns), optional ``step`` (int: the index it was
            recorded with, its number in ``RunContext.step_numbers``; without
            it, or if the indices do not rise, the steps' positions stand in),
            ``skipped`` (bool), ``eval`` (ns),
            ``mem`` (torch allocator ``[allocated, reserved, peak]`` bytes) and
            ``traced`` (bool: a profiler snapshot ran in it; such steps are
            left out of the timing figures unless every step is traced).
        host: host samples taken during the run in time order, each with
            ``cpu_pct`` (0-100, all cores) and, each optional and None when
            not available, ``disk_read_bps`` (bytes/s), ``disk_read_iops``,
            ``page_cache_bytes``, ``mem_total_bytes`` and ``swap_in_bps`` (bytes/s).
        history_median_step_ms: median step ms of earlier runs of this
            name, newest first.
        gpu_rate_usd_per_hour: the ``GPUPROF_GPU_RATE`` override, if any.
        run_cpu: samples of the run's own process tree (training process +
            loader workers), each with ``cores`` (1.0 = one core busy) and
            ``mono_ns`` (the host sample it was taken with; rows without it
            only give the mean). Host rows with ``mono_ns`` and ``cpu_count``
            are aligned to the steps (:mod:`gpuprof.insights.hostcpu`).
        gpu_samples: the run's GPU's NVML samples while it was in steps, in
            :func:`gpuprof.insights.gpu.gpu_stats`' row shape.
        workers: one row per DataLoader worker process (``worker_cpu``
            rows), each with ``loader_seq`` (its pool), ``worker_id`` and
            ``cpu_s`` (user + system CPU seconds) and optionally
            ``first_mono_ns``/``last_mono_ns`` (pool start, last reading) and
            ``ctx_voluntary``/``ctx_involuntary`` (context switches so far).
        gpu: the same, already aggregated (from stored per-second rollups);
            wins over *gpu_samples*.
        kernel_windows: the run's kernel windows as ``(window, rows)`` pairs
            (what ``gpuprofd.storage.reads.queries.kernel_windows_from_rows`` returns):
            *window* a mapping with ``t0``/``t1`` (int, monotonic ns),
            ``source`` (``"snapshot"`` | ``"continuous"`` | ``"nsys"``) and
            ``steps`` (list of the step indices it covered; ``id`` and
            ``rows_dropped`` are ignored); *rows* its
            :class:`gpuprof.kernels.KernelAgg` rows (``kernel_stats`` row
            mappings with the same field names, or wire rows, also work).
            Aggregated by :func:`gpuprof.insights.kernels.kernel_stats` into
            ``RunContext.kernels``. ``run["options"]["arch"]["checkpointing"]``
            (bool) sets ``checkpointing_declared``.
        comm: the run's ``comm_buckets`` rows summed: ``steps`` (steps with
            a bucket), ``buckets`` (rows), ``bytes``; becomes
            ``RunContext.comm`` when ``steps`` > 0.
        job_cpu: the CPU of the run's job on this node (its group's runs here
            summed at each of its sample times; ``JOB_CPU_SQL``), each with
            ``cores`` and ``ranks``; becomes ``job_cpu_cores``/``job_ranks``.
        history_iteration_ms: per run of *history_median_step_ms*, its
            steady iteration times (ms; :func:`steady_iterations`).
        stacks: the run's ``stack_samples`` rows (``source``, ``step``,
            ``path``, ``line``, ``func``, ``callee``, ``samples``); become
            ``RunContext.stack_frames``.

    ``run["world_size"]`` and ``options["tokens_per_step"]`` /
    ``options["samples_per_step"]`` give the run's shape (what
    :mod:`gpuprof.compare` normalises by).
    """
    # steps a profiler snapshot ran in (``traced``) are not representative:
    # left out of every timing figure (step, wait, phase medians and thirds,
    # hence MFU and the regression baseline), unless every step was traced
    numbers = _step_numbers(steps)
    untraced = [n for n, s in zip(numbers, steps, strict=True) if not s.get("traced")]
    timed = [s for s in steps if not s.get("traced")] or list(steps)
    timed_numbers = untraced if untraced else numbers
    phase_totals, steady_phase_totals = _phase_totals_and_steady(timed)
    start = run.get("start_mono_ns")
    end = run.get("end_mono_ns") or (steps[-1]["t1"] if steps else None)
    duration_s = (end - start) / 1e9 if start is not None and end is not None else 0.0
    job = [c for c in job_cpu if c.get("cores") is not None]
    job_cores = mean([c["cores"] for c in job]) if job else None
    job_ranks = max((int(c.get("ranks") or 1) for c in job), default=1)
    options = run.get("options") or {}
    wait_ms = tuple(s["wait"] / _NS_PER_MS for s in timed)
    step_ms = tuple(_step_ms(s) for s in timed)
    iteration_ms = [s + w for s, w in zip(step_ms, wait_ms, strict=True)]
    ctx = RunContext(
        run_name=run["run_name"],
        status=run["status"],
        step_ms=step_ms,
        wait_ms=wait_ms,
        explicit_wait=any(s.get("explicit") for s in steps),
        data_ms=tuple((s.get("phases") or {}).get(DATA_PHASE, 0) / _NS_PER_MS for s in timed)
        if any(DATA_PHASE in (s.get("phases") or {}) for s in timed)
        else (),
        micro_batches=tuple(int(s.get("micro", 1)) for s in timed),
        comm_ms=tuple((s.get("phases") or {}).get(COMM_PHASE, 0) / _NS_PER_MS for s in timed)
        if any(COMM_PHASE in (s.get("phases") or {}) for s in timed)
        else (),
        phase_ms=phase_totals,
        duration_s=max(duration_s, 0.0),
        **_host_aggregates(host, steps),
        iteration_ms_thirds=_thirds(iteration_ms, median),
        **_cpu_figures(host, run_cpu, timed, run.get("cpu_count"), job_cores, job_ranks),
        job_cpu_cores=job_cores,
        job_ranks=job_ranks,
        loaders=_loaders(options),
        worker_pools=_worker_pools(workers),
        cpu_count=run.get("cpu_count"),
        gpu_model=run.get("gpu_model"),
        gpu_count=int(run.get("gpu_count") or 0),
        flops_per_step=options.get("flops_per_step"),
        flops_source=options.get("flops_source"),
        flops_counted=options.get("flops_counted"),
        arch=options.get("arch"),
        dtype=options.get("dtype"),
        history_median_step_ms=tuple(history_median_step_ms),
        gpu_rate_usd_per_hour=gpu_rate_usd_per_hour,
        skipped_updates=sum(1 for s in steps if s.get("skipped")),
        optimizers=_optimizer_totals(steps),
        **_torch_memory(steps),
        gpu=gpu if gpu is not None else gpu_stats(gpu_samples) if gpu_samples else None,
        kernels=_kernels(kernel_windows),
        checkpointing_declared=_checkpointing_declared(options),
        traced_steps=len(steps) - len(timed),
        step_numbers=tuple(timed_numbers),
        traced_step_numbers=tuple(sorted(set(numbers) - set(timed_numbers))),
        comm=_comm_totals(comm),
        eval_ms=(sum(s.get("eval") or 0 for s in steps) + (run.get("trailing_eval_ns") or 0))
        / _NS_PER_MS,
        steady_phase_ms=steady_phase_totals,
        world_size=int(run.get("world_size") or 1),
        tokens_per_step=_positive_int(options.get("tokens_per_step")),
        samples_per_step=_positive_int(options.get("samples_per_step")),
        history_iteration_ms=tuple(tuple(h) for h in history_iteration_ms),
        stack_frames=from_rows(stacks),
    )
    # from the context's own per-step loader time (wait + data phase)
    return dataclasses.replace(ctx, loader_ms_thirds=_thirds(ctx.loader_ms, median))


def _kernels(
    windows: Sequence[tuple[Mapping[str, Any], Sequence[Any]]],
) -> KernelStats | None:
    """The kernel rules' statistics, evidence windows left out: one is taken
    during what a finding describes (a slow burst), not a sample of the run,
    and on a CPU-only run its times are CPU time (:mod:`gpuprof.evidence`)."""
    sampled = [(w, rows) for w, rows in windows if w.get("source") != "evidence"]
    return kernel_stats(sampled) if sampled else None
