"""Where a run's GPU-hours went: the row the team's rollups sum.

One row per ended run, from its run row and its stored summary:

* ``gpu_hours``: wall time (start to end) × the run's GPUs;
* ``usd``: that at the cost line's rate (the ``estimated_cost`` finding's
  ``usd_per_hour``: ``GPUPROF_GPU_RATE`` or the price table); None unpriced;
* ``lost_gpu_hours``: the run time fixing every finding would save, ×
  GPUs: the summary's fix-all figure (:func:`gpuprof.insights.gains.fix_all`,
  each part of the iteration taken once), never more than ``gpu_hours``;
* ``by_rule``: that lost time split over the findings that claim it, in
  proportion to each one's ``gain_run_s``, scaled down so the findings of
  one run sum to its ``lost_gpu_hours``: two findings describing the same
  lost time (a loader stall and the GPU idle it causes) are not counted twice.

Pure: no I/O; the storage writes it (``run_costs``) and SQL sums it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuprof.insights.gains import fix_all

#: Wall ns per hour.
NS_PER_HOUR = 3600 * 10**9


@dataclass(frozen=True)
class RunCost:
    """A run's GPU-hours and their loss (hours are GPU-hours, dollars USD)."""

    gpu_hours: float
    usd: float | None
    lost_gpu_hours: float
    lost_usd: float | None
    #: rule -> lost GPU-hours; sums to ``lost_gpu_hours`` (within rounding)
    by_rule: dict[str, float] = field(default_factory=dict)
    #: rule -> what its finding says to do (its ``fix``), where it said
    fixes: dict[str, str] = field(default_factory=dict)


def _rate(summary: Mapping[str, Any]) -> float | None:
    """USD per GPU-hour of the cost line, or None when it priced nothing."""
    for ins in summary.get("insights") or []:
        if ins.get("rule") == "estimated_cost":
            rate = (ins.get("evidence") or {}).get("usd_per_hour")
            return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
    return None


def run_cost(run: Mapping[str, Any], summary: Mapping[str, Any] | None) -> RunCost | None:
    """The :class:`RunCost` of an ended *run* (a ``runs`` row: ``start_wall_ns``,
    ``end_wall_ns``, ``gpu_count``) with its *summary* (the stored summary
    dict: ``insights`` with their gains, ``gains``); None for a run without
    both times (still running, or never started)."""
    start, end = run.get("start_wall_ns"), run.get("end_wall_ns")
    if start is None or end is None:
        return None
    gpus = max(int(run.get("gpu_count") or 0), 0)
    gpu_hours = max(end - start, 0) / NS_PER_HOUR * gpus
    summary = summary or {}
    rate = _rate(summary)
    findings = [i for i in summary.get("insights") or [] if i.get("gain_run_s")]
    block = summary.get("gains") or {}
    lost_s = block.get("fix_all_run_s")
    if lost_s is None:
        lost_s = (fix_all(findings) or {}).get("fix_all_run_s") or 0.0
    lost = min(float(lost_s) * gpus / 3600.0, gpu_hours)
    claimed: dict[str, float] = {}
    fixes: dict[str, str] = {}
    for ins in findings:
        rule = str(ins.get("rule"))
        if ins.get("fix"):
            fixes[rule] = str(ins["fix"])
        claimed[rule] = claimed.get(rule, 0.0) + float(ins["gain_run_s"]) * gpus / 3600.0
    total = sum(claimed.values())
    # findings sharing lost time: each keeps its proportion of the run's one budget
    scale = lost / total if total > lost and total > 0 else 1.0
    by_rule = {r: h * scale for r, h in claimed.items() if h > 0}
    lost = min(lost, sum(by_rule.values())) if by_rule else 0.0
    return RunCost(
        gpu_hours=gpu_hours,
        usd=None if rate is None else gpu_hours * rate,
        lost_gpu_hours=lost,
        lost_usd=None if rate is None else lost * rate,
        by_rule=by_rule,
        fixes={r: f for r, f in fixes.items() if r in by_rule},
    )
