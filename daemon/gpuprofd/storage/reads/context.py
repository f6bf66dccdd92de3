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
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gpuprof.insights import RunContext, build_context
from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.base import WARMUP_STEPS
from gpuprof.insights.context import steady_iterations
from gpuprof.insights.history import HISTORY_STEPS
from gpuprof.kernels import KernelAgg
from gpuprofd.sampling import rollup
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads import queries


async def count_steps(db: Reader, run_id: int) -> int:
    """How many steps the run stored."""
    row = await db.fetchone("SELECT COUNT(*) AS n FROM steps WHERE run_id = ?", (run_id,))
    return int(row["n"]) if row else 0


async def last_step_end(db: Reader, run_id: int) -> int | None:
    """The latest ``t1`` (monotonic ns) of the run's steps; None without steps."""
    row = await db.fetchone("SELECT MAX(t1_ns) AS t1 FROM steps WHERE run_id = ?", (run_id,))
    return None if row is None or row["t1"] is None else int(row["t1"])


async def max_step(db: Reader, run_id: int) -> int | None:
    """The run's highest step index (:data:`queries.MAX_STEP_SQL`); None without steps."""
    row = await db.fetchone(queries.MAX_STEP_SQL, (run_id,))
    return None if row is None or row[0] is None else int(row[0])


async def run_steps(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's steps ordered by ``t0`` in :func:`build_context`'s shape."""
    rows = await db.fetchall(queries.STEPS_SQL, (run_id,))
    return [queries.step_from_row(r) for r in rows]


async def host_samples(
    db: Reader, start_mono_ns: int, end_mono_ns: int, boot_id: str | None = None
) -> list[dict[str, Any]]:
    """Host samples of boot *boot_id* with ``start <= mono_ns <= end``."""
    rows = await db.fetchall(queries.HOST_SQL, (start_mono_ns, end_mono_ns, boot_id))
    return [dict(r) for r in rows]


async def history_runs(db: Reader, run_id: int, run_name: str) -> list[tuple[int, float]]:
    """(id, median step ms) of up to :data:`queries.HISTORY_RUNS` earlier
    finished runs of *run_name*, newest first."""
    rows = await db.fetchall(queries.HISTORY_SQL, (run_name, run_id, queries.HISTORY_RUNS))
    return [(int(r["id"]), float(r["median_step_ms"])) for r in rows]


async def history_iterations(db: Reader, run_id: int) -> tuple[float, ...]:
    """The steady iteration times (ms) of an earlier run, at most its last
    :data:`gpuprof.insights.history.HISTORY_STEPS` (by ``t0``): what the
    regression rule compares with. Empty when its steps are gone."""
    limit = HISTORY_STEPS + WARMUP_STEPS + 1  # more than that: the warm-up is not among them
    rows = await db.fetchall(queries.LAST_STEPS_SQL, (run_id, limit))
    steps = [
        {
            "t0": r[0],
            "t1": r[1],
            "wait": r[2],
            "phases": orjson.loads(r[3]) if r[3] else {},
            "traced": bool(r[4]),
        }
        for r in reversed(rows)
    ]
    got = steady_iterations(steps, whole=len(rows) < limit)
    return got[-HISTORY_STEPS:]


async def run_cpu(db: Reader, run_id: int) -> list[dict[str, Any]]:
    """The run's process-tree CPU samples, ``mono_ns`` and ``cores`` each, in
    time order (:data:`queries.RUN_CPU_SQL`); none without samples."""
    return [dict(r) for r in await db.fetchall(queries.RUN_CPU_SQL, (run_id,))]


async def job_cpu(db: Reader, run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The CPU of *run*'s job on its node (its group's runs there summed) as
    one ``cores``/``ranks`` row: ``cores`` the mean over the run's own sample
    times of the cores its group's runs there used at each
    (:data:`queries.JOB_CPU_SQL`), ``ranks`` the most of those runs sampled
    together (:func:`queries.most_at_once`); none outside a group or without
    samples."""
    params = queries.job_cpu_params(run)
    if params is None:
        return []
    own = await db.fetchone(queries.OWN_CPU_TIMES_SQL, (run["id"],))
    if own is None or not own["n"]:
        return []
    row = await db.fetchone(queries.JOB_CPU_SQL, params)
    if row is None or row["total"] is None:
        return []
    spans = []
    for (rid,) in await db.fetchall(queries.JOB_RUNS_SQL, params[:3]):
        got = await db.fetchone(queries.CPU_SPAN_SQL, (rid, own["t0"], own["t1"]) * 2)
        if got is not None and got["t0"] is not None:
            spans.append((int(got["t0"]), int(got["t1"])))
    return [{"cores": float(row["total"]) / int(own["n"]), "ranks": queries.most_at_once(spans)}]


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


async def gpu_stats(
    db: Reader, run: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]
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
    return queries.kernel_windows_from_rows(windows, stats)


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
    return [queries.insight_from_row(r) for r in rows]


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
    # the aggregates summed by the database (its job's CPU over every rank's
    # samples, its bucket totals) run meanwhile, where the reader can
    aside = asyncio.gather(
        job_cpu(db, run),
        worker_cpu(db, run_id),
        kernel_windows(db, run_id),
        comm_totals(db, run_id),
        stack_samples(db, run_id),
    )
    try:
        got = await run_steps(db, run_id)
        gpu_rows = asyncio.ensure_future(gpu_stats(db, run, got))
        host: list[dict[str, Any]] = []
        start = run.get("start_mono_ns")
        end = run.get("end_mono_ns") or now_mono_ns or (got[-1]["t1"] if got else None)
        if start is not None and end is not None:
            host = await host_samples(db, start, end, run.get("boot_id"))
        history = await history_runs(db, run_id, run["run_name"])
        history_steps = [await history_iterations(db, hid) for hid, _ in history]
        cpu = await run_cpu(db, run_id)
        gpu = await gpu_rows
        job, workers, windows, comm, stacks = await aside
    finally:
        aside.cancel()  # only where a read above failed: nothing is left running
    return await asyncio.to_thread(
        build_context,
        run,
        got,
        host,
        [ms for _, ms in history],
        gpu_rate_usd_per_hour,
        cpu,
        gpu=gpu,
        workers=workers,
        kernel_windows=windows,
        comm=comm,
        job_cpu=job,
        history_iteration_ms=history_steps,
        stacks=stacks,
    )
