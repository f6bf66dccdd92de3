"""Group rules: straggler, comm share, bucket and rank skew."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import replace

import pytest

from gpuprof.insights.distributed import (
    FAMILY_ALPHA,
    MIN_STEADY_STEPS,
    GroupContext,
    RankStats,
    binomial_tail,
    bucket_skew,
    comm_dominant,
    group_rules,
    rank_skew,
    straggler_rank,
)

STEPS = 30
BUCKETS = 4


def make_rank(
    rank: int,
    *,
    seed: int,
    forward_ms: float = 20.0,
    backward_ms: float = 40.0,
    comm_ms: float = 5.0,
    optimizer_ms: float = 5.0,
    extra_step_ms: float = 0.0,
    noise_ms: float = 0.5,
    start_delay_ms: dict[int, float] | None = None,
    end_shift_ms: float = 0.0,
    steps: int = STEPS,
) -> RankStats:
    """A rank whose step = forward + backward + exposed comm + optimizer (+ extra).

    Buckets become ready evenly through the backward (start_ns, aligned clock,
    step i starts at i s); each finishes 2 ms after its start (+ end_shift_ms).
    ``start_delay_ms`` delays a bucket's launch on this rank only.
    """
    rng = random.Random(seed)
    n = lambda: rng.gauss(0.0, noise_ms)  # noqa: E731
    step, bwd, comm, starts, ends = [], [], [], [], []
    delays = start_delay_ms or {}
    for i in range(steps):
        b = backward_ms + n()
        c = max(0.0, comm_ms + n())
        bwd.append(b)
        comm.append(c)
        step.append(forward_ms + b + c + optimizer_ms + extra_step_ms + n())
        t0 = i * 1_000_000_000 + int(forward_ms * 1e6)
        s_row, e_row = [], []
        for k in range(BUCKETS):
            s = t0 + int(((k + 1) * b / BUCKETS + delays.get(k, 0.0) + n() * 0.2) * 1e6)
            s_row.append(s)
            e_row.append(s + int((2.0 + end_shift_ms + n() * 0.2) * 1e6))
        starts.append(tuple(s_row))
        ends.append(tuple(e_row))
    return RankStats(
        rank=rank,
        step_ms=tuple(step),
        backward_ms=tuple(bwd),
        comm_ms=tuple(comm),
        bucket_start_ns=tuple(starts),
        bucket_end_ns=tuple(ends),
    )


def group(*ranks: RankStats) -> GroupContext:
    return GroupContext(group="job", ranks=ranks)


def balanced(n: int = 4) -> GroupContext:
    return group(*(make_rank(r, seed=100 + r) for r in range(n)))


# --- balanced: nothing fires ---------------------------------------------


def test_balanced_ranks_with_noise_fire_nothing():
    ctx = balanced(4)
    assert straggler_rank(ctx) is None
    assert comm_dominant(ctx) is None
    assert bucket_skew(ctx) is None
    assert rank_skew(ctx) is None
    assert group_rules(ctx) == []


def test_balanced_two_ranks_fire_nothing():
    # with 2 ranks one is last on half the buckets by chance: the delta gate holds
    assert group_rules(balanced(2)) == []


def test_single_rank_or_no_comm_figures_fire_nothing():
    assert group_rules(group(make_rank(0, seed=1))) == []
    bare = group(RankStats(0, (100.0,) * 10), RankStats(1, (100.0,) * 10))
    assert group_rules(bare) == []


# --- comm_dominant ---------------------------------------------------------


def test_comm_dominant_fires_above_20_percent_naming_worst_rank():
    # step 20+40+30+5 = 95 ms, 30 ms comm = 32 % on rank 2; others at 5 %
    ranks = [make_rank(r, seed=r, comm_ms=30.0 if r == 2 else 5.0) for r in range(4)]
    ins = comm_dominant(group(*ranks))
    assert ins is not None
    assert ins.evidence["rank"] == 2
    assert "rank 2" in ins.title
    assert 0.28 < ins.evidence["comm_fraction"] < 0.36
    assert ins.severity == "MED"
    assert ins.evidence["all_ranks"] is False and ins.evidence["ranks"] == [2]


def test_comm_dominant_on_every_rank_is_the_job_not_a_rank():
    # field report: {"0": 0.42, "1": 0.51} read "... 51% of step time on rank 1"
    ranks = [make_rank(r, seed=r, comm_ms=40.0 if r == 0 else 55.0) for r in range(2)]
    ins = comm_dominant(group(*ranks))
    assert ins is not None
    assert ins.evidence["all_ranks"] is True and "rank" not in ins.evidence
    assert ins.evidence["ranks"] == [0, 1]
    assert "on every rank" in ins.title and "rank 1" not in ins.title
    lo, hi = sorted(ins.evidence["comm_fraction_by_rank"].values())
    assert f"{lo * 100:.0f}-{hi:.0%} of step time on every rank" in ins.title
    assert ins.severity == "HIGH"


def test_comm_dominant_names_a_minority_of_ranks():
    # 2 of 4 ranks over: a minority, both named, the worst first
    comm = {0: 5.0, 1: 25.0, 2: 35.0, 3: 5.0}
    ins = comm_dominant(group(*(make_rank(r, seed=r, comm_ms=c) for r, c in comm.items())))
    assert ins is not None and ins.evidence["rank"] == 2 and ins.evidence["ranks"] == [1, 2]
    assert ins.title.startswith("Collectives take") and "on rank 2" in ins.title
    assert "ranks 1, 2" in ins.title


def test_comm_dominant_high_when_most_of_the_step():
    ranks = [make_rank(r, seed=r, comm_ms=80.0) for r in range(2)]
    ins = comm_dominant(group(*ranks))
    assert ins is not None and ins.severity == "HIGH"


def test_comm_dominant_silent_at_15_percent():
    # 12 ms comm of a ~82 ms step: ~15 %
    ranks = [make_rank(r, seed=r, comm_ms=12.0) for r in range(4)]
    assert comm_dominant(group(*ranks)) is None


def test_comm_dominant_uses_steady_steps():
    # a 500 ms comm in warm-up steps (NCCL communicator set-up) is not steady state
    comm = (500.0, 500.0, 500.0) + (5.0,) * 10
    step = (600.0, 600.0, 600.0) + (70.0,) * 10
    r = RankStats(0, step, backward_ms=(40.0,) * 13, comm_ms=comm)
    assert comm_dominant(group(r)) is None


# --- straggler_rank --------------------------------------------------------


def torchrun_straggler() -> GroupContext:
    """The straggler case: 4 ranks, rank 1's backward slowed 30 ms per step by a
    hook; the all-reduce absorbs it as 30 ms more comm on ranks 0, 2, 3, so
    every rank's step is ~100 ms. Rank 1 launches every bucket late."""
    ranks = []
    for r in range(4):
        if r == 1:
            ranks.append(make_rank(r, seed=r, backward_ms=70.0, comm_ms=5.0))
        else:
            ranks.append(make_rank(r, seed=r, backward_ms=40.0, comm_ms=35.0))
    return group(*ranks)


