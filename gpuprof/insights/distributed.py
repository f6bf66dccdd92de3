"""Group-level rules: one distributed job's ranks compared with each other.

These rules read a process group's per-rank aggregates (:class:`GroupContext`)
rather than one run's :class:`~gpuprof.insights.base.RunContext`, so they are
not in the per-run registry: :func:`group_rules` runs :data:`GROUP_RULES` and
drops what :data:`GROUP_SUPERSEDES` says a more specific finding explains.

The findings:

* ``straggler_rank`` -- one rank's backward is slow; the all-reduce makes every
  rank's step equally slow, and the straggler is the rank that waits least in
  the collective. It explains the comm time the other ranks show, so it
  supersedes ``comm_dominant`` (the network is not to blame), and a
  ``bucket_skew`` on the same rank spread over most buckets.
* ``comm_dominant`` -- collectives take > 20 % of step time (on every rank:
  the job; on some: those ranks).
* ``bucket_skew`` -- one rank is the last to start (or finish) the same
  gradient bucket on >= 60 % of steps, more often than chance allows.
* ``rank_skew`` -- a rank's median step time is >= 10 % above the others',
  step after step.

The rules must fire when, and only when, they are true: each one asks for a
pattern that holds step after step (not a median that noise can move) and
none speaks on fewer than :data:`MIN_STEADY_STEPS` common steady steps.

All rules are pure functions ``(GroupContext) -> Insight | None``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuprof.insights.base import WARMUP_STEPS, Insight
from gpuprof.stats import median, percentile

#: Collectives above 20 % of the step are worth a finding. DDP
#: overlaps most of the all-reduce with backward; exposed comm beyond a fifth
#: of the step means the overlap (bucket size, interconnect) is failing.
COMM_FRACTION = 0.20
#: Above this share the step is mostly waiting on the network.
COMM_FRACTION_HIGH = 0.40
#: A rank last on the same bucket on >= 60 % of steps is a pattern,
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
#: A rank's median step >= 10 % above the median of the other ranks: beyond
#: step-to-step jitter, a delay the others wait for at every all-reduce.
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
#: Fewest common steady steps (after warm-up) for any group rule to speak: a
#: finding on a dozen steps (a rank killed early, a short smoke run) is a
#: guess -- one slow step moves a median, and "last on 60 % of steps" is a
#: coin flip away from chance. Say nothing rather than guess.
MIN_STEADY_STEPS = 20
#: A per-rank pattern must hold on at least this share of the steady steps,
#: step by step (the straggler's backward above the other ranks' median and its
#: comm below theirs; rank_skew's rank slower than the others' median): a
#: median difference between balanced ranks is noise, and noise favours no
#: rank on three steps in four (measured: balanced 4-rank gloo on 2 cores
#: named a "straggler" 4 ms slower, and lockstep ranks read 16-33 % skewed).
#: On short runs three in four is still within chance, so the count must also
#: pass :data:`FAMILY_ALPHA` (each rank above the others' median w.p. 1/2).
CONSISTENT_SHARE = 0.75
#: rank_skew also needs the slow rank's median step to be at least this many
#: ms above the others': each rank times its step on its own CPU, and on a
#: loaded host the step boundaries move by about a millisecond (scheduling),
#: which is 10 % of a short step and costs nothing worth a finding.
RANK_SKEW_MIN_MS = 1.0
#: Significance of a per-step pattern: the chance that balanced ranks make
#: *any* of the candidates a rule tries show it on as many steps, Bonferroni-
#: corrected: each candidate's binomial upper tail must be <= this / the number
#: tried. bucket_skew tries ranks x buckets x (start, finish), each rank last
#: w.p. 1 / ranks -- with 2 ranks "last on >= 60 % of 63 steps" happens one
#: time in ten per candidate (measured: 2 of 3 balanced 2-rank launches named
#: a random rank and bucket at 62-63 %); the consistency checks
#: (:data:`CONSISTENT_SHARE`) try each rank, above the others w.p. 1/2.
FAMILY_ALPHA = 1e-3


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


def _enough_steps(ranks: list[RankStats] | tuple[RankStats, ...]) -> bool:
    """Whether every rank in *ranks* has >= :data:`MIN_STEADY_STEPS` steady
    steps (the group's common steps, warm-up left out)."""
    return bool(ranks) and all(len(_steady(r.step_ms)) >= MIN_STEADY_STEPS for r in ranks)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= *k*) for X ~ Binomial(*n*, *p*), summed in log space (exact for
    the few thousand steps a group rule sees; no overflow)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq, ln = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    logs = [
        ln - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * lp + (n - j) * lq
        for j in range(k, n + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(x - top) for x in logs))


