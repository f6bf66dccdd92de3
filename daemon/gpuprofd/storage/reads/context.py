"""One run's stored rows, in the shapes :func:`build_context` reads (steps,
host samples, CPU, DataLoader workers, GPU rollups, kernel windows, comm
totals, findings), and :func:`run_context`: the :class:`RunContext` the
daemon's rules and ``gpuprofctl`` build from them, one definition.

Each read is ``async def f(db: Reader, ...)`` over a
:class:`gpuprofd.storage.reader.Reader` (SQL and row converters in
:mod:`gpuprofd.storage.reads.queries`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof.insights import RunContext, build_context, hostcpu
from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.base import WARMUP_STEPS, mean_micro
from gpuprof.insights.context import steady_iterations
from gpuprof.insights.history import HISTORY_STEPS, work_scale
from gpuprof.insights.stepcols import StepColumns
from gpuprof.kernels import KernelAgg
from gpuprofd.sampling import rollup
from gpuprofd.storage import commpack, unreadable
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import queries, samplerows, steprows


async def count_steps(db: Reader, run_id: int) -> int:
    """How many steps the run stored (packed or not)."""
    return await steprows.count(db, run_id)


async def last_step_end(db: Reader, run_id: int) -> int | None:
    """The latest ``t1`` (monotonic ns) of the run's steps; None without steps."""
    return await steprows.latest_t1(db, run_id)


async def max_step(db: Reader, run_id: int) -> int | None:
    """The run's highest step index; None without steps."""
    return await steprows.max_step(db, run_id)


