"""Read queries of :mod:`gpuprofd.storage.reads` (the daemon, gpuprofctl, the
API), with the converters from rows to the shapes :func:`build_context`
reads. Pure: no connection here.

Written once in the SQL both SQLite and Postgres run, ``?`` placeholders
(:mod:`gpuprofd.storage.dialect`): ``IS NOT DISTINCT FROM``, not ``IS``;
sums cast to ``DOUBLE PRECISION`` (Postgres sums integers as numeric);
subqueries in FROM named."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.gains import from_stored
from gpuprof.insights.gpu import GpuAccumulator
from gpuprof.kernels import KernelAgg
from gpuprofd.sampling import rollup
from gpuprofd.sampling.nvml import normalize_uuid

#: How many earlier finished runs of the same name the regression rule sees.
HISTORY_RUNS = 3

STEPS_SQL = (
    "SELECT t0_ns, t1_ns, wait_ns, explicit, micro, phases, skipped, eval_ns, optimizers, "
    "mem_allocated_bytes, mem_reserved_bytes, mem_peak_bytes, traced, step FROM steps "
    "WHERE run_id = ? ORDER BY t0_ns"
)
HOST_SQL = (
    "SELECT mono_ns, cpu_pct, cpu_count, disk_read_bps, disk_read_iops, page_cache_bytes, "
    "mem_total_bytes, swap_in_bps FROM host_samples "
    "WHERE mono_ns BETWEEN ? AND ? AND boot_id IS NOT DISTINCT FROM ? ORDER BY mono_ns"
)
#: A run's process-tree CPU samples (``mono_ns``, ``cores``), in time order:
#: :func:`build_context` aligns them with the host samples taken at the same
#: ``mono_ns`` to each step (a day is 172,800 rows at 2 Hz, as many as the
#: host samples it reads anyway).
RUN_CPU_SQL = (
    "SELECT mono_ns, cores FROM run_cpu_samples "
    "WHERE run_id = ? AND cores IS NOT NULL ORDER BY mono_ns"
)
#: The CPU of a run's job on this node, summed: the cores of its group's
#: runs here (the job's ranks: the host sampler samples every live run at the
#: same ``mono_ns``) at each of the run's own sample times, added up over those
#: times (``total``; NULL without any). Divided by :data:`OWN_CPU_TIMES_SQL` it
#: is their mean per sample time. One pass through the index, no grouping by
#: time: a day's 8 ranks are 1.4 M rows. Params: :func:`job_cpu_params`.
JOB_CPU_SQL = (
    "SELECT CAST(SUM(s.cores) AS DOUBLE PRECISION) AS total "
    "FROM run_cpu_samples s JOIN runs r ON r.id = s.run_id "
    "WHERE r.group_id = ? AND r.host IS NOT DISTINCT FROM ? "
    "AND r.boot_id IS NOT DISTINCT FROM ? AND s.cores IS NOT NULL "
    "AND s.mono_ns IN (SELECT mono_ns FROM run_cpu_samples WHERE run_id = ? "
    "AND cores IS NOT NULL)"
)
#: A run's sample times with a ``cores`` figure, how many, first and last.
OWN_CPU_TIMES_SQL = (
    "SELECT COUNT(DISTINCT mono_ns) AS n, MIN(mono_ns) AS t0, MAX(mono_ns) AS t1 "
    "FROM run_cpu_samples WHERE run_id = ? AND cores IS NOT NULL"
)
#: The runs of a run's job on this node (its group's runs here): ``(group,
#: host, boot)``.
JOB_RUNS_SQL = (
    "SELECT id FROM runs WHERE group_id = ? AND host IS NOT DISTINCT FROM ? "
    "AND boot_id IS NOT DISTINCT FROM ?"
)
#: A run's first and last CPU sample within ``[t0, t1]`` (by index: two
#: lookups): ``(run_id, t0, t1, run_id, t0, t1)``.
CPU_SPAN_SQL = (
    "SELECT (SELECT MIN(mono_ns) FROM run_cpu_samples WHERE run_id = ? "
    "AND mono_ns BETWEEN ? AND ?) AS t0, (SELECT MAX(mono_ns) FROM run_cpu_samples "
    "WHERE run_id = ? AND mono_ns BETWEEN ? AND ?) AS t1"
)


def most_at_once(spans: Sequence[tuple[int, int]]) -> int:
    """The most of *spans* (``(first, last)`` ns, both included) that hold one
    instant; 0 without spans. The sampler samples every live run at each
    tick, so the runs sampled together at one time are the runs whose sample
    spans overlap there."""
    events = sorted([(a, 0) for a, _ in spans] + [(b, 1) for _, b in spans])
    most = now = 0
    for _, end in events:  # at one instant starts come before ends: both held
        now += -1 if end else 1
        most = max(most, now)
    return most


def job_cpu_params(run: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """:data:`JOB_CPU_SQL`'s parameters for *run*; None outside a group."""
    if not run.get("group_id"):
        return None
    return (run["group_id"], run.get("host"), run.get("boot_id"), run["id"])


