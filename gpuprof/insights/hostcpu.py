"""Host CPU aligned to steps: who used the cores while each iteration ran.

The host sampler reads, every 0.5 s and at one ``mono_ns``, the host's CPU
use (all cores) and the CPU of each live run's process tree (the training
process and its DataLoader workers). A sample covers the interval since
the previous one. Each iteration (its loader wait, then its step) is given
the time-weighted mean of the samples its interval overlaps: the run's own
cores and the cores other processes used meanwhile. An iteration shorter
than the sample interval gets the figures of the interval around it.

Pure: no I/O (numpy, imported on first use, does the per-step sums). The
rules read the result from :class:`RunContext`.
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


class _Integrals(NamedTuple):
    """Running integrals of the spans, for any instant in O(log n)."""

    t0: Any  # numpy int64 arrays, one entry per span: its start and end (ns)
    t1: Any
    host: Any  # numpy float64: host cores per span; own: 0 where not sampled
    own: Any
    own_on: Any  # 1 where the run's own cores were sampled
    before_w: Any  # per span: covered ns, host core-ns, own ns and own core-ns
    before_h: Any  # in the spans before it (prefix sums)
    before_ow: Any
    before_o: Any


def _integrals(spans: Sequence[CpuInterval]) -> _Integrals:
    import numpy as np  # lazily: the training process imports gpuprof too

    n = len(spans)
    t0 = np.fromiter((s.t0_ns for s in spans), np.int64, n)
    t1 = np.fromiter((s.t1_ns for s in spans), np.int64, n)
    host = np.fromiter((s.host_cores for s in spans), np.float64, n)
    own_on = np.fromiter((s.own_cores is not None for s in spans), np.int64, n)
    own = np.fromiter((s.own_cores or 0.0 for s in spans), np.float64, n)
    length = np.maximum(t1 - t0, 0)

    def before(x: Any) -> Any:
        out = np.zeros(n, dtype=x.dtype)
        np.cumsum(x[:-1], out=out[1:])
        return out

    return _Integrals(
        t0,
        t1,
        host,
        own,
        own_on,
        before(length),
        before(host * length),
        before(length * own_on),
        before(own * length),
    )


def _weighted_all(
    spans: Sequence[CpuInterval], windows: Sequence[tuple[int, int]]
) -> tuple[list[float | None], list[float | None]]:
    """Per window ``(t0, t1)``: (host cores, own cores) time-weighted over the
    part of it the spans cover (None where none does; an instant, ``t1 <=
    t0``, takes the interval around it). Vectorised: a day's 172,800 steps
    cost two binary searches each, not a walk. Each window's sum is its first
    span's part, the whole spans between (a difference of prefix sums) and its
    last span's part, so a short window inside one span reads that span's
    figure exactly."""
    import numpy as np

    ig = _integrals(spans)
    n = len(ig.t0)
    a = np.fromiter((w[0] for w in windows), np.int64, len(windows))
    b = np.fromiter((w[1] for w in windows), np.int64, len(windows))
    b = np.maximum(b, a + 1)
    # the first span that ends after each end: the one holding it, or the next
    ka = np.searchsorted(ig.t1, a, side="right")
    kb = np.searchsorted(ig.t1, b, side="right")
    ia, ib = np.minimum(ka, n - 1), np.minimum(kb, n - 1)
    # ns of span ka in the window (to its end, or to b when kb == ka)
    end_a = np.where(kb == ka, np.minimum(b, ig.t1[ia]), ig.t1[ia])
    part_a = np.where(ka < n, np.clip(end_a - np.maximum(a, ig.t0[ia]), 0, None), 0)
    # ns of span kb in the window (kb > ka only)
    part_b = np.where((kb > ka) & (kb < n), np.clip(b - ig.t0[ib], 0, None), 0)
    # whole spans ka + 1 .. kb - 1
    lo = np.minimum(ka + 1, n)
    hi = np.maximum(kb, lo)

    def between(prefix: Any, last: Any) -> Any:
        total = np.append(prefix, prefix[-1] + last)  # prefix sums, n + 1 entries
        return total[hi] - total[lo]

    length = max(int(ig.t1[-1] - ig.t0[-1]), 0)
    w_all = part_a + part_b + between(ig.before_w, length)
    h_sum = ig.host[ia] * part_a + ig.host[ib] * part_b + between(ig.before_h, ig.host[-1] * length)
    w_own = (
        part_a * ig.own_on[ia]
        + part_b * ig.own_on[ib]
        + between(ig.before_ow, length * int(ig.own_on[-1]))
    )
    o_sum = ig.own[ia] * part_a + ig.own[ib] * part_b + between(ig.before_o, ig.own[-1] * length)
    with np.errstate(divide="ignore", invalid="ignore"):
        host = np.where(w_all > 0, h_sum / np.maximum(w_all, 1), np.nan)
        own = np.where(w_own > 0, o_sum / np.maximum(w_own, 1), np.nan)
    return _nan_none(host.tolist()), _nan_none(own.tolist())


def _nan_none(values: list[float]) -> list[float | None]:
    return [None if v != v else v for v in values]


def weighted(
    spans: Sequence[CpuInterval], windows: Sequence[tuple[int, int]]
) -> tuple[list[float | None], list[float | None]]:
    """Per window ``(start_ns, end_ns)``: the host's busy cores and the run's
    own cores, time-weighted over the part of the window *spans*
    (:func:`intervals`) cover; None where none does (own: where none with the
    run's figure does). Empty lists without spans."""
    if not spans or not windows:
        return [], []
    return _weighted_all(spans, windows)


def step_figures(
    host: Sequence[float | None],
    own: Sequence[float | None],
    cpu_count: int | None,
    sibling_cores: float = 0.0,
) -> StepCpu:
    """:class:`StepCpu` from each iteration's (host cores, own cores)
    (:func:`weighted`); see :func:`step_cpu`."""
    count_here = cpu_count or None
    host_pct = tuple(
        None if h is None or not count_here else min(100.0, 100.0 * h / count_here) for h in host
    )
    others = tuple(
        None if h is None or m is None else max(0.0, h - m - sibling_cores)
        for h, m in zip(host, own, strict=True)
    )
    return StepCpu(host_pct, tuple(own), others)


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
    return step_figures(*weighted(spans, windows), cpu_count, sibling_cores)


def span_means(spans: Sequence[CpuInterval], t0: int, t1: int) -> tuple[float | None, float | None]:
    """(host cores, own cores) time-weighted over ``[t0, t1]`` (the run's steps)."""
    if not spans:
        return None, None
    (host,), (own,) = _weighted_all(spans, [(t0, t1)])
    return host, own