def _share_where(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def _consistent(flags: list[bool], n_ranks: int) -> bool:
    """Whether a rank's per-step pattern (*flags*, one per steady step) holds
    on >= :data:`CONSISTENT_SHARE` of steps and on more steps than chance
    makes for any of *n_ranks* candidates (each step a fair coin under
    balanced ranks; :data:`FAMILY_ALPHA`, Bonferroni over the ranks)."""
    return (
        _share_where(flags) >= CONSISTENT_SHARE
        and binomial_tail(sum(flags), len(flags), 0.5) <= FAMILY_ALPHA / n_ranks
    )


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
    (median over steady steps). When every measured rank exceeds it the
    finding is the whole job's (``all_ranks``, the range of shares); otherwise
    it names the worst rank, and the others over it when a minority (at most
    half the ranks) is, or says how many of the ranks when most but not all are.
    """
    timed = [r for r in ctx.ranks if comm_fraction(r) is not None]
    if not _enough_steps(timed):
        return None
    shares = {r.rank: f for r in timed if (f := comm_fraction(r)) is not None}
    over = sorted(k for k, v in shares.items() if v > COMM_FRACTION)
    if not over:
        return None
    worst = max(over, key=lambda k: (shares[k], -k))
    frac = shares[worst]
    lo = min(shares[k] for k in over)
    all_ranks = len(over) == len(shares)
    severity = "HIGH" if frac > COMM_FRACTION_HIGH else "MED"
    span = f"{frac:.0%}" if f"{lo:.0%}" == f"{frac:.0%}" else f"{lo * 100:.0f}-{frac:.0%}"
    evidence: dict = {}
    if all_ranks and len(shares) > 1:
        title = f"Collectives take {span} of step time on every rank"
        who = f"Every rank spends a median {span} of each step"
        cause = (
            "the gradient all-reduce is not overlapping with backward anywhere in the "
            "job: a job-wide cause (interconnect, bucket sizes), not one rank."
        )
    elif 2 * len(over) <= len(shares) or len(shares) == 1:
        names = ", ".join(str(k) for k in over)
        title = f"Collectives take {frac:.0%} of step time on rank {worst}"
        if len(over) > 1:
            title += f" ({span} on ranks {names})"
        who = f"Rank {worst} spends a median {frac:.0%} of each step" + (
            f" (ranks {names}: {span})" if len(over) > 1 else ""
        )
        cause = "the gradient all-reduce is not overlapping with backward" + (
            " on this rank." if len(shares) > 1 and len(over) == 1 else "."
        )
        evidence["rank"] = worst
    else:
        title = f"Collectives take {span} of step time on {len(over)} of {len(shares)} ranks"
        who = f"Ranks {', '.join(str(k) for k in over)} spend a median {span} of each step"
        cause = "the gradient all-reduce is not overlapping with backward."
    return Insight(
        rule="comm_dominant",
        severity=severity,
        title=title,
        detail=f"{who} in collectives not hidden under compute ({len(shares)} ranks "
        f"measured); {cause}",
        fix="Check the interconnect (NCCL_DEBUG=INFO: is it using NVLink/InfiniBand "
        "or falling back to TCP sockets?); tune DDP bucket_cap_mb; accumulate "
        "gradients over micro-batches under no_sync(); or compress gradients with a "
        "comm hook (fp16/bf16 compression, PowerSGD).",
        evidence={
            **evidence,
            "all_ranks": all_ranks,
            "ranks": over,
            "comm_fraction": round(frac, 4),
            "comm_fraction_by_rank": {k: round(v, 4) for k, v in sorted(shares.items())},
        },
    )


@dataclass(frozen=True)
class _Late:
    """One (rank, bucket) candidate of bucket_skew on start or finish times."""

    rank: int
    bucket: int
    last: int
    """Steps on which this rank was the last to reach the bucket."""
    steps: int
    p95: float
    """p95 over steps of its time minus the other ranks' median, ms."""
    med: float
    """Median of the same, ms."""
    chance: float
    """Binomial upper tail of *last* with each rank last w.p. 1 / ranks."""

    @property
    def share(self) -> float:
        return self.last / self.steps


def _bucket_candidates(ranks: list[RankStats], attr: str) -> list[_Late]:
    """Every (rank, bucket) of the *attr* timestamps, with how often that rank
    was last on that bucket and by how much (its timestamp minus the median of
    the other ranks' for the same bucket and step)."""
    series = [getattr(r, attr) for r in ranks]
    steps = min(len(t) for t in series)
    if steps == 0:
        return []
    n_buckets = min(len(t[i]) for t in series for i in range(steps))
    import numpy as np  # lazily: the training process imports gpuprof too

    # (rank, step, bucket) timestamps; the medians and maxima of the other
    # ranks per step and bucket in one pass (ns < 2**53: exact in float64, so
    # the same figures as a median per row)
    stamps = np.array(
        [[t[i][:n_buckets] for i in range(steps)] for t in series], dtype=np.int64
    ).reshape(len(series), steps, n_buckets)
    per_rank = []
    for j in range(len(ranks)):
        others = np.delete(stamps, j, axis=0)
        own = stamps[j]
        last = (own > others.max(axis=0)).sum(axis=0).tolist()
        deltas = ((own - np.median(others, axis=0)) / 1e6).T.tolist()  # per bucket
        per_rank.append((last, deltas))
    out = []
    for bucket in range(n_buckets):
        for r, (last_of, deltas_of) in zip(ranks, per_rank, strict=True):
            last, deltas = int(last_of[bucket]), deltas_of[bucket]
            chance = binomial_tail(last, steps, 1.0 / len(ranks))
            out.append(
                _Late(r.rank, bucket, last, steps, percentile(deltas, 95), median(deltas), chance)
            )
    return out


def bucket_skew(ctx: GroupContext) -> Insight | None:
    """Fires when one rank is the last to start (or finish) the same bucket
    on >= :data:`BUCKET_LATE_SHARE` of steps, by a median margin of at least
    :data:`BUCKET_MIN_DELTA_MS` and :data:`BUCKET_MIN_DELTA_FRACTION` of the
    median step, and on more steps than chance makes (binomial tail <=
    :data:`FAMILY_ALPHA` / candidates tried); says which rank, which
    bucket, the p95 delta (ms, against the median of the other ranks)."""
    if not _enough_steps(ctx.ranks):
        return None
    steps_ms = [m for r in ctx.ranks if (m := _steady_median(r.step_ms)) is not None]
    min_delta = max(
        BUCKET_MIN_DELTA_MS, BUCKET_MIN_DELTA_FRACTION * (median(steps_ms) if steps_ms else 0.0)
    )
    tried: dict[str, list[_Late]] = {}
    for attr in ("bucket_start_ns", "bucket_end_ns"):
        ranks = _timed(ctx, attr)
        if len(ranks) >= 2 and min(len(getattr(r, attr)) for r in ranks) >= MIN_STEADY_STEPS:
            tried[attr] = _bucket_candidates(ranks, attr)
    n_tried = sum(len(c) for c in tried.values())
    if not n_tried:
        return None
    alpha = FAMILY_ALPHA / n_tried

    def late(c: _Late) -> bool:
        return c.share >= BUCKET_LATE_SHARE and c.med >= min_delta and c.chance <= alpha

    found = []
    for attr, what in (("bucket_start_ns", "start"), ("bucket_end_ns", "finish")):
        hits = [c for c in tried.get(attr, []) if late(c)]
        if hits:
            found.append((max(hits, key=lambda c: (c.share, c.p95)), attr, what))
    if not found:
        return None
    # a late start usually makes a late finish too: report the start (the cause)
    best, attr, what = found[0]
    rank, bucket, share, p95, med, steps = (
        best.rank,
        best.bucket,
        best.share,
        best.p95,
        best.med,
        best.steps,
    )
    own = [c for c in tried[attr] if c.rank == rank]
    n_buckets = len(own)
    late_buckets = [c.bucket for c in own if late(c)]
    lateness = sum(max(0.0, c.med) for c in own)
    share_of_lateness = med / lateness if lateness > 0 else 1.0
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
            "chance_p": float(f"{best.chance:.3g}"),
            "candidates": n_tried,
            "late_buckets": late_buckets,
            "lateness_share": round(share_of_lateness, 4),
            "buckets": n_buckets,
        },
    )