def test_torchrun_straggler_names_rank_1_and_nothing_blames_the_network():
    ctx = torchrun_straggler()
    # comm on ranks 0, 2, 3 is ~35 % of the step: comm_dominant alone would fire
    assert comm_dominant(ctx) is not None
    found = group_rules(ctx)
    assert [i.rule for i in found] == ["straggler_rank"]
    ins = found[0]
    assert ins.evidence["rank"] == 1
    assert "Rank 1" in ins.title
    assert 28 < ins.evidence["wait_ms"] < 32
    assert 28 < ins.evidence["backward_excess_ms"] < 32
    assert ins.severity == "HIGH"  # 30 of 100 ms waited


def test_straggler_needs_a_slow_backward():
    # rank 3 waits least but its backward is like the others': a slow link on
    # ranks 0-2, not a straggler
    ranks = [make_rank(r, seed=r, comm_ms=5.0 if r == 3 else 35.0) for r in range(4)]
    ctx = group(*ranks)
    assert straggler_rank(ctx) is None
    ins = comm_dominant(ctx)
    # three of four ranks over 20 %: no one rank is named
    assert ins is not None and ins.evidence["ranks"] == [0, 1, 2]
    assert "rank" not in ins.evidence and ins.evidence["all_ranks"] is False
    assert "on 3 of 4 ranks" in ins.title


