"""Build a :class:`RunContext` from stored rows (pure: the caller queries)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof.comm import COMM_PHASE
from gpuprof.insights import arraystats, hostcpu
from gpuprof.insights.aggregates import GpuStats, KernelStats
from gpuprof.insights.base import (
    CommTotals,
    LoaderConfig,
    RunContext,
    WorkerPool,
    positive_count,
    steady,
)
from gpuprof.insights.frames import from_rows
from gpuprof.insights.gpu import gpu_stats
from gpuprof.insights.kernels import kernel_stats
from gpuprof.insights.stepcols import StepColumns, step_columns
from gpuprof.protocol import DATA_PHASE, OWN_TIME_PHASE
from gpuprof.stats import mean, median

_NS_PER_MS = 1e6


def _present(values: Any) -> list[float]:
    """The non-NaN entries of a float64 column (NaN: not available)."""
    import numpy as np

    return values[~np.isnan(values)].tolist()  # type: ignore[no-any-return]


def _mean_or_none(values: Sequence[float]) -> float | None:
    return mean(values) if values else None


def _thirds(values: Sequence[float], agg: Any) -> tuple[float, float] | None:
    """(*agg* of the first third of *values*, *agg* of the last third); None
    with fewer than 3 values."""
    n = len(values) // 3
    return (agg(values[:n]), agg(values[-n:])) if n else None


def _step_numbers(steps: StepColumns) -> Any:
    """Each step's number in the run (int64 array): the index it was
    recorded with (``step``) when every step has one and they rise in time
    order; else its position among all the steps, traced ones included (a
    manual loop that numbers each epoch's steps from 0 again has no run-wide
    number)."""
    import numpy as np

    if steps.numbered and bool(np.all(steps.step[1:] > steps.step[:-1])):
        return steps.step
    return np.arange(len(steps), dtype=np.int64)


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


def _phase_ms(steps: StepColumns) -> dict[str, float]:
    """Total ms per phase over *steps*, names in the order first listed
    (int64 sums: exact, as the ns are integers)."""
    return {name: int(steps.phases[name].sum()) / _NS_PER_MS for name in steps.phase_order()}


def _phase_totals_and_steady(steps: StepColumns) -> tuple[dict[str, float], dict[str, float]]:
    """(:func:`_phase_ms` of *steps*, of ``steady(steps)``)."""
    warm = len(steps) - len(steady(range(len(steps))))
    totals = _phase_ms(steps)
    if not warm:
        return totals, dict(totals)
    import numpy as np

    later = np.arange(len(steps)) >= warm
    return totals, _phase_ms(steps.take(later))


def _host_aggregates(host: hostcpu.HostColumns, steps: StepColumns) -> dict[str, Any]:
    """The :class:`RunContext` fields read from host samples (time order)."""
    import numpy as np

    present = host.disk_read_bps[~np.isnan(host.disk_read_bps)]
    disk = present.tolist()
    # the rows taken between the first step's start and the last step's end
    # (rows without a time kept): what the run read before its first step
    # (the model, a checkpoint) is start-up, not a cold cache
    during = host.disk_read_bps
    if len(steps):
        t0, t1 = int(steps.t0[0]), int(steps.t1[-1])
        inside = ~host.timed | ((host.mono_ns >= t0) & (host.mono_ns <= t1))
        during = during[inside]
    return {
        "host_disk_read_bps": _mean_or_none(disk),
        "host_disk_read_bps_median": arraystats.median(present) if disk else None,
        "host_disk_read_iops": host.means.get("disk_read_iops"),
        "page_cache_fraction": host.means.get("page_cache_fraction"),
        "host_swap_in_bps": host.means.get("swap_in_bps"),
        "disk_read_bps_thirds": _thirds(_present(during), mean),
    }


def _cpu_figures(
    host: hostcpu.HostColumns,
    run_cpu: hostcpu.CpuColumns,
    timed: StepColumns,
    cpu_count: int | None,
    job_cores: float | None,
    job_ranks: int,
) -> dict[str, Any]:
    """The :class:`RunContext` CPU fields: host CPU % and the run's own cores
    while it was in its steps (time-weighted over the host samples that
    overlap them), and the per-step figures (:func:`hostcpu.step_figures`).
    Without timed steps or sample times: plain means over the rows."""
    import numpy as np

    spans = hostcpu.spans(host, run_cpu)
    own_rows = _present(run_cpu.cores)
    host_pct = _mean_or_none(_present(host.cpu_pct))
    own = mean(own_rows) if own_rows else None
    n = len(timed)
    if spans is None or not n:
        return {"host_cpu_pct": host_pct, "run_cpu_cores": own}
    # each iteration (its loader wait's start to its step's end) and, last,
    # the whole span of the steps: one pass
    windows = np.empty((n + 1, 2), dtype=np.int64)
    windows[:n, 0] = timed.t0 - timed.wait
    windows[:n, 1] = timed.t1
    windows[n] = (windows[0, 0], windows[n - 1, 1])
    hosts, owns = hostcpu.weighted_columns(spans, windows)
    busy, mine = float(hosts[n]), float(owns[n])
    last_count = host.cpu_count[-1]
    count = cpu_count or (0 if last_count != last_count else int(last_count)) or None
    if busy == busy and count:
        host_pct = min(100.0, 100.0 * busy / count)
    if mine == mine:
        own = mine
    siblings = max(0.0, job_cores - own) if job_ranks > 1 and job_cores and own else 0.0
    per_step = hostcpu.step_figures(hosts[:n], owns[:n], count, siblings)
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


def _torch_memory(steps: StepColumns) -> dict[str, int | None]:
    """The :class:`RunContext` torch-memory peaks (bytes) from the steps that
    carry ``mem`` (``[allocated, reserved, peak]``); None where none does."""
    mem = steps.has_mem
    return {
        "torch_peak_allocated_bytes": int(steps.mem_peak[mem].max()) if mem.any() else None,
        "torch_peak_reserved_bytes": int(steps.mem_reserved[mem].max()) if mem.any() else None,
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
            switches[seq][0] if seq in switches else None,
        )
        for seq in sorted(pools)
    )


def _optimizer_totals(
    steps: Sequence[Mapping[str, Any]] | StepColumns,
) -> tuple[tuple[str, int, int, float, int], ...]:
    """(name, updates, skipped, ms, steps) per optimizer, in order of first use."""
    lists = (
        steps.optimizers
        if isinstance(steps, StepColumns)
        else [s.get("optimizers") or () for s in steps]
    )
    totals: dict[str, list[float]] = {}
    for opts in lists:
        for o in opts:
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


def _comm_totals(comm: Mapping[str, Any] | None) -> CommTotals | None:
    if not comm or not comm.get("steps"):
        return None
    buckets, nbytes = int(comm.get("buckets") or 0), int(comm.get("bytes") or 0)
    return CommTotals(int(comm["steps"]), buckets, nbytes)


def build_context(
    run: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]] | StepColumns,
    host: Sequence[Mapping[str, Any]] | hostcpu.HostColumns = (),
    history_median_step_ms: Sequence[float] = (),
    gpu_rate_usd_per_hour: float | None = None,
    run_cpu: Sequence[Mapping[str, Any]] | hostcpu.CpuColumns = (),
    gpu_samples: Sequence[Mapping[str, Any]] = (),
    workers: Sequence[Mapping[str, Any]] = (),
    gpu: GpuStats | None = None,
    kernel_windows: Sequence[tuple[Mapping[str, Any], Sequence[Any]]] = (),
    comm: Mapping[str, Any] | None = None,
    job_cpu: Sequence[Mapping[str, Any]] = (),
    history_iteration_ms: Sequence[Sequence[float]] = (),
    stacks: Sequence[Mapping[str, Any]] = (),
    history_unit: str = "iteration",
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
        comm: the run's bucket rows summed: ``steps`` (steps with
            a bucket), ``buckets`` (rows), ``bytes``; becomes
            ``RunContext.comm`` when ``steps`` > 0.
        job_cpu: the CPU of the run's job on this node (its group's runs here
            summed at each of its sample times; ``reads.job_cpu``), each with
            ``cores`` and ``ranks``; becomes ``job_cpu_cores``/``job_ranks``.
        history_iteration_ms: per run of *history_median_step_ms*, its
            steady iteration times (ms; :func:`steady_iterations`).
        stacks: the run's ``stack_samples`` rows (``source``, ``step``,
            ``path``, ``line``, ``func``, ``callee``, ``samples``); become
            ``RunContext.stack_frames``.
        history_unit: ``iteration``, or the unit the history's times were
            scaled to this run's work by (``RunContext.history_unit``).

    ``run["world_size"]`` and ``options["tokens_per_step"]`` /
    ``options["samples_per_step"]`` give the run's shape (what
    :mod:`gpuprof.compare` normalises by).

    *steps*, *host* and *run_cpu* may also be given as columns
    (:class:`gpuprof.insights.stepcols.StepColumns`,
    :class:`gpuprof.insights.hostcpu.HostColumns`,
    :class:`gpuprof.insights.hostcpu.CpuColumns`): the same figures, without
    the pass over the rows.
    """

    # steps a profiler snapshot ran in (``traced``) are not representative:
    # left out of every timing figure (step, wait, phase medians and thirds,
    # hence MFU and the regression baseline), unless every step was traced
    cols = step_columns(steps)
    between_ns = cols.between_steps_ns()  # needs the steps consecutive: before take()
    host_cols = hostcpu.host_columns(host)
    cpu_cols = hostcpu.cpu_columns(run_cpu)
    numbers = _step_numbers(cols)
    untraced = ~cols.traced
    timed = cols.take(untraced) if untraced.any() else cols
    timed_numbers = numbers[untraced] if untraced.any() else numbers
    phase_totals, steady_phase_totals = _phase_totals_and_steady(timed)
    start = run.get("start_mono_ns")
    end = run.get("end_mono_ns") or (int(cols.t1[-1]) if len(cols) else None)
    duration_s = (end - start) / 1e9 if start is not None and end is not None else 0.0
    job = [c for c in job_cpu if c.get("cores") is not None]
    job_cores = mean([c["cores"] for c in job]) if job else None
    job_ranks = max((int(c.get("ranks") or 1) for c in job), default=1)
    options = run.get("options") or {}
    own_ns = timed.phases.get(OWN_TIME_PHASE)
    step_ns = timed.t1 - timed.t0 - (own_ns if own_ns is not None else 0)
    wait_col = timed.wait / _NS_PER_MS
    step_col = step_ns / _NS_PER_MS
    wait_ms = tuple(wait_col.tolist())
    step_ms = tuple(step_col.tolist())
    gap_col = (between_ns[untraced] if untraced.any() else between_ns) / _NS_PER_MS
    gap_ms = tuple(gap_col.tolist()) if gap_col.any() else ()
    # float64 sums in RunContext.iteration_ms's order: Python's own values
    iteration_ms = (
        (step_col + wait_col + gap_col).tolist() if gap_ms else (step_col + wait_col).tolist()
    )

    def phase_ms(name: str) -> tuple[float, ...]:
        """Each timed step's *name* phase, ms; empty when no step lists it."""
        listed = timed.has_phase.get(name)
        if listed is None or not listed.any():
            return ()
        return tuple((timed.phases[name] / _NS_PER_MS).tolist())

    ctx = RunContext(
        run_name=run["run_name"],
        status=run["status"],
        step_ms=step_ms,
        wait_ms=wait_ms,
        explicit_wait=bool(cols.explicit.any()),
        gap_ms=gap_ms,
        data_ms=phase_ms(DATA_PHASE),
        micro_batches=tuple(timed.micro.tolist()),
        comm_ms=phase_ms(COMM_PHASE),
        phase_ms=phase_totals,
        duration_s=max(duration_s, 0.0),
        **_host_aggregates(host_cols, cols),
        iteration_ms_thirds=_thirds(iteration_ms, median),
        **_cpu_figures(host_cols, cpu_cols, timed, run.get("cpu_count"), job_cores, job_ranks),
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
        skipped_updates=int(cols.skipped.sum()),
        optimizers=_optimizer_totals(cols),
        **_torch_memory(cols),
        gpu=gpu if gpu is not None else gpu_stats(gpu_samples) if gpu_samples else None,
        kernels=_kernels(kernel_windows),
        checkpointing_declared=_checkpointing_declared(options),
        traced_steps=len(cols) - len(timed),
        step_numbers=tuple(timed_numbers.tolist()),
        # the numbers are unique and rise: the traced steps' own, unless all are
        traced_step_numbers=tuple(numbers[cols.traced].tolist()) if untraced.any() else (),
        comm=_comm_totals(comm),
        eval_ms=(int(cols.eval.sum()) + (run.get("trailing_eval_ns") or 0)) / _NS_PER_MS,
        steady_phase_ms=steady_phase_totals,
        world_size=int(run.get("world_size") or 1),
        tokens_per_step=positive_count(options.get("tokens_per_step")),
        samples_per_step=positive_count(options.get("samples_per_step")),
        history_iteration_ms=tuple(tuple(h) for h in history_iteration_ms),
        history_unit=history_unit,
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