def _vs_others(
    ranks: list[RankStats], who: int, attr: str, cmp: Callable[[float, float], bool]
) -> list[bool]:
    """Per steady step: ``cmp(mine, others)``, rank *who*'s *attr* value against
    the median of the other ranks' on the same step."""
    own = next(r for r in ranks if r.rank == who)
    others = [_steady(getattr(r, attr)) for r in ranks if r is not own]
    mine = _steady(getattr(own, attr))
    n = min(len(mine), *(len(o) for o in others))
    return [cmp(mine[i], median([o[i] for o in others])) for i in range(n)]


def rank_skew(ctx: GroupContext) -> Insight | None:
    """Fires when a rank's median steady step time is >= :data:`RANK_SKEW_RATIO`
    times the median of the other ranks' medians and >= :data:`RANK_SKEW_MIN_MS`
    above it, and its step is above the other ranks' median on >=
    :data:`CONSISTENT_SHARE` of steady steps; names the slowest rank."""
    ranks = [r for r in ctx.ranks if r.step_ms]
    if len(ranks) < 2 or not _enough_steps(ranks):
        return None
    meds = {r.rank: m for r in ranks if (m := _steady_median(r.step_ms)) is not None}
    worst = max(meds, key=lambda k: (meds[k], -k))
    others = median([v for k, v in meds.items() if k != worst])
    if others <= 0:
        return None
    ratio = meds[worst] / others
    if ratio < RANK_SKEW_RATIO or meds[worst] - others < RANK_SKEW_MIN_MS:
        return None
    above = _vs_others(ranks, worst, "step_ms", operator.gt)
    if not _consistent(above, len(ranks)):
        return None
    slower = _share_where(above)
    return Insight(
        rule="rank_skew",
        severity="MED",
        title=f"Rank {worst}'s steps are {ratio - 1:.0%} slower than the other ranks'",
        detail=f"Rank {worst}'s median step is {meds[worst]:.1f} ms against {others:.1f} ms "
        f"for the median of the other ranks, and slower than theirs on {slower:.0%} of "
        "steps: it does work outside the synchronising collectives that they do not.",
        fix=f"Compare rank {worst}'s phases with another rank's (logging, checkpointing or "
        "evaluation on that rank only, uneven batches, a slower GPU or a busier host).",
        evidence={
            "rank": worst,
            "median_step_ms": round(meds[worst], 3),
            "others_median_step_ms": round(others, 3),
            "ratio": round(ratio, 4),
            "slower_share": round(slower, 4),
            "steps": len(_steady(ranks[0].step_ms)),
            "median_step_ms_by_rank": {k: round(v, 3) for k, v in sorted(meds.items())},
        },
    )