def test_straggler_needs_every_other_rank_waiting():
    # two slow ranks (1 and 2): rank 2 waits as little as rank 1, no single straggler
    ranks = []
    for r in range(4):
        slow = r in (1, 2)
        ranks.append(
            make_rank(r, seed=r, backward_ms=70.0 if slow else 40.0, comm_ms=5.0 if slow else 35.0)
        )
    assert straggler_rank(group(*ranks)) is None


def test_straggler_silent_on_small_wait():
    # 2 ms slower backward on rank 1 of a ~70 ms step: under 5 %
    ranks = [
        make_rank(r, seed=r, backward_ms=42.0 if r == 1 else 40.0, comm_ms=5.0 if r == 1 else 7.0)
        for r in range(4)
    ]
    assert straggler_rank(group(*ranks)) is None


def _every(values: tuple[float, ...], slow: set[int], extra: float) -> tuple[float, ...]:
    return tuple(v + (extra if i in slow else 0.0) for i, v in enumerate(values))


def test_straggler_needs_a_slow_backward_step_after_step():
    # rank 1's backward is 60 ms slower on 3 steps of 5 only (not steady): its
    # medians look like a straggler's, but on 40 % of steps it is not one
    slow = {i for i in range(STEPS) if i % 5 < 3}
    ranks = [make_rank(r, seed=r) for r in range(4)]
    r1 = ranks[1]
    ranks[1] = replace(r1, backward_ms=_every(r1.backward_ms, slow, 60.0))
    for r in (0, 2, 3):
        ranks[r] = replace(ranks[r], comm_ms=_every(ranks[r].comm_ms, slow, 60.0))
    ctx = group(*ranks)
    assert straggler_rank(ctx) is None
    # the same slowness on every step is the straggler
    every = set(range(STEPS))
    ranks[1] = replace(r1, backward_ms=_every(r1.backward_ms, every, 60.0))
    for r in (0, 2, 3):
        base = make_rank(r, seed=r)
        ranks[r] = replace(base, comm_ms=_every(base.comm_ms, every, 60.0))
    ins = straggler_rank(group(*ranks))
    assert ins is not None and ins.evidence["rank"] == 1
    assert ins.evidence["slower_backward_share"] == 1.0 and ins.evidence["less_comm_share"] == 1.0


def test_no_group_rule_speaks_on_too_few_common_steps():
    # a rank killed mid-run: 14 common steady steps; the straggler is plain in
    # them, but 14 steps are a guess
    def straggler(steps: int) -> GroupContext:
        return group(
            *(
                make_rank(
                    r,
                    seed=r,
                    steps=steps,
                    backward_ms=70.0 if r == 1 else 40.0,
                    comm_ms=5.0 if r == 1 else 35.0,
                    extra_step_ms=20.0 if r == 1 else 0.0,
                )
                for r in range(4)
            )
        )

    short = straggler(14 + 3)
    assert all(fn(short) is None for fn in (straggler_rank, comm_dominant, bucket_skew, rank_skew))
    assert group_rules(short) == []
    enough = straggler(MIN_STEADY_STEPS + 3)
    assert [i.rule for i in group_rules(enough)] == ["straggler_rank", "rank_skew"]


# --- bucket_skew -----------------------------------------------------------


def test_binomial_tail():
    assert binomial_tail(0, 10, 0.5) == 1.0 and binomial_tail(11, 10, 0.5) == 0.0
    assert binomial_tail(30, 30, 0.5) == pytest.approx(0.5**30, rel=1e-9)
    exact = sum(math.comb(63, j) for j in range(40, 64)) / 2**63
    assert binomial_tail(40, 63, 0.5) == pytest.approx(exact, rel=1e-9)
    assert binomial_tail(1, 4, 0.25) == pytest.approx(1 - 0.75**4)
    # thousands of steps: no overflow, and a fair coin's half is no signal
    assert 0.5 < binomial_tail(1500, 3000, 0.5) < 0.51
    assert 0.0 <= binomial_tail(2500, 3000, 0.5) < 1e-100


