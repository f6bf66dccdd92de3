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

import numpy as np

from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.gains import from_stored
from gpuprof.insights.gpu import GpuAccumulator
from gpuprof.insights.stepcols import StepColumns
from gpuprof.kernels import KernelAgg
from gpuprofd.sampling import rollup
from gpuprofd.sampling.nvml import normalize_uuid
from gpuprofd.storage import unreadable
from gpuprofd.storage.stepcodec import Columns

#: How many earlier finished runs of the same name the regression rule sees.
HISTORY_RUNS = 3
#: The runs of a run's job on this node (its group's runs here): ``(group,
#: host, boot)``.
JOB_RUNS_SQL = (
    "SELECT id FROM runs WHERE group_id = ? AND host IS NOT DISTINCT FROM ? "
    "AND boot_id IS NOT DISTINCT FROM ?"
)


def job_rolled_sql(runs: int) -> str:
    """Per run of *runs* ids (then ``t0``, ``t1``) with ``host_rollups`` blocks
    lying whole in ``[t0, t1]``: its cores summed over them (``total``) and
    the first and last sample time they hold (``lo``, ``hi``). A run's blocks
    are rolled in time order, every one up to its last row (a block without
    samples writes none), so its samples in ``[lo, hi]`` are all in them."""
    return (
        "SELECT run_id, CAST(SUM(run_cores_sum) AS DOUBLE PRECISION) AS total, "
        "MIN(t0_ns) AS lo, MAX(t1_ns) AS hi FROM host_rollups "
        f"WHERE run_id IN ({', '.join('?' * runs)}) AND t0_ns >= ? AND t1_ns <= ? "
        "GROUP BY run_id"
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
    """``(group, host, boot, run id)`` of *run*'s job (:data:`JOB_RUNS_SQL` takes the first
    three); None outside a group."""
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
    "SELECT run_id, source, step, path, line, func, callee, samples FROM stack_samples "
    "WHERE run_id = ? ORDER BY source, step, samples DESC"
)
HISTORY_SQL = (
    "SELECT id, median_step_ms, world_size, options FROM runs "
    "WHERE run_name = ? AND id < ? AND status = 'finished' "
    "AND median_step_ms IS NOT NULL ORDER BY id DESC LIMIT ?"
)
INSIGHTS_SQL = (
    "SELECT run_id, rule, severity, title, detail, fix, evidence FROM insights WHERE run_id = ? "
    "ORDER BY rowid"
)
#: A group's stored findings (set when the group ended), in the order found.
GROUP_INSIGHTS_SQL = (
    "SELECT ranks, rule, severity, title, detail, fix, evidence, created_wall_ns "
    "FROM group_insights WHERE group_id = ? ORDER BY rowid"
)
#: Whether a group's rules ran once it ended (a row: its findings, none
#: included, are the stored ones).
GROUP_CHECKED_SQL = "SELECT found FROM group_checks WHERE group_id = ?"


#: A run's timed gradient buckets summed (:class:`gpuprof.insights.base.CommTotals`):
#: one row, ``steps`` 0 when it has none.
COMM_TOTALS_SQL = (
    "SELECT COUNT(DISTINCT step) AS steps, CAST(COALESCE(SUM(buckets), 0) AS BIGINT) AS buckets, "
    "CAST(COALESCE(SUM(bytes), 0) AS DOUBLE PRECISION) AS bytes FROM comm_steps "
    "WHERE run_id = ?"
)
#: A run's packed bucket rows (``gpuprofd.storage.commpack``) for steps ``BETWEEN ? AND ?``.
COMM_STEPS_SQL = (
    "SELECT step, packed FROM comm_steps WHERE run_id = ? AND step BETWEEN ? AND ? "
    "ORDER BY step, start_ns"
)


