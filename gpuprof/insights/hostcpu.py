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

import math
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

from gpuprof.insights import arraystats


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


#: The host sample fields the context reads per sample, in :class:`HostColumns` order.
HOST_FIELDS = ("mono_ns", "cpu_pct", "cpu_count", "disk_read_bps")
#: The readings it needs only the mean of over the run (``page_cache_fraction``:
#: ``page_cache_bytes`` / ``mem_total_bytes`` per sample that has both).
HOST_MEANS = ("disk_read_iops", "page_cache_fraction", "swap_in_bps")


class HostColumns(NamedTuple):
    """Host samples as numpy columns, one entry per sample in time order:
    ``mono_ns`` (int64 ns; 0 where ``timed`` is False: the row had none),
    then each reading of :data:`HOST_FIELDS` as float64, NaN where the
    sample did not have it (``cpu_count`` too: a count, NaN or 0 unknown);
    ``means``: each of :data:`HOST_MEANS` over the samples that had it (None:
    none had)."""

    mono_ns: Any
    timed: Any
    cpu_pct: Any
    cpu_count: Any
    disk_read_bps: Any
    means: Mapping[str, float | None]

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.mono_ns)


class CpuColumns(NamedTuple):
    """The run's process-tree CPU samples as numpy columns: ``mono_ns``
    (int64; 0 where ``timed`` is False), ``cores`` (float64, NaN: None)."""

    mono_ns: Any
    timed: Any
    cores: Any

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.mono_ns)


def _times(values: Sequence[Any], column: int | None = None) -> tuple[Any, Any]:
    """(int64 ns, bool: had a time) of *values* (ints; None: no time), or
    of each row's *column* where *values* are rows."""
    import numpy as np

    if column is not None:
        try:  # a database read: every row has its time (no list made on the way)
            ns = np.fromiter(map(itemgetter(column), values), np.int64, len(values))
            return ns, np.ones(len(values), bool)
        except TypeError:  # a row without a time
            values = [r[column] for r in values]
    try:  # a database read: every row has its time
        return np.array(values, dtype=np.int64).reshape(len(values)), np.ones(len(values), bool)
    except TypeError:
        timed = np.fromiter((v is not None for v in values), bool, len(values))
        ns = np.fromiter((0 if v is None else v for v in values), np.int64, len(values))
        return ns, timed


def host_columns(host: Sequence[Mapping[str, Any]] | HostColumns) -> HostColumns:
    """*host* (sample rows with :data:`HOST_FIELDS` and ``disk_read_iops``,
    ``page_cache_bytes``, ``mem_total_bytes``, ``swap_in_bps``; a missing key
    reads None) as :class:`HostColumns`; columns are returned as given."""
    if isinstance(host, HostColumns):
        return host

    def mean_of(values: list[Any]) -> float | None:
        return math.fsum(values) / len(values) if values else None

    means = {
        "disk_read_iops": mean_of([v for h in host if (v := h.get("disk_read_iops")) is not None]),
        "page_cache_fraction": mean_of(
            [
                h["page_cache_bytes"] / h["mem_total_bytes"]
                for h in host
                if h.get("page_cache_bytes") is not None and h.get("mem_total_bytes")
            ]
        ),
        "swap_in_bps": mean_of([v for h in host if (v := h.get("swap_in_bps")) is not None]),
    }
    return host_columns_from_tuples([tuple(h.get(f) for f in HOST_FIELDS) for h in host], means)


def host_columns_from_tuples(
    rows: Sequence[Sequence[Any]], means: Mapping[str, float | None]
) -> HostColumns:
    """Rows of :data:`HOST_FIELDS` values (in that order; None: unknown), as
    a database read returns them, and the :data:`HOST_MEANS` over the same
    samples, as :class:`HostColumns`."""
    import numpy as np

    flat = [tuple(r) for r in rows]
    ns, timed = _times(flat, 0)
    # mono_ns is taken from its own int64 column (float64 rounds past 2**53)
    values = np.array(flat, dtype=np.float64).reshape(len(flat), len(HOST_FIELDS))
    got = {name: means.get(name) for name in HOST_MEANS}
    return HostColumns(ns, timed, *values[:, 1:].T.copy(), means=got)