def _bucket_pair(late_steps: int, steps: int = 63) -> GroupContext:
    """2 ranks, 30 ms steps (min delta 1.5 ms), 4 buckets, no noise: rank 0
    launches bucket 2 2 ms after rank 1 on the first *late_steps* steps and
    0.5 ms before it on the rest (the field report: last on 63 % of 63 steps
    by a median 1.48 ms)."""
    ms = 1_000_000
    rows = {0: [], 1: []}
    for i in range(steps):
        base = [i * 1000 * ms + (k + 1) * 5 * ms for k in range(BUCKETS)]
        rows[1].append(tuple(base))
        shift = 2 * ms if i < late_steps else -ms // 2
        rows[0].append(tuple(t + (shift if k == 2 else 0) for k, t in enumerate(base)))
    ranks = [
        RankStats(
            r,
            (30.0,) * steps,
            bucket_start_ns=tuple(rows[r]),
            bucket_end_ns=tuple(tuple(t + 2 * ms for t in row) for row in rows[r]),
        )
        for r in (0, 1)
    ]
    return group(*ranks)


def test_bucket_skew_needs_more_late_steps_than_chance():
    # last on 40 of 63 steps (63 %): one time in 50 for a fair coin, and the
    # rule tries 2 ranks x 4 buckets x (start, finish) = 16 candidates
    assert binomial_tail(40, 63, 0.5) > FAMILY_ALPHA / 16
    assert bucket_skew(_bucket_pair(40)) is None
    ins = bucket_skew(_bucket_pair(55))  # 87 %: not chance
    assert ins is not None and (ins.evidence["rank"], ins.evidence["bucket"]) == (0, 2)
    assert ins.evidence["chance_p"] <= FAMILY_ALPHA / ins.evidence["candidates"]
    assert ins.evidence["candidates"] == 16


# --- must not fire: balanced groups, many seeds ------------------------------

#: 40 ms steps (10 + 20 + 5 comm + 5 ms): a 3 ms noise is heavy against them.
FORTY_MS = {"forward_ms": 10.0, "backward_ms": 20.0, "comm_ms": 5.0, "optimizer_ms": 5.0}


@pytest.mark.parametrize(
    ("n_ranks", "noise_ms", "steps"),
    [(2, 3.0, 25), (2, 3.0, 30), (2, 2.0, 63), (4, 3.0, 25)],
)
def test_balanced_groups_over_300_seeds_fire_nothing(n_ranks: int, noise_ms: float, steps: int):
    # before the per-step consistency and significance gates, (2, 3.0, 25)
    # fired bucket_skew 24 times, rank_skew 17 and straggler_rank once in 300
    fired = {}
    for seed in range(300):
        ctx = group(
            *(
                make_rank(r, seed=1000 * seed + r, noise_ms=noise_ms, steps=steps, **FORTY_MS)
                for r in range(n_ranks)
            )
        )
        for ins in group_rules(ctx):
            fired[ins.rule] = fired.get(ins.rule, 0) + 1
    assert fired == {}


def test_the_issue_scenarios_fire_under_heavy_noise():
    # 100 seeds each: the 4-rank straggler and the 2-rank late bucket, noise 1.5 ms
    hits = {"straggler_rank": 0, "bucket_skew": 0}
    for seed in range(100):
        ranks = [
            make_rank(
                r,
                seed=1000 * seed + r,
                noise_ms=1.5,
                backward_ms=70.0 if r == 1 else 40.0,
                comm_ms=5.0 if r == 1 else 35.0,
            )
            for r in range(4)
        ]
        hits["straggler_rank"] += any(
            i.rule == "straggler_rank" and i.evidence["rank"] == 1
            for i in group_rules(group(*ranks))
        )
        r0 = make_rank(0, seed=1000 * seed, noise_ms=1.5, comm_ms=2.0, start_delay_ms={3: 5.0})
        r0 = replace(r0, backward_ms=tuple(b + 5.0 for b in r0.backward_ms))
        r1 = make_rank(1, seed=1000 * seed + 1, noise_ms=1.5, comm_ms=7.0)
        ins = bucket_skew(group(r0, r1))
        hits["bucket_skew"] += ins is not None and (
            ins.evidence["rank"],
            ins.evidence["bucket"],
        ) == (0, 3)
    assert hits == {"straggler_rank": 100, "bucket_skew": 100}