def group_step_from_row(r: Sequence[Any]) -> dict[str, Any]:
    """A :mod:`~gpuprofd.storage.reads.steprows` row as ``RankRows.steps`` wants it."""
    return {"step": r[0], "t0": r[1], "t1": r[2], "phases": r[6] or {}, "traced": bool(r[13])}


#: A run's kernel windows (``kernels`` events, ``nsys-import``), by start.
KERNEL_WINDOWS_SQL = (
    "SELECT id, t0_ns, t1_ns, source, steps, rows_dropped FROM kernel_windows "
    "WHERE run_id = ? ORDER BY t0_ns, id"
)
#: ... and their rows (one query for the run, matched to windows by id; in
#: index order, no sort: :func:`kernel_windows_from_rows` orders each window;
#: ``run_id`` last, naming the run of a cell that is not UTF-8).
KERNEL_STATS_SQL = (
    "SELECT window_id, name, kind, cls, count, total_ns, self_ns, flops, run_id "
    "FROM kernel_stats WHERE run_id = ?"
)

#: One window as :func:`kernel_windows_from_rows` gives it: (window, rows).
KernelWindow = tuple[dict[str, Any], list[KernelAgg]]


def kernel_windows_from_rows(
    windows: Iterable[Sequence[Any]], stats: Iterable[Sequence[Any]], run_id: int | None = None
) -> list[KernelWindow]:
    """Rows of :data:`KERNEL_WINDOWS_SQL` and :data:`KERNEL_STATS_SQL` as
    ``(window, rows)`` pairs in window order: *window* a dict with ``id``,
    ``t0``/``t1`` (monotonic ns), ``source``, ``steps`` (step indices),
    ``n_steps`` (how many steps it covered: a window merged by
    :mod:`gpuprofd.storage.upkeep.kcompact` past its list limit stores only the count, and
    ``steps`` is then empty) and ``rows_dropped``; *rows* its
    :class:`KernelAgg` rows, most device time first. Stats rows of no listed
    window are ignored. A ``steps`` that is not JSON reads as none (counted
    as *run_id*'s: :mod:`gpuprofd.storage.unreadable`)."""
    out: list[KernelWindow] = []
    by_id: dict[int, list[KernelAgg]] = {}
    for wid, t0, t1, source, steps, dropped in windows:
        rows: list[KernelAgg] = []
        by_id[wid] = rows
        got = unreadable.json_cell(
            steps, "kernel_windows.steps", run_id, wid, shape=(list, dict), empty=list
        )
        listed = got if isinstance(got, list) else []
        n = len(listed) if isinstance(got, list) else got.get("n")
        n_steps = n if type(n) is int else 0
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
            rows_of.append(KernelAgg.from_stored(row[:7]))
    for _, rows in out:
        rows.sort(key=_by_device_time)
    return out


def _by_device_time(r: KernelAgg) -> tuple[int, str, str]:
    return -r.total_ns, r.kind, r.name


def _ints(cols: Columns, name: str, null: int) -> np.ndarray:
    """Integer column *name* of *cols*, *null* where NULL (int64)."""
    if name in cols.objects:  # not all integers as stored: as build_context's rows give them
        return np.array([null if v is None else int(v) for v in cols.objects[name]], np.int64)
    got = cols.ints[name]
    nulls = cols.nulls.get(name)
    return got if nulls is None or not null else np.where(nulls, null, got)


def _optimizers(cols: Columns, run_id: int | None) -> list[Any]:
    """Each step's ``optimizers`` (a list; None where NULL, [] where not a
    JSON list: counted as *run_id*'s)."""
    return unreadable.json_cells(
        cols.column("optimizers"),
        "steps.optimizers",
        run_id,
        lambda i: cols.column("step")[i],
        shape=list,
        empty=list,
    )