def cpu_columns(run_cpu: Sequence[Mapping[str, Any]] | CpuColumns) -> CpuColumns:
    """*run_cpu* rows (``mono_ns``, ``cores``) as :class:`CpuColumns`."""
    if isinstance(run_cpu, CpuColumns):
        return run_cpu
    return cpu_columns_from_tuples([(r.get("mono_ns"), r.get("cores")) for r in run_cpu])


def cpu_columns_from_tuples(rows: Sequence[Sequence[Any]]) -> CpuColumns:
    """``(mono_ns, cores)`` rows as :class:`CpuColumns`."""
    import numpy as np

    ns, timed = _times(rows, 0)
    try:  # every row has its cores as a number (a database read, NULLs left out)
        cores = np.fromiter(map(itemgetter(1), rows), np.float64, len(rows))
    except TypeError:  # None among them: NaN, as numpy's array() makes it
        cores = np.array([r[1] for r in rows], dtype=np.float64).reshape(len(rows))
    return CpuColumns(ns, timed, cores)


class Spans(NamedTuple):
    """Host samples as intervals ``(t0_ns, t1_ns]``, numpy columns (see
    :class:`CpuInterval`; ``own`` NaN where the run was not sampled)."""

    t0: Any
    t1: Any
    host: Any
    own: Any

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.t0)


def spans(
    host: Sequence[Mapping[str, Any]] | HostColumns,
    run_cpu: Sequence[Mapping[str, Any]] | CpuColumns,
) -> Spans | None:
    """:func:`intervals` as columns; None without a usable host sample."""
    import numpy as np

    h, c = host_columns(host), cpu_columns(run_cpu)
    keep = h.timed & (np.nan_to_num(h.cpu_count) != 0)
    t1 = h.mono_ns[keep]
    if not len(t1):
        return None
    gaps = np.diff(t1)
    first_len = int(arraystats.median(gaps)) if len(gaps) else 500_000_000
    t0 = np.empty_like(t1)
    t0[0] = t1[0] - first_len
    t0[1:] = t1[:-1]
    busy = h.cpu_pct[keep] / 100.0 * np.trunc(h.cpu_count[keep])
    # the run's cores sampled at the same mono_ns (the last row of a time seen twice)
    times = c.mono_ns[c.timed]
    order = np.argsort(times, kind="stable")
    times, cores = times[order], c.cores[c.timed][order]
    own = np.full(len(t1), np.nan)
    if len(times):
        at = np.searchsorted(times, t1, side="right") - 1
        hit = (at >= 0) & (times[np.maximum(at, 0)] == t1)
        own[hit] = cores[at[hit]]
    return Spans(t0, t1, busy, own)


def intervals(
    host: Sequence[Mapping[str, Any]], run_cpu: Sequence[Mapping[str, Any]]
) -> list[CpuInterval]:
    """The host samples (time order, each with ``mono_ns``, ``cpu_pct``,
    ``cpu_count``) as intervals, each with the run's ``cores`` sampled at the
    same ``mono_ns`` (*run_cpu* rows with ``mono_ns`` and ``cores``). The
    first sample's interval is as long as the median interval (0.5 s
    default). Rows without ``mono_ns`` or ``cpu_count`` are skipped."""
    got = spans(host, run_cpu)
    if got is None:
        return []
    return [
        CpuInterval(a, b, h, None if o != o else o)
        for a, b, h, o in zip(
            got.t0.tolist(), got.t1.tolist(), got.host.tolist(), got.own.tolist(), strict=True
        )
    ]


def _as_spans(spans_: Sequence[CpuInterval] | Spans) -> Spans:
    import numpy as np

    if isinstance(spans_, Spans):
        return spans_
    n = len(spans_)
    return Spans(
        np.fromiter((s.t0_ns for s in spans_), np.int64, n),
        np.fromiter((s.t1_ns for s in spans_), np.int64, n),
        np.fromiter((s.host_cores for s in spans_), np.float64, n),
        np.fromiter((np.nan if o is None else o for *_, o in spans_), np.float64, n),
    )


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