def delayed_bucket_pair(delay_ms: float = 5.0) -> GroupContext:
    """The bucket-skew case: 2 ranks, bucket 3 delayed on rank 0 only (a sleep in
    the comm hook: rank 0's backward is that much longer, rank 1 waits for it
    in the all-reduce)."""
    r0 = make_rank(0, seed=10, backward_ms=40.0, comm_ms=2.0, start_delay_ms={3: delay_ms})
    # the sleep is inside rank 0's backward; buckets 0-2 were launched before it
    r0 = replace(r0, backward_ms=tuple(b + delay_ms for b in r0.backward_ms))
    r1 = make_rank(1, seed=11, backward_ms=40.0, comm_ms=2.0 + delay_ms)
    return group(r0, r1)


def test_bucket_skew_names_rank_0_and_bucket_3():
    ctx = delayed_bucket_pair()
    ins = bucket_skew(ctx)
    assert ins is not None
    assert ins.evidence["rank"] == 0
    assert ins.evidence["bucket"] == 3
    assert ins.evidence["late_on"] == "start"
    assert ins.evidence["late_share"] >= 0.6
    assert 4.0 < ins.evidence["p95_delta_ms"] < 7.0
    assert "Rank 0" in ins.title and "bucket 3" in ins.title
    found = group_rules(ctx)
    rules = {i.rule for i in found}
    assert "bucket_skew" in rules
    assert "comm_dominant" not in rules  # the network is not blamed
    # the straggler finding, if any, names the same rank
    assert all(i.evidence["rank"] == 0 for i in found)


def test_bucket_skew_on_finish():
    # rank 2's collectives finish 5 ms after the others' (starts are even)
    ranks = [make_rank(r, seed=r, end_shift_ms=5.0 if r == 2 else 0.0) for r in range(4)]
    ins = bucket_skew(group(*ranks))
    assert ins is not None
    assert ins.evidence["rank"] == 2
    assert ins.evidence["late_on"] == "finish"