async def run_steps(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's steps ordered by ``t0`` in :func:`build_context`'s shape."""
    if await steprows.packed_end(db, run_id) is None:  # rows only: made dicts as they are
        got = await steprows.rows(db, run_id, parsed=False)
        return [queries.step_from_row(r, run_id) for r in got]
    return queries.steps_from_columns(await steprows.columns(db, run_id), run_id)


async def run_step_columns(db: Reader, run_id: int) -> StepColumns:
    """The run's steps ordered by ``t0`` as the columns :func:`build_context`
    takes (:class:`gpuprof.insights.stepcols.StepColumns`), read without a
    dict per step (packed blocks stay columns: a day is ~0.1 s CPU)."""
    return StepColumns(**queries.step_fields(await steprows.columns(db, run_id), run_id))


async def host_columns(
    db: Reader, start_mono_ns: int, end_mono_ns: int, boot_id: str | None = None
) -> hostcpu.HostColumns:
    """The host samples of boot *boot_id* with ``start <= mono_ns <= end``,
    packed or not (:mod:`gpuprofd.storage.reads.samplerows`), as numpy
    columns without a Python value per sample (a day is 172,800): the
    readings aligned to steps per sample
    (:data:`gpuprof.insights.hostcpu.HOST_FIELDS`), the others' means
    (:data:`gpuprof.insights.hostcpu.HOST_MEANS`)."""
    got = await samplerows.read(db, samplerows.HOST, boot_id, start_mono_ns, end_mono_ns)
    return host_columns_of(got)


def host_columns_of(got: samplerows.Samples) -> hostcpu.HostColumns:
    """Host samples read by :func:`samplerows.read` as :class:`hostcpu.HostColumns`."""
    import numpy as np

    cache, total = got.numbers("page_cache_bytes"), got.numbers("mem_total_bytes")
    with np.errstate(divide="ignore", invalid="ignore"):  # no total: NULL, as SQL's CASE
        fraction = np.where(total != 0, cache / total, np.nan)
    means = {
        "disk_read_iops": samplerows.mean(got.numbers("disk_read_iops")),
        "page_cache_fraction": samplerows.mean(fraction),
        "swap_in_bps": samplerows.mean(got.numbers("swap_in_bps")),
    }
    ns = got.times()
    fields = (got.numbers(c) for c in ("cpu_pct", "cpu_count", "disk_read_bps"))
    return hostcpu.HostColumns(ns, np.ones(len(ns), bool), *fields, means=means)


async def history_runs(
    db: Reader, run_id: int, run_name: str
) -> list[tuple[int, float, int, dict[str, Any]]]:
    """(id, median step ms, world size, options) of up to
    :data:`queries.HISTORY_RUNS` earlier finished runs of *run_name*, newest first."""
    rows = await db.fetchall(queries.HISTORY_SQL, (run_name, run_id, queries.HISTORY_RUNS))
    out = []
    for r in rows:
        options = queries.run_from_row(r)["options"]
        out.append((int(r["id"]), float(r["median_step_ms"]), int(r["world_size"] or 1), options))
    return out


async def scaled_history(
    db: Reader, run: Mapping[str, Any], now_micro: float = 1.0
) -> tuple[list[float], list[tuple[float, ...]], str]:
    """The regression's history of *run* (``id``, ``run_name``, ``world_size``,
    ``options``; *now_micro* its mean micro-batches per step): the earlier
    runs' median iteration ms and steady iteration times, each scaled to
    this run's work of an iteration where they did other work (declared, or
    other micro-batches or ranks: :func:`gpuprof.insights.history.work_scale`),
    and the unit that was compared by (``iteration`` when none was scaled)."""
    now = run.get("options") if isinstance(run.get("options"), dict) else {}
    world = int(run.get("world_size") or 1)
    medians, steps, unit = [], [], "iteration"
    for rid, median_ms, then_world, then in await history_runs(db, run["id"], run["run_name"]):
        iterations, then_micro = await history_work(db, rid)
        factor, by = work_scale(now, world, then, then_world, now_micro, then_micro)
        if by != "iteration":
            unit = by
        medians.append(median_ms * factor)
        steps.append(tuple(ms * factor for ms in iterations))
    return medians, steps, unit


async def history_iterations(db: Reader, run_id: int) -> tuple[float, ...]:
    """The steady iteration times (ms) of an earlier run, at most its last
    :data:`gpuprof.insights.history.HISTORY_STEPS` (by ``t0``): what the
    regression rule compares with. Empty when its steps are gone."""
    return (await history_work(db, run_id))[0]


async def history_work(db: Reader, run_id: int) -> tuple[tuple[float, ...], float]:
    """(:func:`history_iterations`, the mean micro-batches per step over the
    same steps; 1.0 when its steps are gone)."""
    limit = HISTORY_STEPS + WARMUP_STEPS + 1  # more than that: the warm-up is not among them
    rows = await steprows.last_rows(db, run_id, limit)
    steps = [
        {"t0": r[1], "t1": r[2], "wait": r[3], "phases": r[6] or {}, "traced": bool(r[13])}
        for r in rows
    ]
    got = steady_iterations(steps, whole=len(rows) < limit)
    return got[-HISTORY_STEPS:], mean_micro([int(r[5] or 1) for r in rows])


async def run_cpu_columns(db: Reader, run_id: int) -> hostcpu.CpuColumns:
    """The run's process-tree CPU samples (``mono_ns``, ``cores``; none
    without cores) in time order, packed or not
    (:mod:`gpuprofd.storage.reads.samplerows`), as numpy columns
    (:class:`gpuprof.insights.hostcpu.CpuColumns`)."""
    return cpu_columns_of(await samplerows.read(db, samplerows.RUN_CPU, run_id))


def cpu_columns_of(got: samplerows.Samples) -> hostcpu.CpuColumns:
    """CPU samples read by :func:`samplerows.read` as :class:`hostcpu.CpuColumns`,
    those without cores left out."""
    import numpy as np

    cores = got.numbers("cores")
    keep = ~np.isnan(cores)
    return hostcpu.CpuColumns(got.times()[keep], np.ones(int(keep.sum()), bool), cores[keep])


def _sorted_unique(values: Any) -> Any:
    """*values* (int64 ns) sorted, each once: ``np.unique`` by sorting (the
    samples come in time order, so the sort is a pass), not by hashing
    (numpy 2.3+'s default: ~0.1 s for a day's 172,800 samples)."""
    import numpy as np

    out = np.sort(values, kind="stable")
    if len(out) < 2:
        return out
    keep = np.empty(len(out), bool)
    keep[0] = True
    np.not_equal(out[1:], out[:-1], out=keep[1:])
    return out[keep]


async def job_cpu(
    db: Reader,
    run: Mapping[str, Any],
    own: hostcpu.CpuColumns | None = None,
    host_ns: Any | None = None,
) -> list[dict[str, Any]]:
    """The CPU of *run*'s job on its node (its group's runs there summed) as
    one ``cores``/``ranks`` row: ``cores`` the mean over the run's own sample
    times of the cores its group's runs there used at each, ``ranks`` the
    most of those runs sampled together (:func:`queries.most_at_once`); none
    outside a group or without samples.

    *own*: the run's samples (:func:`run_cpu_columns`) and *host_ns*: the
    ``mono_ns`` (int64 array) of its boot's host samples over its run, when
    the caller has read them already. The group's samples are summed over the
    span of the run's own sample times: from each run's host rollups where
    they hold whole blocks of it (:func:`queries.job_rolled_sql`: the cores
    at each host sample time), from the samples elsewhere (by index). The
    host sampler samples every live run at each host sample's time, so the
    only samples in that span not at one of the run's own times are at host
    sample times the run lacks (its tree unreadable then): those are found
    and taken out, so the figure is the mean over the run's own times."""
    import numpy as np

    params = queries.job_cpu_params(run)
    if params is None:
        return []
    if own is None:
        own = await run_cpu_columns(db, run["id"])
    times = _sorted_unique(own.mono_ns[own.timed & ~np.isnan(own.cores)])
    if not len(times):
        return []
    t0, t1 = int(times[0]), int(times[-1])
    ids = [int(r[0]) for r in await db.fetchall(queries.JOB_RUNS_SQL, params[:3])]
    if not ids:
        return []
    spans = []
    for rid in ids:
        got = await samplerows.span(db, samplerows.RUN_CPU, rid, t0, t1)
        if got is not None:
            spans.append(got)
    # whole blocks from the host rollups, the rest from the samples
    rolled = await db.fetchall(queries.job_rolled_sql(len(ids)), (*ids, t0, t1))
    total = sum(float(r["total"]) for r in rolled if r["total"] is not None)
    by_run = {int(r["run_id"]): (int(r["lo"]), int(r["hi"])) for r in rolled}
    summed = False
    for rid in ids:
        lo, hi = by_run.get(rid, (t1 + 1, t1))  # without rollups: its whole span
        for a, z in ((t0, lo - 1), (hi + 1, t1)):
            if a > z:
                continue
            got = samplerows.total(
                (await samplerows.read(db, samplerows.RUN_CPU, rid, a, z)).numbers("cores")
            )
            if got is not None:
                total, summed = total + got, True
    if not summed and not rolled:
        return []
    if host_ns is None or not len(host_ns) or host_ns[0] > t0 or host_ns[-1] < t1:
        host_ns = (await samplerows.read(db, samplerows.HOST, run.get("boot_id"), t0, t1)).times()
    ticks = _sorted_unique(host_ns[(host_ns >= t0) & (host_ns <= t1)])
    at = np.minimum(np.searchsorted(times, ticks), len(times) - 1)
    lacked = ticks[times[at] != ticks]
    if len(lacked):
        for rid in ids:
            cpu = await samplerows.read(
                db, samplerows.RUN_CPU, rid, int(lacked[0]), int(lacked[-1])
            )
            got = samplerows.total(samplerows.cores_at(cpu, lacked))
            if got is not None:
                total -= got
    return [{"cores": total / len(times), "ranks": queries.most_at_once(spans)}]