#: A run's DataLoader workers: one row per worker process, ``cpu_s`` its CPU
#: seconds so far; grouped by ``loader_seq`` (one loader iterator's pool).
WORKER_CPU_SQL = (
    "SELECT loader_seq, worker_id, pid, first_mono_ns, last_mono_ns, cpu_s, ctx_voluntary, "
    "ctx_involuntary FROM worker_cpu "
    "WHERE run_id = ? ORDER BY loader_seq, worker_id"
)
#: A run's sampled stacks (gpuprof.insights.frames): samples per frame and step.
STACK_SAMPLES_SQL = (
    "SELECT source, step, path, line, func, callee, samples FROM stack_samples "
    "WHERE run_id = ? ORDER BY source, step, samples DESC"
)
HISTORY_SQL = (
    "SELECT id, median_step_ms FROM runs WHERE run_name = ? AND id < ? AND status = 'finished' "
    "AND median_step_ms IS NOT NULL ORDER BY id DESC LIMIT ?"
)
#: A run's last steps, newest first (``LIMIT ?``): a history run's iterations.
LAST_STEPS_SQL = (
    "SELECT t0_ns, t1_ns, wait_ns, phases, traced FROM steps WHERE run_id = ? "
    "ORDER BY t0_ns DESC LIMIT ?"
)
INSIGHTS_SQL = (
    "SELECT rule, severity, title, detail, fix, evidence FROM insights WHERE run_id = ? "
    "ORDER BY rowid"
)
#: A group's stored findings (set when the group ended), in the order found.
GROUP_INSIGHTS_SQL = (
    "SELECT ranks, rule, severity, title, detail, fix, evidence, created_wall_ns "
    "FROM group_insights WHERE group_id = ? ORDER BY rowid"
)


#: A run's timed gradient buckets summed (:class:`gpuprof.insights.base.CommTotals`):
#: one row, ``steps`` 0 when it has none.
COMM_TOTALS_SQL = (
    "SELECT COUNT(DISTINCT step) AS steps, COUNT(*) AS buckets, "
    "CAST(COALESCE(SUM(bytes), 0) AS DOUBLE PRECISION) AS bytes FROM comm_buckets "
    "WHERE run_id = ?"
)
#: A group rank's last steps up to an index, newest index first, as
#: :class:`gpuprof.insights.group_context.RankRows` reads them: ``(run_id, max
#: step, limit)`` (by the ``steps_run_step`` index: a group's window costs the
#: same on a day-long run).
GROUP_TAIL_SQL = (
    "SELECT step, t0_ns, t1_ns, phases, traced FROM steps WHERE run_id = ? AND step <= ? "
    "ORDER BY step DESC LIMIT ?"
)
#: A run's highest step index (NULL: no steps).
MAX_STEP_SQL = "SELECT MAX(step) FROM steps WHERE run_id = ?"
#: ... and its bucket rows for steps ``BETWEEN ? AND ?``.
GROUP_BUCKETS_SQL = (
    "SELECT step, bucket, start_ns, end_ns, bytes FROM comm_buckets "
    "WHERE run_id = ? AND step BETWEEN ? AND ?"
)


def group_step_from_row(r: Sequence[Any]) -> dict[str, Any]:
    """A :data:`GROUP_TAIL_SQL` row as ``RankRows.steps`` wants it."""
    step, t0, t1, phases, traced = r
    return {
        "step": step,
        "t0": t0,
        "t1": t1,
        "phases": _loads(phases) if phases else {},
        "traced": bool(traced),
    }


#: A run's kernel windows (``kernels`` events, ``nsys-import``), by start.
KERNEL_WINDOWS_SQL = (
    "SELECT id, t0_ns, t1_ns, source, steps, rows_dropped FROM kernel_windows "
    "WHERE run_id = ? ORDER BY t0_ns, id"
)
#: ... and their rows (one query for the run, matched to windows by id; in
#: index order, no sort: :func:`kernel_windows_from_rows` orders each window).
KERNEL_STATS_SQL = (
    "SELECT window_id, name, kind, cls, count, total_ns, self_ns, flops FROM kernel_stats "
    "WHERE run_id = ?"
)

#: One window as :func:`kernel_windows_from_rows` gives it: (window, rows).
KernelWindow = tuple[dict[str, Any], list[KernelAgg]]

_loads = orjson.loads