def straggler_rank(ctx: GroupContext) -> Insight | None:
    """Backward-origin straggler: the rank that waits least in the collective
    while the others wait, because its own backward is slow.

    Fires when the rank with the smallest median comm time is exceeded by
    *every* other rank's by >= :data:`STRAGGLER_WAIT_FRACTION` of the median
    step, its median backward is slower than the others' (median) by >=
    :data:`STRAGGLER_BACKWARD_SHARE` of that wait, and both hold step by step:
    its backward above the other ranks' median, and its comm below theirs, on
    >= :data:`CONSISTENT_SHARE` of steady steps.
    """
    ranks = [r for r in ctx.ranks if r.comm_ms and r.backward_ms and r.step_ms]
    if len(ranks) < 2 or not _enough_steps(ranks):
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
    slow_steps = _vs_others(ranks, straggler, "backward_ms", operator.gt)
    less_steps = _vs_others(ranks, straggler, "comm_ms", operator.lt)
    if not (_consistent(slow_steps, len(ranks)) and _consistent(less_steps, len(ranks))):
        return None
    slower, waits_less = _share_where(slow_steps), _share_where(less_steps)
    frac = wait / step
    others_bwd = median([bwd[k] for k in others])
    others_comm = median([comm[k] for k in others])
    return Insight(
        rule="straggler_rank",
        severity="HIGH" if frac >= STRAGGLER_WAIT_FRACTION_HIGH else "MED",
        title=f"Rank {straggler} is a straggler: its backward is {bwd_excess:.1f} ms slower "
        f"and the other ranks wait {wait:.1f} ms per step ({frac:.0%}) for it",
        detail=f"Rank {straggler}'s median backward is {bwd[straggler]:.1f} ms against "
        f"{others_bwd:.1f} ms on the other ranks (slower on {slower:.0%} of steps), and it "
        f"waits least in the collectives ({comm[straggler]:.1f} ms against {others_comm:.1f} "
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
            "slower_backward_share": round(slower, 4),
            "less_comm_share": round(waits_less, 4),
            "steps": len(_steady(ranks[0].step_ms)),
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
