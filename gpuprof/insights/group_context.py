"""A process group's :class:`~gpuprof.insights.distributed.GroupContext` from
its ranks' stored rows. Pure: no SQLite (``gpuprofd.storage.reads.group_context``
reads the rows and calls :func:`build_group_context`).

What it does with the rows:

* **Common steps.** Every per-step tuple covers the steps every rank has (by
  step index), in step order; steps a profiler snapshot ran in (``traced``)
  are left out: their times are not representative. Warm-up is the rules'
  business (:func:`gpuprof.insights.distributed._steady`).
* **Per-step figures.** ``step_ms`` from ``t1 - t0``; ``backward_ms`` from the
  ``backward`` phase (the shim has already moved the exposed comm out of it);
  ``comm_ms`` from the :data:`gpuprof.comm.COMM_PHASE` phase, only for a rank
  whose run carries comm data (bucket rows or a comm phase).
* **Buckets.** A step's bucket timings are kept only when every timed rank
  has the same bucket set, the set most common over the common steps: DDP
  rebuilds its buckets after the first iteration, so the first step may list
  other buckets (or another count) than the rest. Position ``i`` of a step's
  bucket tuple is the ``i``-th bucket of that set by index (DDP numbers its
  buckets 0..n-1, so position and index agree).
* **One clock.** Ranks on one host share ``CLOCK_MONOTONIC``: nothing to do.
  When the ranks' hosts differ, each rank's bucket times are moved onto the
  reference rank's clock by its measured offset (``t - offset``); a rank
  without its own offset takes that of another rank on its host, or 0 on the
  reference rank's host; a rank with none of these cannot be compared and
  its bucket timings are left out (:func:`clock_shifts` says which).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprof.comm import COMM_PHASE
from gpuprof.insights.distributed import GroupContext, RankStats

_NS_PER_MS = 1e6


@dataclass(frozen=True)
class RankRows:
    """One rank's stored rows (its latest run in the group)."""

    rank: int
    steps: Sequence[Mapping[str, Any]]
    """In time order, each with ``step`` (index), ``t0``/``t1`` (monotonic
    ns), ``phases`` (name -> ns) and optional ``traced`` (bool)."""
    buckets: Sequence[Sequence[int]] = ()
    """Bucket rows ``(step, bucket, start_ns, end_ns, bytes)``."""
    host: str | None = None
    clock_offset_ns: int | None = None
    """This rank's clock minus the reference rank's (``runs.clock_offset_ns``)."""
    clock_reference_rank: int | None = None

    @property
    def has_comm(self) -> bool:
        """Whether the run timed its collectives (bucket rows or a comm phase)."""
        return bool(self.buckets) or any(COMM_PHASE in (s.get("phases") or {}) for s in self.steps)


def _timed_steps(r: RankRows) -> dict[int, Mapping[str, Any]]:
    """Step index -> step, traced steps left out (a repeated index: the last)."""
    return {int(s["step"]): s for s in r.steps if not s.get("traced")}


def common_steps(ranks: Sequence[RankRows]) -> list[int]:
    """The step indices every rank has (traced steps left out), ascending."""
    if not ranks:
        return []
    sets = [set(_timed_steps(r)) for r in ranks]
    return sorted(set.intersection(*sets))


def clock_shifts(ranks: Sequence[RankRows]) -> dict[int, int | None]:
    """Per rank, the ns to subtract from its times to put them on the group's
    clock; None where it cannot be known (see the module doc). All 0 when
    the ranks share one host."""
    hosts = {r.host for r in ranks}
    if len(hosts) <= 1:
        return {r.rank: 0 for r in ranks}
    host_offset: dict[str | None, int] = {}
    for r in ranks:
        if r.clock_offset_ns is not None:
            host_offset.setdefault(r.host, r.clock_offset_ns)
    refs = {r.clock_reference_rank for r in ranks if r.clock_reference_rank is not None} or {0}
    ref_hosts = {r.host for r in ranks if r.rank in refs}
    out: dict[int, int | None] = {}
    for r in ranks:
        if r.clock_offset_ns is not None:
            out[r.rank] = r.clock_offset_ns
        elif r.host in host_offset:
            out[r.rank] = host_offset[r.host]
        elif r.host in ref_hosts:
            out[r.rank] = 0
        else:
            out[r.rank] = None
    return out


def _buckets_by_step(r: RankRows, steps: set[int]) -> dict[int, dict[int, tuple[int, int]]]:
    """step -> bucket -> (start_ns, end_ns) for *steps* (a repeated bucket: the first)."""
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for step, bucket, start, end, _nbytes in r.buckets:
        if step in steps:
            out.setdefault(int(step), {}).setdefault(int(bucket), (int(start), int(end)))
    return out


def build_group_context(group: str, ranks: Sequence[RankRows]) -> GroupContext:
    """The :class:`GroupContext` of *ranks* (one entry per rank), see the
    module doc. Ranks come out sorted by rank."""
    ranks = sorted(ranks, key=lambda r: r.rank)
    common = common_steps(ranks)
    wanted = set(common)
    shifts = clock_shifts(ranks)
    # the ranks whose bucket times can be compared: timed and on a known clock
    timed = [r for r in ranks if r.buckets and shifts[r.rank] is not None]
    by_rank = {r.rank: _buckets_by_step(r, wanted) for r in timed}
    sets = Counter(frozenset(by_rank[r.rank].get(step, {})) for step in common for r in timed)
    sets.pop(frozenset(), None)
    bucket_steps: list[int] = []
    order: list[int] = []
    if len(timed) >= 2 and sets:
        usual = max(sets, key=lambda s: (sets[s], len(s)))
        order = sorted(usual)
        bucket_steps = [
            step
            for step in common
            if all(frozenset(by_rank[r.rank].get(step, {})) == usual for r in timed)
        ]
    out = []
    for r in ranks:
        steps = _timed_steps(r)
        rows = [steps[i] for i in common]
        phases = [s.get("phases") or {} for s in rows]
        step_ms = tuple((s["t1"] - s["t0"]) / _NS_PER_MS for s in rows)
        backward_ms: tuple[float, ...] = ()
        if any("backward" in p for p in phases):
            backward_ms = tuple(p.get("backward", 0) / _NS_PER_MS for p in phases)
        comm_ms: tuple[float, ...] = ()
        if r.has_comm:
            comm_ms = tuple(p.get(COMM_PHASE, 0) / _NS_PER_MS for p in phases)
        starts: tuple[tuple[int, ...], ...] = ()
        ends: tuple[tuple[int, ...], ...] = ()
        if r.rank in by_rank and bucket_steps:
            shift = shifts[r.rank] or 0
            mine = by_rank[r.rank]
            starts = tuple(tuple(mine[s][b][0] - shift for b in order) for s in bucket_steps)
            ends = tuple(tuple(mine[s][b][1] - shift for b in order) for s in bucket_steps)
        out.append(
            RankStats(
                rank=r.rank,
                step_ms=step_ms,
                backward_ms=backward_ms,
                comm_ms=comm_ms,
                bucket_start_ns=starts,
                bucket_end_ns=ends,
            )
        )
    return GroupContext(group=group, ranks=tuple(out))
