"""The read path: every read of a gpuprof database, one function per read,
each ``async def f(db: Reader, ...)`` over a
:class:`gpuprofd.storage.reader.Reader` (the daemon's store, a read-only file
for ``gpuprofctl``, a Postgres pool), so the rules, ``gpuprofctl``, the API
and the daemon read the same way on SQLite and Postgres. The SQL is in the
subset both engines run (:mod:`gpuprofd.storage.dialect`); what differs goes
through ``db.dialect``.

This package's names are its face; callers import them from here:

- which runs there are, and the runs list with step aggregates (``runs``);
- one run's rows and the :class:`RunContext` built from them (``context``);
- a group's ranks, context, findings and status (``groups``);
- the modules :mod:`~gpuprofd.storage.reads.queries` (SQL and row
  converters), :mod:`~gpuprofd.storage.reads.series` (chart series, reduced
  by the database) and :mod:`~gpuprofd.storage.reads.steptotals` (a run's
  step aggregates and their ``step_totals`` tier);
- :func:`open_ro`: a database file opened read-only, checked to be ours
  (:mod:`gpuprofd.storage.sqlite`).
"""

from __future__ import annotations

from gpuprofd.storage.reads import queries, series, steptotals
from gpuprofd.storage.reads.context import (
    comm_buckets,
    comm_totals,
    count_steps,
    evidence_windows,
    gpu_stats,
    history_iterations,
    history_runs,
    host_columns,
    job_cpu,
    kernel_windows,
    last_step_end,
    max_step,
    run_context,
    run_cpu_columns,
    run_steps,
    stack_samples,
    stored_insights,
    worker_cpu,
)
from gpuprofd.storage.reads.groups import (
    GROUP_BUCKET_STEPS,
    GROUP_STEPS_MAX,
    GROUP_STEPS_READ,
    GROUPS_LISTED,
    NEVER_REPORTED_WHY,
    RANK_STATUSES,
    ended_ranks,
    group_context,
    group_findings,
    group_insights_now,
    group_status,
    group_tail,
    latest_rank_runs,
    missing_ranks,
    plain_insight,
    runs_note,
    stored_group_insights,
    unknown_group_message,
)
from gpuprofd.storage.reads.runs import (
    add_step_aggregates,
    find_run,
    find_run_named,
    get_run,
    group_runs,
    insights_computed_ns,
    latest_run_named,
    overview_sql,
    run_ids,
    run_nodes,
    run_overview,
    runs_overview,
    runs_rows,
    runs_with_status,
    step_aggregates,
    stored_seq,
    worst_iteration_ns,
)
from gpuprofd.storage.sqlite import MISSING_HINT, open_ro

__all__ = [
    "GROUPS_LISTED",
    "GROUP_BUCKET_STEPS",
    "GROUP_STEPS_MAX",
    "GROUP_STEPS_READ",
    "MISSING_HINT",
    "NEVER_REPORTED_WHY",
    "RANK_STATUSES",
    "add_step_aggregates",
    "comm_buckets",
    "comm_totals",
    "count_steps",
    "ended_ranks",
    "find_run",
    "stored_seq",
    "get_run",
    "find_run_named",
    "latest_run_named",
    "gpu_stats",
    "group_context",
    "group_findings",
    "group_insights_now",
    "group_runs",
    "group_status",
    "group_tail",
    "history_iterations",
    "history_runs",
    "host_columns",
    "insights_computed_ns",
    "job_cpu",
    "kernel_windows",
    "evidence_windows",
    "last_step_end",
    "latest_rank_runs",
    "max_step",
    "missing_ranks",
    "open_ro",
    "overview_sql",
    "plain_insight",
    "queries",
    "run_context",
    "run_cpu_columns",
    "run_ids",
    "run_nodes",
    "run_overview",
    "run_steps",
    "runs_note",
    "runs_overview",
    "runs_rows",
    "runs_with_status",
    "series",
    "step_aggregates",
    "steptotals",
    "stored_group_insights",
    "stack_samples",
    "stored_insights",
    "unknown_group_message",
    "worker_cpu",
    "worst_iteration_ns",
]