def _integrals(sp: Spans) -> _Integrals:
    import numpy as np  # lazily: the training process imports gpuprof too

    n = len(sp)
    t0, t1, host = sp.t0, sp.t1, sp.host
    own_on = (~np.isnan(sp.own)).astype(np.int64)
    own = np.nan_to_num(sp.own)
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


def weighted_columns(spans_: Sequence[CpuInterval] | Spans, windows: Any) -> tuple[Any, Any]:
    """Per window ``(t0, t1)`` (a sequence of pairs, or an ``(n, 2)`` int64
    array): (host cores, own cores) as float64 arrays, time-weighted over the
    part of it the spans cover (NaN where none does; an instant, ``t1 <=
    t0``, takes the interval around it). Vectorised: a day's 172,800 steps
    cost two binary searches each, not a walk. Each window's sum is its first
    span's part, the whole spans between (a difference of prefix sums) and its
    last span's part, so a short window inside one span reads that span's
    figure exactly."""
    import numpy as np

    ig = _integrals(_as_spans(spans_))
    n = len(ig.t0)
    pairs = np.asarray(windows, dtype=np.int64).reshape(-1, 2)
    a = pairs[:, 0]
    b = np.maximum(pairs[:, 1], a + 1)
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
    return host, own


def _nan_none(values: Any) -> tuple[float | None, ...]:
    """A float64 array as a tuple, NaN as None."""
    import numpy as np

    nan = np.isnan(values)
    if not nan.any():
        return tuple(values.tolist())
    out = values.astype(object)
    out[nan] = None
    return tuple(out.tolist())


def weighted(
    spans: Sequence[CpuInterval] | Spans, windows: Sequence[tuple[int, int]]
) -> tuple[list[float | None], list[float | None]]:
    """Per window ``(start_ns, end_ns)``: the host's busy cores and the run's
    own cores, time-weighted over the part of the window *spans*
    (:func:`intervals` or :func:`spans`) cover; None where none does (own:
    where none with the run's figure does). Empty lists without spans."""
    if not len(spans) or not len(windows):
        return [], []
    host, own = weighted_columns(spans, windows)
    return list(_nan_none(host)), list(_nan_none(own))


def step_figures(
    host: Sequence[float | None] | Any,
    own: Sequence[float | None] | Any,
    cpu_count: int | None,
    sibling_cores: float = 0.0,
) -> StepCpu:
    """:class:`StepCpu` from each iteration's (host cores, own cores)
    (:func:`weighted`'s lists, or float64 arrays with NaN for None); see
    :func:`step_cpu`."""
    import numpy as np

    h = np.array(host, dtype=np.float64).reshape(-1)
    m = np.array(own, dtype=np.float64).reshape(-1)
    if cpu_count:
        host_pct = _nan_none(np.minimum(100.0, 100.0 * h / cpu_count))
    else:
        host_pct = (None,) * len(h)
    others = _nan_none(np.maximum(0.0, h - m - sibling_cores))
    return StepCpu(host_pct, _nan_none(m), others)


def step_cpu(
    windows: Sequence[tuple[int, int]],
    spans: Sequence[CpuInterval] | Spans,
    cpu_count: int | None,
    sibling_cores: float = 0.0,
) -> StepCpu:
    """Align *spans* (:func:`intervals`) to *windows*: each iteration's
    ``(start_ns, end_ns)`` — its loader wait's start to its step's end — in
    time order. *sibling_cores*: the mean cores of the job's other ranks on
    this host (a torchrun job's ranks are not "other processes" to each
    other), taken out of the others' figure. Empty tuples without spans."""
    if not len(spans) or not len(windows):
        return StepCpu((), (), ())
    return step_figures(*weighted_columns(spans, windows), cpu_count, sibling_cores)


def span_means(
    spans: Sequence[CpuInterval] | Spans, t0: int, t1: int
) -> tuple[float | None, float | None]:
    """(host cores, own cores) time-weighted over ``[t0, t1]`` (the run's steps)."""
    if not len(spans):
        return None, None
    host, own = weighted_columns(spans, [(t0, t1)])
    return _nan_none(host)[0], _nan_none(own)[0]