async def worker_cpu(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's DataLoader workers' CPU rows (see :data:`queries.WORKER_CPU_SQL`)."""
    return [dict(r) for r in await db.fetchall(queries.WORKER_CPU_SQL, (run_id,))]


async def stack_samples(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's sampled stacks (see :data:`queries.STACK_SAMPLES_SQL`)."""
    return [dict(r) for r in await db.fetchall(queries.STACK_SAMPLES_SQL, (run_id,))]


async def comm_totals(
    db: Reader, run_id: int, steps: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The run's timed gradient buckets summed (:data:`queries.COMM_TOTALS_SQL`);
    with *steps* ``(first, last)``, those of the steps in that range only."""
    if steps is None:
        row = await db.fetchone(queries.COMM_TOTALS_SQL, (run_id,))
    else:
        sql = queries.COMM_TOTALS_SQL + " AND step BETWEEN ? AND ?"
        row = await db.fetchone(sql, (run_id, *steps))
    return dict(row) if row is not None else {"steps": 0, "buckets": 0, "bytes": 0}


async def comm_buckets(
    db: Reader, run_id: int, first: int = 0, last: int = 2**62
) -> list[tuple[int | None, ...]]:
    """The run's DDP bucket rows ``(step, bucket, start_ns, end_ns, bytes)``
    (ns: the rank's monotonic clock; None: not given) of steps *first* to
    *last*, by step: every reader of ``comm_steps`` reads them here. A step
    whose packed row is damaged is left out (counted:
    :func:`gpuprofd.storage.unreadable.block`)."""
    stored = await db.fetchall(queries.COMM_STEPS_SQL, (run_id, first, last))
    out: list[tuple[int | None, ...]] = []
    for step, packed in stored:
        got = unreadable.block(
            packed, functools.partial(commpack.step_buckets, step), "comm_steps", run_id, step
        )
        out.extend(got or ())
    return out


async def gpu_stats(
    db: Reader, run: Mapping[str, Any], steps: Sequence[Mapping[str, Any]] | StepColumns
) -> GpuStats | None:
    """The run's GPU stats while it was in steps, from its per-second rollups."""
    window = queries.gpu_window(run.get("cuda_uuid"), steps, run.get("boot_id"))
    if window is None:
        return None
    return queries.gpu_stats_from_rollups(await db.fetchall(rollup.MERGED_SQL, window))


async def kernel_windows(db: Reader, run_id: int) -> list[queries.KernelWindow]:
    """The run's kernel windows with their rows, by ``t0`` (see
    :func:`queries.kernel_windows_from_rows`)."""
    windows = await db.fetchall(queries.KERNEL_WINDOWS_SQL, (run_id,))
    stats = await db.fetchall(queries.KERNEL_STATS_SQL, (run_id,))
    return queries.kernel_windows_from_rows(windows, stats, run_id)


#: A run's evidence windows (gpuprof.evidence), by start.
EVIDENCE_WINDOWS_SQL = (
    "SELECT request_id, rule, time_kind, window_id, t0_ns, t1_ns, first_step, last_step "
    "FROM evidence_windows WHERE run_id = ? ORDER BY t0_ns"
)
#: ... and their rows.
EVIDENCE_STATS_SQL = (
    "SELECT window_id, name, kind, cls, count, total_ns, self_ns, flops FROM kernel_stats "
    "WHERE run_id = ? AND window_id IN (SELECT window_id FROM evidence_windows WHERE run_id = ?)"
)


async def evidence_windows(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's evidence windows, oldest first: each ``{request_id, rule,
    time, window_id, t0_ns, t1_ns, steps, rows}`` (``time``: ``device`` or
    ``cpu``, what the rows' ns are; ``steps``: the step indices covered;
    ``rows``: its :class:`gpuprof.kernels.KernelAgg` rows), as
    :func:`gpuprof.evidence.attach` reads them."""
    links = await db.fetchall(EVIDENCE_WINDOWS_SQL, (run_id,))
    if not links:
        return []
    stats = await db.fetchall(EVIDENCE_STATS_SQL, (run_id, run_id))
    by_id: dict[int, list[KernelAgg]] = {}
    for wid, *row in stats:
        by_id.setdefault(wid, []).append(KernelAgg.from_stored(row))
    out = []
    for request_id, rule, time_kind, wid, t0, t1, first, last in links:
        steps = list(range(first, last + 1)) if first is not None and last is not None else []
        out.append(
            {
                "request_id": request_id,
                "rule": rule,
                "time": time_kind or "device",
                "window_id": wid,
                "t0_ns": t0,
                "t1_ns": t1,
                "steps": steps,
                "rows": by_id.get(wid, []) if wid is not None else [],
            }
        )
    return out


async def stored_insights(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's stored findings, in the order found, as ``Insight.to_dict()``."""
    rows = await db.fetchall(queries.INSIGHTS_SQL, (run_id,))
    return [queries.insight_from_row(r, run_id, i) for i, r in enumerate(rows)]


async def run_context(
    db: Reader,
    run: Mapping[str, Any],
    *,
    gpu_rate_usd_per_hour: float | None = None,
    now_mono_ns: int | None = None,
) -> RunContext:
    """A run's :class:`RunContext` from its stored rows: what the daemon's
    rules (live and at the run's end) and ``gpuprofctl`` read, one definition.

    Host samples cover the run's start to its end; a run not ended yet
    (no ``end_mono_ns``) to *now_mono_ns* (the daemon's clock), else to its
    last step's end. :func:`build_context` runs in a worker thread (a day of
    steps takes a while)."""
    run_id = run["id"]
    start = run.get("start_mono_ns")

    async def cpu_reads(
        end: int | None,
    ) -> tuple[
        hostcpu.HostColumns | list[dict[str, Any]], hostcpu.CpuColumns, list[dict[str, Any]]
    ]:
        """Host samples from the run's start to *end*, its CPU, its job's CPU."""
        host: hostcpu.HostColumns | list[dict[str, Any]] = []
        own = asyncio.ensure_future(run_cpu_columns(db, run_id))  # read meanwhile
        try:
            if start is not None and end is not None:
                host = await host_columns(db, start, end, run.get("boot_id"))
            cpu = await own
        finally:
            own.cancel()  # only where the host read failed
        host_ns = host.mono_ns[host.timed] if isinstance(host, hostcpu.HostColumns) else None
        return host, cpu, await job_cpu(db, run, cpu, host_ns)

    # the aggregates summed by the database (its bucket totals, ...) and, when
    # the run's end is known without its steps, its CPU reads run meanwhile,
    # where the reader can
    aside = asyncio.gather(
        worker_cpu(db, run_id),
        kernel_windows(db, run_id),
        comm_totals(db, run_id),
        stack_samples(db, run_id),
    )
    known_end = run.get("end_mono_ns") or now_mono_ns
    early = asyncio.ensure_future(cpu_reads(known_end)) if known_end else None
    try:
        got = await run_step_columns(db, run_id)
        gpu_rows = asyncio.ensure_future(gpu_stats(db, run, got))
        history, history_steps, history_unit = await scaled_history(
            db, run, mean_micro(got.micro.tolist())
        )
        if early is not None:
            host, cpu, job = await early
        else:
            host, cpu, job = await cpu_reads(int(got.t1[-1]) if len(got) else None)
        gpu = await gpu_rows
        workers, windows, comm, stacks = await aside
    finally:
        aside.cancel()  # only where a read above failed: nothing is left running
        if early is not None:
            early.cancel()
    return await asyncio.to_thread(
        build_context,
        run,
        got,
        host,
        history,
        gpu_rate_usd_per_hour,
        cpu,
        gpu=gpu,
        workers=workers,
        kernel_windows=windows,
        comm=comm,
        job_cpu=job,
        history_iteration_ms=history_steps,
        stacks=stacks,
        history_unit=history_unit,
    )