def step_fields(cols: Columns, run_id: int | None = None) -> dict[str, Any]:
    """A run's steps as columns (:func:`gpuprofd.storage.reads.steprows.columns`)
    in the fields of ``gpuprof.insights.stepcols.StepColumns``, the columnar
    steps :func:`gpuprof.insights.build_context` takes: the figures
    :func:`step_from_row` gives each step, one int64 or bool array (one entry
    per step) each: ``t0``, ``t1``, ``wait`` (ns; 0 where NULL), ``explicit``,
    ``micro`` (1 where NULL), ``step``, ``numbered``, ``traced``,
    ``skipped``, ``eval`` (ns), ``mem_reserved``, ``mem_peak`` (bytes; 0
    where the step has no allocator figures), ``has_mem``, ``phases`` /
    ``has_phase`` (phase name -> ns / listed), ``optimizers`` (the non-empty
    lists, in step order; *run_id* names the run of one that is not JSON)."""
    n = cols.n
    if cols.phase_dicts is not None:  # not flat integer objects: only the numbers count
        flat = [
            {k: int(v) for k, v in (d or {}).items() if type(v) in (int, float)}
            for d in cols.phase_dicts
        ]
        phases: dict[str, np.ndarray] = {}
        has_phase: dict[str, np.ndarray] = {}
        for i, d in enumerate(flat):
            for k, v in d.items():
                if k not in phases:
                    phases[k], has_phase[k] = np.zeros(n, np.int64), np.zeros(n, bool)
                phases[k][i], has_phase[k][i] = v, True
    else:
        phases, has_phase = cols.phases, cols.has_phase
    opts = _optimizers(cols, run_id)
    mem = "mem_allocated_bytes"
    if mem in cols.ints:  # integers: the NULL mask says which steps have figures
        nulls = cols.nulls.get(mem)
        has_mem = np.ones(n, bool) if nulls is None else ~nulls
    else:
        has_mem = np.array([v is not None for v in cols.column(mem)], bool)
    return {
        "t0": _ints(cols, "t0_ns", 0),
        "t1": _ints(cols, "t1_ns", 0),
        "wait": _ints(cols, "wait_ns", 0),
        "explicit": _ints(cols, "explicit", 0) != 0,
        "micro": _ints(cols, "micro", 1),
        "step": _ints(cols, "step", 0),
        "numbered": "step" in cols.ints and "step" not in cols.nulls,
        "traced": _ints(cols, "traced", 0) != 0,
        "skipped": _ints(cols, "skipped", 0) != 0,
        "eval": _ints(cols, "eval_ns", 0),
        "mem_reserved": np.where(has_mem, _ints(cols, "mem_reserved_bytes", 0), 0),
        "mem_peak": np.where(has_mem, _ints(cols, "mem_peak_bytes", 0), 0),
        "has_mem": has_mem,
        "phases": phases,
        "has_phase": has_phase,
        "optimizers": tuple(o for o in opts if o),
    }


def steps_from_columns(cols: Columns, run_id: int | None = None) -> list[dict[str, Any]]:
    """Steps as columns (:func:`gpuprofd.storage.reads.steprows.columns`) as
    :func:`step_from_row` gives each, in their order: a dict per step built
    from the columns (no row tuples on the way); *run_id* names the run of
    an ``optimizers`` that is not JSON."""
    names = ("step", "t0_ns", "t1_ns", "wait_ns", "explicit", "micro", "skipped", "eval_ns")
    step, t0, t1, wait, explicit, micro, skipped, eval_ns = (cols.column(c) for c in names)
    phases = cols.phase_list()
    out = [
        {
            "step": i,
            "t0": a,
            "t1": b,
            "wait": w,
            "explicit": bool(e),
            "micro": m,
            "phases": p or {},
            "skipped": bool(s),
            "eval": v or 0,
            "optimizers": [],
        }
        for i, a, b, w, e, m, p, s, v in zip(
            step, t0, t1, wait, explicit, micro, phases, skipped, eval_ns, strict=True
        )
    ]
    for j, o in enumerate(_optimizers(cols, run_id)):
        if o:
            out[j]["optimizers"] = o
    alloc = cols.column("mem_allocated_bytes")
    resv, peak = cols.column("mem_reserved_bytes"), cols.column("mem_peak_bytes")
    for j, a in enumerate(alloc):
        if a is not None:
            out[j]["mem"] = [a, resv[j], peak[j]]
    for j, t in enumerate(cols.column("traced")):
        if t:
            out[j]["traced"] = True
    return out


