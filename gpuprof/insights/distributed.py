"""Group-level rules: one distributed job's ranks compared with each other.

These rules read a process group's per-rank aggregates (:class:`GroupContext`)
rather than one run's :class:`~gpuprof.insights.base.RunContext`, so they are
not in the per-run registry: :func:`group_rules` runs :data:`GROUP_RULES` and
drops what :data:`GROUP_SUPERSEDES` says a more specific finding explains.

The findings (issue 6, "Rules"):

* ``straggler_rank`` -- one rank's backward is slow; the all-reduce makes every
  rank's step equally slow, and the straggler is the rank that waits least in
  the collective. It explains the comm time the other ranks show, so it
  supersedes ``comm_dominant`` (the network is not to blame), and a
  ``bucket_skew`` on the same rank spread over most buckets.
* ``comm_dominant`` -- collectives take > 20 % of step time.
* ``bucket_skew`` -- one rank is the last to start (or finish) the same
  gradient bucket on >= 60 % of steps.
* ``rank_skew`` -- a rank's median step time is >= 10 % above the others'.

All rules are pure functions ``(GroupContext) -> Insight | None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuprof.insights.base import WARMUP_STEPS, Insight
from gpuprof.stats import median, percentile

#: Issue 6: collectives above 20 % of the step are worth a finding. DDP
#: overlaps most of the all-reduce with backward; exposed comm beyond a fifth
#: of the step means the overlap (bucket size, interconnect) is failing.
COMM_FRACTION = 0.20
#: Above this share the step is mostly waiting on the network.
COMM_FRACTION_HIGH = 0.40
#: Issue 6: a rank last on the same bucket on >= 60 % of steps is a pattern,
#: not chance (with 2 ranks chance alone gives 50 %).
BUCKET_LATE_SHARE = 0.60
#: Smallest median lateness (ms) of that rank on that bucket for bucket_skew
#: to fire: below it the delta is within the cross-rank clock alignment error
#: and backward jitter, and costs under a millisecond a step. (A median, not
#: the reported p95: with 2 ranks chance alone makes one last on >= 60 % of
#: 30 steps about one time in five, with a p95 of jitter above 1 ms.)
BUCKET_MIN_DELTA_MS = 1.0
#: ... and at least this share of the group's median step: a rank that is a
#: few % of a step late on a bucket costs the others that much and no more,
#: and CPU scheduling jitter reaches that (measured: 1.5 ms median on 47 ms
#: gloo steps, 2 ranks on a loaded 2-vCPU VM, 2026-11-30).
BUCKET_MIN_DELTA_FRACTION = 0.05
#: A straggler explains a bucket_skew on its own rank unless the named bucket
#: holds at least this share of the rank's lateness summed over its buckets: a
#: slow backward (or a delay before it) makes every bucket late; a delay right
#: before one bucket makes that one late, and the others by CPU jitter only.
OWN_LATENESS_SHARE = 0.5
#: Issue 6: a rank's median step >= 10 % above the median of the other ranks.
RANK_SKEW_RATIO = 1.10
#: The other ranks' median collective time must exceed the straggler's by at
#: least this share of the median step for straggler_rank to fire: balanced
#: ranks' comm differs by a few % of the step from noise alone.
STRAGGLER_WAIT_FRACTION = 0.05
#: The straggler's median backward must be slower than the other ranks' by at
#: least this share of the wait it causes them: the wait is then explained by
#: its backward (backward-origin), not by a slow link on the other ranks.
STRAGGLER_BACKWARD_SHARE = 0.5
#: Above this share of the step spent waiting on the straggler: HIGH.
STRAGGLER_WAIT_FRACTION_HIGH = 0.20


@dataclass(frozen=True)
class RankStats:
    """One rank's per-step figures. Per-step tuples are in step order and of
    equal length (the group's common steps); times in ms unless named ``_ns``.
    """

    rank: int
    """Global rank in the process group (``torch.distributed.get_rank()``)."""
    step_ms: tuple[float, ...]
    """Step duration: first forward to optimizer step end, ms."""
    backward_ms: tuple[float, ...] = ()
    """Backward phase per step, ms, comm overlapped with it included; empty
    when unknown."""
    comm_ms: tuple[float, ...] = ()
    """Time in collectives per step (all-reduce of the gradient buckets,
    waits for the other ranks included) not hidden under compute, ms; empty
    when unknown."""
    bucket_start_ns: tuple[tuple[int, ...], ...] = ()
    """Per step, per DDP gradient bucket (bucket index = position): when the
    bucket became ready and its collective was launched (comm hook entry), ns
    on the group's aligned clock. Empty when unknown."""
    bucket_end_ns: tuple[tuple[int, ...], ...] = ()
    """Per step, per bucket: when the bucket's collective completed on this
    rank, ns on the group's aligned clock. Empty when unknown."""


@dataclass(frozen=True)
class GroupContext:
    """What the group rules know about one process group (one job)."""

    group: str
    """The group's name (e.g. the torchrun job id)."""
    ranks: tuple[RankStats, ...]
    """The ranks that reported, in any order."""


GroupRule = Callable[[GroupContext], "Insight | None"]


def _steady(values: tuple[float, ...]) -> tuple[float, ...]:
    """*values* without the first :data:`WARMUP_STEPS` steps (kept when the
    run is too short to spare them), as for a single run."""
    return values[WARMUP_STEPS:] if len(values) > 2 * WARMUP_STEPS else values


def _steady_median(values: tuple[float, ...]) -> float | None:
    steady = _steady(values)
    return median(steady) if steady else None


def _timed(ctx: GroupContext, attr: str) -> list[RankStats]:
    """Ranks with non-empty *attr*; rule needs two of them to compare."""
    return [r for r in ctx.ranks if getattr(r, attr) and r.step_ms]


def comm_fraction(rank: RankStats) -> float | None:
    """Median over steady steps of the rank's comm share of its step (0-1);
    None without comm figures."""
    if not rank.comm_ms or len(rank.comm_ms) != len(rank.step_ms):
        return None
    pairs = list(zip(_steady(rank.step_ms), _steady(rank.comm_ms), strict=True))
    shares = [c / s for s, c in pairs if s > 0]
    return median(shares) if shares else None


def comm_dominant(ctx: GroupContext) -> Insight | None:
    """Fires when a rank's collectives exceed :data:`COMM_FRACTION` of its step
    (median over steady steps); names the worst rank."""
    shares = {r.rank: f for r in ctx.ranks if (f := comm_fraction(r)) is not None}
    if not shares:
        return None
    worst = max(shares, key=lambda k: (shares[k], -k))
    frac = shares[worst]
    if frac <= COMM_FRACTION:
        return None
    return Insight(
        rule="comm_dominant",
        severity="HIGH" if frac > COMM_FRACTION_HIGH else "MED",
        title=f"Collectives take {frac:.0%} of step time on rank {worst}",
        detail=f"Rank {worst} spends a median {frac:.0%} of each step in collectives "
        f"not hidden under compute ({len(shares)} ranks measured); the gradient "
        "all-reduce is not overlapping with backward.",
        fix="Check the interconnect (NCCL_DEBUG=INFO: is it using NVLink/InfiniBand "
        "or falling back to TCP sockets?); tune DDP bucket_cap_mb; accumulate "
        "gradients over micro-batches under no_sync(); or compress gradients with a "
        "comm hook (fp16/bf16 compression, PowerSGD).",
        evidence={
            "rank": worst,
            "comm_fraction": round(frac, 4),
            "comm_fraction_by_rank": {k: round(v, 4) for k, v in sorted(shares.items())},
        },
    )


def _bucket_lateness(
    ranks: list[RankStats], attr: str, min_delta_ms: float
) -> tuple[int, int, float, float, float, int] | None:
    """The most consistently late (rank, bucket) in the *attr* timestamps.

    Returns (rank, bucket, share of steps it was last, p95 delta ms, median
    delta ms, steps) for the (rank, bucket) with the highest share (ties: the
    larger p95 delta) among those late by a median >= *min_delta_ms*, or None.
    The delta of a step is that rank's timestamp minus the median of the other
    ranks' for the same bucket.
    """
    series = [getattr(r, attr) for r in ranks]
    steps = min(len(t) for t in series)
    best: tuple[int, int, float, float, float, int] | None = None
    n_buckets = min(len(t[i]) for t in series for i in range(steps))
    for bucket in range(n_buckets):
        # per step, every rank's timestamp of this bucket (rank order)
        rows = [[t[i][bucket] for t in series] for i in range(steps)]
        for j, r in enumerate(ranks):
            last = 0
            deltas: list[float] = []
            for row in rows:
                own = row[j]
                others = row[:j] + row[j + 1 :]
                if own > max(others):
                    last += 1
                deltas.append((own - median(others)) / 1e6)
            share = last / steps
            p95 = percentile(deltas, 95)
            med = median(deltas)
            if med < min_delta_ms:  # jitter: not a candidate
                continue
            cand = (r.rank, bucket, share, p95, med, steps)
            if best is None or (share, p95) > (best[2], best[3]):
                best = cand
    return best


def _median_delta(ranks: list[RankStats], attr: str, own: RankStats, bucket: int) -> float:
    """Median over steps of *own*'s *bucket* timestamp minus the median of the
    other ranks' (ms)."""
    steps = min(len(getattr(r, attr)) for r in ranks)
    return median([
        (getattr(own, attr)[i][bucket]
         - median([getattr(o, attr)[i][bucket] for o in ranks if o is not own])) / 1e6
        for i in range(steps)
    ])  # fmt: skip


def _is_late(
    ranks: list[RankStats], attr: str, rank: int, bucket: int, min_delta_ms: float
) -> bool:
    """Whether *rank* is last on *bucket* on >= :data:`BUCKET_LATE_SHARE` of
    steps by a median delta >= *min_delta_ms*."""
    steps = min(len(getattr(r, attr)) for r in ranks)
    own_r = next(r for r in ranks if r.rank == rank)
    last, deltas = 0, []
    for i in range(steps):
        own = getattr(own_r, attr)[i][bucket]
        others = [getattr(o, attr)[i][bucket] for o in ranks if o is not own_r]
        last += own > max(others)
        deltas.append((own - median(others)) / 1e6)
    return last / steps >= BUCKET_LATE_SHARE and median(deltas) >= min_delta_ms


def bucket_skew(ctx: GroupContext) -> Insight | None:
    """Fires when one rank is the last to start (or finish) the same bucket
    on >= :data:`BUCKET_LATE_SHARE` of steps, by a median margin of at least
    :data:`BUCKET_MIN_DELTA_MS` and :data:`BUCKET_MIN_DELTA_FRACTION` of the
    median step; says which rank, which bucket, the p95 delta
    (ms, against the median of the other ranks)."""
    steps_ms = [m for r in ctx.ranks if (m := _steady_median(r.step_ms)) is not None]
    min_delta = max(
        BUCKET_MIN_DELTA_MS, BUCKET_MIN_DELTA_FRACTION * (median(steps_ms) if steps_ms else 0.0)
    )
    found = []
    for attr, what in (("bucket_start_ns", "start"), ("bucket_end_ns", "finish")):
        ranks = _timed(ctx, attr)
        if len(ranks) < 2:
            continue
        late = _bucket_lateness(ranks, attr, min_delta)
        if late and late[2] >= BUCKET_LATE_SHARE:
            found.append((late, what))
    if not found:
        return None
    # a late start usually makes a late finish too: report the start (the cause)
    (rank, bucket, share, p95, med, steps), what = found[0]
    attr = "bucket_start_ns" if what == "start" else "bucket_end_ns"
    ranks = _timed(ctx, attr)
    n_buckets = min(len(b) for r in ranks for b in getattr(r, attr))
    late_buckets = [
        b for b in range(n_buckets) if _is_late(ranks, attr, rank, b, min_delta)
    ]
    own = next(r for r in ranks if r.rank == rank)
    lateness = [max(0.0, _median_delta(ranks, attr, own, b)) for b in range(n_buckets)]
    share_of_lateness = med / sum(lateness) if sum(lateness) > 0 else 1.0
    return Insight(
        rule="bucket_skew",
        severity="MED",
        title=f"Rank {rank} is the last to {what} bucket {bucket} on {share:.0%} of steps "
        f"(p95 {p95:.1f} ms behind the other ranks)",
        detail=f"On {share:.0%} of {steps} steps rank {rank} was the last rank to {what} "
        f"gradient bucket {bucket}'s all-reduce, p95 {p95:.1f} ms after the median of the "
        "other ranks; every rank waits for it in that collective.",
        fix=f"Look at what rank {rank} computes before bucket {bucket}'s gradients are ready: "
        "uneven inputs (sequence lengths), a rank-specific hook or extra work on that rank, "
        "or parameters used only on some ranks (find_unused_parameters).",
        evidence={
            "rank": rank,
            "bucket": bucket,
            "late_on": what,
            "late_share": round(share, 4),
            "p95_delta_ms": round(p95, 3),
            "median_delta_ms": round(med, 3),
            "steps": steps,
            "late_buckets": late_buckets,
            "lateness_share": round(share_of_lateness, 4),
            "buckets": n_buckets,
        },
    )


def rank_skew(ctx: GroupContext) -> Insight | None:
    """Fires when a rank's median steady step time is >= :data:`RANK_SKEW_RATIO`
    times the median of the other ranks' medians; names the slowest rank."""
    meds = {r.rank: m for r in ctx.ranks if (m := _steady_median(r.step_ms)) is not None}
    if len(meds) < 2:
        return None
    worst = max(meds, key=lambda k: (meds[k], -k))
    others = median([v for k, v in meds.items() if k != worst])
    if others <= 0:
        return None
    ratio = meds[worst] / others
    if ratio < RANK_SKEW_RATIO:
        return None
    return Insight(
        rule="rank_skew",
        severity="MED",
        title=f"Rank {worst}'s steps are {ratio - 1:.0%} slower than the other ranks'",
        detail=f"Rank {worst}'s median step is {meds[worst]:.1f} ms against {others:.1f} ms "
        "for the median of the other ranks: it does work outside the synchronising "
        "collectives that they do not.",
        fix=f"Compare rank {worst}'s phases with another rank's (logging, checkpointing or "
        "evaluation on that rank only, uneven batches, a slower GPU or a busier host).",
        evidence={
            "rank": worst,
            "median_step_ms": round(meds[worst], 3),
            "others_median_step_ms": round(others, 3),
            "ratio": round(ratio, 4),
            "median_step_ms_by_rank": {k: round(v, 3) for k, v in sorted(meds.items())},
        },
    )


def straggler_rank(ctx: GroupContext) -> Insight | None:
    """Backward-origin straggler: the rank that waits least in the collective
    while the others wait, because its own backward is slow.

    Fires when the rank with the smallest median comm time is exceeded by
    *every* other rank's by >= :data:`STRAGGLER_WAIT_FRACTION` of the median
    step, and its median backward is slower than the others' (median) by >=
    :data:`STRAGGLER_BACKWARD_SHARE` of that wait.
    """
    ranks = [r for r in ctx.ranks if r.comm_ms and r.backward_ms and r.step_ms]
    if len(ranks) < 2:
        return None
    comm = {r.rank: _steady_median(r.comm_ms) or 0.0 for r in ranks}
    bwd = {r.rank: _steady_median(r.backward_ms) or 0.0 for r in ranks}
    step = median([_steady_median(r.step_ms) or 0.0 for r in ranks])
    if step <= 0:
        return None
    straggler = min(comm, key=lambda k: (comm[k], k))
    others = [k for k in comm if k != straggler]
    min_wait = min(comm[k] for k in others) - comm[straggler]
    wait = median([comm[k] for k in others]) - comm[straggler]
    bwd_excess = bwd[straggler] - median([bwd[k] for k in others])
    if min_wait < STRAGGLER_WAIT_FRACTION * step:
        return None
    if bwd_excess < STRAGGLER_BACKWARD_SHARE * wait:
        return None
    frac = wait / step
    others_bwd = median([bwd[k] for k in others])
    others_comm = median([comm[k] for k in others])
    return Insight(
        rule="straggler_rank",
        severity="HIGH" if frac >= STRAGGLER_WAIT_FRACTION_HIGH else "MED",
        title=f"Rank {straggler} is a straggler: its backward is {bwd_excess:.1f} ms slower "
        f"and the other ranks wait {wait:.1f} ms per step ({frac:.0%}) for it",
        detail=f"Rank {straggler}'s median backward is {bwd[straggler]:.1f} ms against "
        f"{others_bwd:.1f} ms on the other ranks, and it waits least "
        f"in the collectives ({comm[straggler]:.1f} ms against {others_comm:.1f} "
        "ms): the gradient all-reduce holds every rank until its buckets are ready, so "
        "all steps are equally slow. The comm time on the other ranks is waiting, "
        "not the network.",
        fix=f"Find what slows rank {straggler}'s backward: a slower or throttled GPU (check "
        "clocks and temperature), a rank-specific hook, uneven inputs, or another "
        "process on that GPU.",
        evidence={
            "rank": straggler,
            "wait_ms": round(wait, 3),
            "wait_fraction": round(frac, 4),
            "backward_excess_ms": round(bwd_excess, 3),
            "median_comm_ms_by_rank": {k: round(v, 3) for k, v in sorted(comm.items())},
            "median_backward_ms_by_rank": {k: round(v, 3) for k, v in sorted(bwd.items())},
        },
    )


#: The group rules in report order (most specific first).
GROUP_RULES: tuple[GroupRule, ...] = (straggler_rank, comm_dominant, bucket_skew, rank_skew)

#: Findings a group finding explains: a backward-origin straggler is why the
#: other ranks wait in the collectives, so the network is not to blame.
GROUP_SUPERSEDES: Mapping[str, tuple[str, ...]] = {
    "straggler_rank": ("comm_dominant",),
}


def _straggler_explains(straggler: Insight, skew: Insight) -> bool:
    """Whether a bucket_skew finding is only the straggler's slow backward
    seen bucket by bucket: the same rank, and the named bucket holds less
    than :data:`OWN_LATENESS_SHARE` of that rank's lateness over all buckets
    (a slow backward delays every bucket; one late bucket is its own finding),
    or the model has a single bucket (nothing to tell apart)."""
    ev = skew.evidence
    if ev["rank"] != straggler.evidence["rank"]:
        return False
    # one bucket: "late on bucket 0" is the straggler's slow backward, nothing more
    return ev["buckets"] == 1 or ev["lateness_share"] < OWN_LATENESS_SHARE


def group_rules(ctx: GroupContext) -> list[Insight]:
    """Run :data:`GROUP_RULES` on *ctx*; superseded findings left out."""
    found = [i for fn in GROUP_RULES if (i := fn(ctx)) is not None]
    hidden = {old for i in found for old in GROUP_SUPERSEDES.get(i.rule, ())}
    kept = [i for i in found if i.rule not in hidden]
    straggler = next((i for i in kept if i.rule == "straggler_rank"), None)
    if straggler is not None:
        kept = [i for i in kept if i.rule != "bucket_skew" or not _straggler_explains(straggler, i)]
    return kept