def test_bucket_skew_silent_below_60_percent_of_steps():
    # rank 0 delays bucket 3 on every other step only: last on 50 % of steps
    # (no noise, so chance makes no rank last on the other steps)
    r0 = make_rank(0, seed=10, start_delay_ms={3: 5.0}, noise_ms=0.0)

    def undelay_even_steps(rows: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        return tuple(
            row if i % 2 else tuple(t - (5_000_000 if k == 3 else 0) for k, t in enumerate(row))
            for i, row in enumerate(rows)
        )

    r0 = replace(
        r0,
        bucket_start_ns=undelay_even_steps(r0.bucket_start_ns),
        bucket_end_ns=undelay_even_steps(r0.bucket_end_ns),
    )
    r1 = make_rank(1, seed=11, noise_ms=0.0)
    assert bucket_skew(group(r0, r1)) is None
    # the same delay on every step fires
    assert bucket_skew(group(make_rank(0, seed=10, start_delay_ms={3: 5.0}, noise_ms=0.0), r1))


def test_bucket_skew_silent_on_sub_millisecond_lateness():
    # rank 0 always last on bucket 3, but by 0.3 ms: alignment error, not skew
    ranks = [
        make_rank(0, seed=10, start_delay_ms={3: 0.3}, noise_ms=0.05),
        make_rank(1, seed=11, noise_ms=0.05),
    ]
    assert bucket_skew(group(*ranks)) is None


def test_straggler_hides_bucket_skew_over_all_its_buckets():
    ctx = torchrun_straggler()
    ins = bucket_skew(ctx)  # rank 1 launches every bucket late
    assert ins is not None and ins.evidence["rank"] == 1
    assert len(ins.evidence["late_buckets"]) >= 3 and ins.evidence["lateness_share"] < 0.5
    assert "bucket_skew" not in {i.rule for i in group_rules(ctx)}


def test_one_late_bucket_is_its_own_finding_beside_the_straggler_it_makes():
    # rank 0 sleeps 30 ms right before its last bucket (as the torchrun test's
    # hook does) and is 2 ms late on two other buckets from CPU contention: the
    # straggler rule fires (its backward is 30 ms longer) and the one late
    # bucket stays a finding of its own
    last = BUCKETS - 1
    slow = make_rank(0, seed=20, comm_ms=5.0, start_delay_ms={1: 2.0, 2: 2.0, last: 30.0})
    slow = dataclasses.replace(slow, backward_ms=tuple(b + 30.0 for b in slow.backward_ms))
    ranks = [slow, make_rank(1, seed=21, backward_ms=40.0, comm_ms=35.0)]
    found = {i.rule: i for i in group_rules(group(*ranks))}
    assert found["straggler_rank"].evidence["rank"] == 0
    skew = found["bucket_skew"].evidence
    assert (skew["rank"], skew["bucket"]) == (0, last)
    assert skew["late_buckets"] == [last] and skew["lateness_share"] > 0.8


def test_a_single_bucket_skew_is_the_straggler_itself():
    # one bucket: the straggler's late bucket says nothing more than it does
    ranks = [
        make_rank(0, seed=30, backward_ms=70.0, comm_ms=5.0),
        make_rank(1, seed=31, backward_ms=40.0, comm_ms=35.0),
    ]
    one = [
        replace(
            r,
            bucket_start_ns=tuple(b[-1:] for b in r.bucket_start_ns),
            bucket_end_ns=tuple(b[-1:] for b in r.bucket_end_ns),
        )
        for r in ranks
    ]
    ctx = group(*one)
    assert bucket_skew(ctx) is not None and bucket_skew(ctx).evidence["buckets"] == 1
    assert [i.rule for i in group_rules(ctx)] == ["straggler_rank"]


# --- rank_skew -------------------------------------------------------------


def test_rank_skew_fires_at_10_percent_naming_the_rank():
    # rank 3 does 10 ms of work outside the collectives (~70 ms steps): ~14 %
    ranks = [make_rank(r, seed=r, extra_step_ms=10.0 if r == 3 else 0.0) for r in range(4)]
    ins = rank_skew(group(*ranks))
    assert ins is not None
    assert ins.evidence["rank"] == 3
    assert "Rank 3" in ins.title
    assert ins.evidence["ratio"] >= 1.10


def test_rank_skew_needs_slow_steps_step_after_step():
    # rank 3 is 15 ms slower on 3 steps of 5 (a median 20 % above the others')
    # and like them on the rest: lockstep noise, not a rank that does more work
    ranks = [make_rank(r, seed=r) for r in range(4)]
    slow = {i for i in range(STEPS) if i % 5 < 3}
    ranks[3] = replace(ranks[3], step_ms=_every(ranks[3].step_ms, slow, 15.0))
    assert rank_skew(group(*ranks)) is None
    ranks[3] = replace(
        ranks[3], step_ms=_every(make_rank(3, seed=3).step_ms, set(range(STEPS)), 15.0)
    )
    ins = rank_skew(group(*ranks))
    assert ins is not None and ins.evidence["rank"] == 3 and ins.evidence["slower_share"] == 1.0


def test_rank_skew_needs_a_millisecond():
    # 3 ms steps, rank 1 0.6 ms (20 %) slower on every step: under a scheduling tick
    def pair(fast: float, slow: float) -> GroupContext:
        jitter = [0.01 * (i % 7) for i in range(STEPS)]
        return group(
            RankStats(0, tuple(fast + j for j in jitter)),
            RankStats(1, tuple(slow + j for j in jitter)),
        )

    assert rank_skew(pair(3.0, 3.6)) is None
    ins = rank_skew(pair(6.0, 7.2))  # 1.2 ms, 20 %
    assert ins is not None and ins.evidence["rank"] == 1


def test_rank_skew_silent_at_5_percent():
    ranks = [make_rank(r, seed=r, extra_step_ms=3.5 if r == 3 else 0.0) for r in range(4)]
    assert rank_skew(group(*ranks)) is None


def test_insights_serialise():
    for ins in group_rules(torchrun_straggler()) + group_rules(delayed_bucket_pair()):
        d = ins.to_dict()
        assert d["rule"] and d["title"] and d["fix"]