def step_from_row(r: Sequence[Any], run_id: int | None = None) -> dict[str, Any]:
    """A :mod:`~gpuprofd.storage.reads.steprows` row (``phases`` a dict or its
    JSON text) as :func:`gpuprof.insights.build_context` reads it (``mem`` only where the
    step carried torch's allocator figures; ``traced`` only where a profiler
    snapshot ran in it; a ``phases`` or ``optimizers`` that is not JSON
    empty, counted as *run_id*'s).

    Unpacked by position: a day of 500 ms steps is 172,800 rows, and lookups
    by column name cost more than the rest of the conversion."""
    i, t0, t1, wait, explicit, micro, phases, skipped, eval_ns, opts, alloc, resv, peak, traced = r
    if phases is not None and type(phases) is not dict:
        phases = unreadable.json_cell(phases, "steps.phases", run_id, i, empty=unreadable.null)
    step = {
        "step": i,
        "t0": t0,
        "t1": t1,
        "wait": wait,
        "explicit": bool(explicit),
        "micro": micro,
        "phases": phases or {},
        "skipped": bool(skipped),
        "eval": eval_ns or 0,
        "optimizers": unreadable.json_cell(
            opts, "steps.optimizers", run_id, i, shape=list, empty=list
        ),
    }
    if alloc is not None:
        step["mem"] = [alloc, resv, peak]
    if traced:
        step["traced"] = True
    return step


def steps_span(steps: Sequence[Mapping[str, Any]] | StepColumns) -> tuple[int, int] | None:
    """(first step's t0, last step's t1) in ns, or None with no steps: the
    window whose GPU samples the GPU rules read. *steps*: dicts or columns."""
    if not len(steps):
        return None
    if isinstance(steps, StepColumns):
        return int(steps.t0.min()), int(steps.t1.max())
    return min(s["t0"] for s in steps), max(s["t1"] for s in steps)


def gpu_window(
    cuda_uuid: str | None,
    steps: Sequence[Mapping[str, Any]] | StepColumns,
    boot_id: str | None = None,
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
    """A ``runs`` row as a dict with ``options`` and ``tags`` parsed ({} when
    not a JSON object: counted, :mod:`gpuprofd.storage.unreadable`)."""
    run = dict(r)
    run_id = run.get("id")
    run["options"] = unreadable.json_cell(run.get("options"), "runs.options", run_id)
    run["tags"] = run_tags(run.get("tags"), run_id)
    return run


def insight_from_row(
    r: Mapping[str, Any], run_id: int | None = None, which: Any = None, table: str = "insights"
) -> dict[str, Any]:
    """An ``insights`` (or ``group_insights``: *table*) row as
    ``Insight.to_dict()`` returns it; an ``evidence`` that is not a JSON
    object {} (counted as *run_id*'s, the *which*-th)."""
    d = {k: r[k] for k in ("rule", "severity", "title", "detail", "fix")}
    d["evidence"] = unreadable.json_cell(r["evidence"], f"{table}.evidence", run_id, which)
    return from_stored(d)  # its gain, stored in the evidence, back at the top level


def run_tags(text: str | None, run_id: int | None = None) -> dict[str, str]:
    """``runs.tags`` (JSON text, or NULL) as a dict; {} when absent or not an
    object (counted as *run_id*'s); its keys and values as strings (a
    forwarded value is stored as sent)."""
    got = unreadable.json_cell(text, "runs.tags", run_id)
    return {str(k): str(v) for k, v in got.items()}
