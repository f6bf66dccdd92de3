"""Host CPU aligned to steps: who used the cores while each iteration ran.

The host sampler reads, every 0.5 s and at one ``mono_ns``, the host's CPU
use (all cores) and the CPU of each live run's process tree (the training
process and its DataLoader workers). A sample covers the interval since
the previous one. Each iteration (its loader wait, then its step) is given
the time-weighted mean of the samples its interval overlaps: the run's own
cores and the cores other processes used meanwhile. An iteration shorter
than the sample interval gets the figures of the interval around it.

Pure: no I/O. The rules read the result from :class:`RunContext`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gpuprof.stats import median


class CpuInterval(NamedTuple):
    """One host sample as an interval ``(t0_ns, t1_ns]`` of monotonic time."""

    t0_ns: int
    t1_ns: int
    host_cores: float
    """Cores busy on the whole host (``cpu_pct`` / 100 × ``cpu_count``)."""
    own_cores: float | None
    """Cores the run's process tree used (None: not sampled at this time)."""


class StepCpu(NamedTuple):
    """Per-iteration CPU figures, one entry per step (None: no sample overlaps)."""

    host_pct: tuple[float | None, ...]
    """Host CPU use while the iteration ran, % of all cores (0-100)."""
    own_cores: tuple[float | None, ...]
    """The run's own process tree's cores while it ran."""
    other_cores: tuple[float | None, ...]
    """Cores other processes used while it ran: host busy − own − *siblings*."""


def intervals(
    host: Sequence[Mapping[str, Any]], run_cpu: Sequence[Mapping[str, Any]]
) -> list[CpuInterval]:
    """The host samples (time order, each with ``mono_ns``, ``cpu_pct``,
    ``cpu_count``) as intervals, each with the run's ``cores`` sampled at the
    same ``mono_ns`` (*run_cpu* rows with ``mono_ns`` and ``cores``). The
    first sample's interval is as long as the median interval (0.5 s
    default). Rows without ``mono_ns`` or ``cpu_count`` are skipped."""
    own = {r["mono_ns"]: r["cores"] for r in run_cpu if r.get("mono_ns") is not None}
    rows = [h for h in host if h.get("mono_ns") is not None and h.get("cpu_count")]
    if not rows:
        return []
    gaps = [b["mono_ns"] - a["mono_ns"] for a, b in zip(rows, rows[1:], strict=False)]
    first_len = int(median(gaps)) if gaps else 500_000_000
    out = []
    prev = rows[0]["mono_ns"] - first_len
    for h in rows:
        t1 = h["mono_ns"]
        busy = float(h["cpu_pct"]) / 100.0 * int(h["cpu_count"])
        out.append(CpuInterval(prev, t1, busy, own.get(t1)))
        prev = t1
    return out


def _weighted(
    spans: Sequence[CpuInterval], t0: int, t1: int, start: int
) -> tuple[float | None, float | None, int]:
    """(host cores, own cores) time-weighted over the part of ``[t0, t1]``
    the intervals from index *start* cover; and the first index that may
    still overlap a later window (windows come in time order)."""
    i = start
    while i < len(spans) and spans[i].t1_ns <= t0:
        i += 1
    j, host_w, own_w, w_all, w_own = i, 0.0, 0.0, 0, 0
    if t1 <= t0:  # an instant: the interval around it
        t1 = t0 + 1
    while j < len(spans) and spans[j].t0_ns < t1:
        s = spans[j]
        w = min(s.t1_ns, t1) - max(s.t0_ns, t0)
        if w > 0:
            host_w += s.host_cores * w
            w_all += w
            if s.own_cores is not None:
                own_w += s.own_cores * w
                w_own += w
        j += 1
    host = host_w / w_all if w_all else None
    own = own_w / w_own if w_own else None
    return host, own, i


def step_cpu(
    windows: Sequence[tuple[int, int]],
    spans: Sequence[CpuInterval],
    cpu_count: int | None,
    sibling_cores: float = 0.0,
) -> StepCpu:
    """Align *spans* (:func:`intervals`) to *windows*: each iteration's
    ``(start_ns, end_ns)`` — its loader wait's start to its step's end — in
    time order. *sibling_cores*: the mean cores of the job's other ranks on
    this host (a torchrun job's ranks are not "other processes" to each
    other), taken out of the others' figure. Empty tuples without spans."""
    if not spans or not windows:
        return StepCpu((), (), ())
    count = cpu_count or 0
    host_pct: list[float | None] = []
    own: list[float | None] = []
    others: list[float | None] = []
    start = 0
    for t0, t1 in windows:
        host, mine, start = _weighted(spans, t0, t1, start)
        count_here = count or None
        host_pct.append(
            None if host is None or not count_here else min(100.0, 100.0 * host / count_here)
        )
        own.append(mine)
        others.append(
            None if host is None or mine is None else max(0.0, host - mine - sibling_cores)
        )
    return StepCpu(tuple(host_pct), tuple(own), tuple(others))


def span_means(spans: Sequence[CpuInterval], t0: int, t1: int) -> tuple[float | None, float | None]:
    """(host cores, own cores) time-weighted over ``[t0, t1]`` (the run's steps)."""
    host, own, _ = _weighted(spans, t0, t1, 0)
    return host, own