def kernel_windows_from_rows(
    windows: Iterable[Sequence[Any]], stats: Iterable[Sequence[Any]]
) -> list[KernelWindow]:
    """Rows of :data:`KERNEL_WINDOWS_SQL` and :data:`KERNEL_STATS_SQL` as
    ``(window, rows)`` pairs in window order: *window* a dict with ``id``,
    ``t0``/``t1`` (monotonic ns), ``source``, ``steps`` (step indices),
    ``n_steps`` (how many steps it covered: a window merged by
    :mod:`gpuprofd.storage.upkeep.kcompact` past its list limit stores only the count, and
    ``steps`` is then empty) and ``rows_dropped``; *rows* its
    :class:`KernelAgg` rows, most device time first. Stats rows of no listed
    window are ignored."""
    out: list[KernelWindow] = []
    by_id: dict[int, list[KernelAgg]] = {}
    for wid, t0, t1, source, steps, dropped in windows:
        rows: list[KernelAgg] = []
        by_id[wid] = rows
        got = _loads(steps) if steps else []
        listed = got if isinstance(got, list) else []
        n_steps = len(listed) if isinstance(got, list) else int(got.get("n") or 0)
        window = {
            "id": wid,
            "t0": t0,
            "t1": t1,
            "source": source,
            "steps": listed,
            "n_steps": n_steps,
            "rows_dropped": dropped or 0,
        }
        out.append((window, rows))
    for wid, *row in stats:
        rows_of = by_id.get(wid)
        if rows_of is not None:
            rows_of.append(KernelAgg.from_stored(row))
    for _, rows in out:
        rows.sort(key=_by_device_time)
    return out


def _by_device_time(r: KernelAgg) -> tuple[int, str, str]:
    return -r.total_ns, r.kind, r.name


def step_from_row(r: Sequence[Any]) -> dict[str, Any]:
    """A ``steps`` row of :data:`STEPS_SQL` as :func:`gpuprof.insights.build_context`
    reads it (``mem`` only where the step carried torch's allocator figures;
    ``traced`` only where a profiler snapshot ran in it).

    Unpacked by position: a day of 500 ms steps is 172,800 rows, and lookups
    by column name cost more than the rest of the conversion."""
    t0, t1, wait, explicit, micro, phases, skipped, eval_ns, opts, alloc, resv, peak, traced, i = r
    step = {
        "step": i,
        "t0": t0,
        "t1": t1,
        "wait": wait,
        "explicit": bool(explicit),
        "micro": micro,
        "phases": _loads(phases) if phases else {},
        "skipped": bool(skipped),
        "eval": eval_ns or 0,
        "optimizers": _loads(opts) if opts else [],
    }
    if alloc is not None:
        step["mem"] = [alloc, resv, peak]
    if traced:
        step["traced"] = True
    return step


def steps_span(steps: Sequence[Mapping[str, Any]]) -> tuple[int, int] | None:
    """(first step's t0, last step's t1) in ns, or None with no steps: the
    window whose GPU samples the GPU rules read."""
    if not steps:
        return None
    return min(s["t0"] for s in steps), max(s["t1"] for s in steps)


def gpu_window(
    cuda_uuid: str | None, steps: Sequence[Mapping[str, Any]], boot_id: str | None = None
) -> tuple[str, str | None, int, int] | None:
    """The parameters of :data:`gpuprofd.sampling.rollup.SELECT_SQL` for a run: its
    GPU's normalized UUID, its boot (:mod:`gpuprofd.core.boot`) and the span of its
    steps (ns): the rollup seconds that overlap the steps. None without a GPU
    or steps.

    A rollup second at either end may hold up to 1 s from before the first
    step or after the last: the price of per-second storage, negligible for
    runs of minutes."""
    want, span = normalize_uuid(cuda_uuid), steps_span(steps)
    if want is None or span is None:
        return None
    return want, boot_id, span[0] - rollup.NS_PER_S, span[1]


def gpu_stats_from_rollups(rows: Iterable[Mapping[str, Any]]) -> GpuStats | None:
    """Merge ``gpu_rollups`` rows (e.g. the one row of
    :data:`gpuprofd.sampling.rollup.MERGED_SQL`) into :class:`GpuStats`; None when
    none carried a utilization reading."""
    acc = GpuAccumulator()
    for r in rows:
        acc.merge(rollup.accumulator_from_row(r))
    return acc.stats()


def run_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A ``runs`` row as a dict with ``options`` and ``tags`` parsed."""
    run = dict(r)
    run["options"] = orjson.loads(run["options"]) if run.get("options") else {}
    run["tags"] = run_tags(run.get("tags"))
    return run


def insight_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """An ``insights`` row as ``Insight.to_dict()`` returns it."""
    d = {k: r[k] for k in ("rule", "severity", "title", "detail", "fix")}
    d["evidence"] = orjson.loads(r["evidence"]) if r["evidence"] else {}
    return from_stored(d)  # its gain, stored in the evidence, back at the top level


def run_tags(text: str | None) -> dict[str, str]:
    """``runs.tags`` (JSON text, or NULL) as a dict; {} when absent or not an
    object of strings (a forwarded value is stored as sent)."""
    if not text:
        return {}
    try:
        tags = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(tags, dict):
        return {}
    return {str(k): str(v) for k, v in tags.items()}
