"""The pure group-context builder: stored per-rank rows -> GroupContext
(common steps, traced steps, bucket sets, clock alignment), and the group
rules on what it builds."""

from __future__ import annotations

import pytest

from gpuprof.insights.distributed import group_rules
from gpuprof.insights.group_context import (
    RankRows,
    build_group_context,
    clock_shifts,
    common_steps,
)
from tests.gpuprof.insights.group_fixtures import (
    BWD_NS,
    MS,
    N_BUCKETS,
    group_steps,
    rank_rows,
)

SECOND = 1_000_000_000


def _rules(rows: list[RankRows]) -> dict[str, dict]:
    return {i.rule: dict(i.evidence) for i in group_rules(build_group_context("g", rows))}


def test_balanced_ranks_give_no_group_finding():
    for n in (2, 4):
        assert _rules(rank_rows(group_steps(n))) == {}


def test_a_late_bucket_is_named_with_its_rank():
    rows = rank_rows(group_steps(4, late_bucket=(2, 1, 5 * MS)))
    found = _rules(rows)
    assert set(found) == {"bucket_skew"}
    ev = found["bucket_skew"]
    assert (ev["rank"], ev["bucket"], ev["late_on"]) == (2, 1, "start")
    assert ev["p95_delta_ms"] == pytest.approx(5.0, abs=0.5)
    assert ev["late_buckets"] == [1]


def test_a_slow_backward_is_a_straggler_not_the_network():
    rows = rank_rows(group_steps(4, slow_backward={1: 30 * MS}))
    found = _rules(rows)
    assert "straggler_rank" in found and found["straggler_rank"]["rank"] == 1
    assert "comm_dominant" not in found  # the others wait for rank 1: not the network
    assert "bucket_skew" not in found  # every bucket late: the straggler's backward


def test_per_step_figures_come_from_the_phases():
    rows = rank_rows(group_steps(2, n_steps=5, slow_backward={1: 10 * MS}))
    ctx = build_group_context("g", rows)
    r0, r1 = ctx.ranks
    assert (r0.rank, r1.rank) == (0, 1)
    assert len(r0.step_ms) == len(r0.backward_ms) == len(r0.comm_ms) == 5
    # the straggler's backward holds its own compute; the other rank waits in comm
    assert r1.backward_ms[2] == pytest.approx((BWD_NS + 10 * MS) / MS, abs=0.3)
    assert r0.comm_ms[2] == pytest.approx(12.0, abs=0.5)
    assert r1.comm_ms[2] == pytest.approx(2.0, abs=0.5)
    assert len(r0.bucket_start_ns) == 5 and len(r0.bucket_start_ns[0]) == N_BUCKETS
    assert all(
        a <= b
        for s, e in zip(r0.bucket_start_ns, r0.bucket_end_ns, strict=True)
        for a, b in zip(s, e, strict=True)
    )


def test_only_steps_every_rank_has_and_no_traced_step():
    steps = group_steps(2, n_steps=8)
    steps[0] = steps[0][:7]  # rank 0 never sent step 7
    steps[1][3]["traced"] = True  # a profiler snapshot ran in rank 1's step 3
    rows = rank_rows(steps)
    assert common_steps(rows) == [0, 1, 2, 4, 5, 6]
    ctx = build_group_context("g", rows)
    assert all(len(r.step_ms) == 6 and len(r.bucket_start_ns) == 6 for r in ctx.ranks)


def test_a_run_without_comm_data_has_no_comm_figures():
    steps = group_steps(2, n_steps=4)
    for s in steps[1]:
        del s["comm"]
        del s["phases"]["comm"]
    r0, r1 = build_group_context("g", rank_rows(steps)).ranks
    assert r0.comm_ms and not r1.comm_ms
    # one rank timed: nothing to compare buckets against
    assert r0.bucket_start_ns == () and r1.bucket_start_ns == ()


def test_steps_with_another_bucket_set_are_left_out():
    steps = group_steps(2, n_steps=6)
    for r in (0, 1):  # DDP rebuilds buckets after the first iteration: 3 then 4
        steps[r][0]["comm"] = steps[r][0]["comm"][:3]
    steps[1][4]["comm"] = steps[1][4]["comm"][1:]  # one rank lost a bucket row in step 4
    ctx = build_group_context("g", rank_rows(steps))
    for r in ctx.ranks:
        assert len(r.step_ms) == 6
        assert len(r.bucket_start_ns) == 4  # steps 1, 2, 3, 5
        assert {len(b) for b in r.bucket_start_ns} == {N_BUCKETS}


def test_hosts_differing_are_aligned_by_their_clock_offsets():
    # rank 1's clock runs 5 s ahead of rank 0's; otherwise the ranks are balanced
    steps = group_steps(2, clock_shift={1: 5 * SECOND})
    same_host = rank_rows(steps)  # as if both shared one clock: 5 s "late"
    found = _rules(same_host)
    assert found["bucket_skew"]["rank"] == 1
    aligned = rank_rows(steps, hosts={0: "node-a", 1: "node-b"}, offsets={1: 5 * SECOND})
    assert clock_shifts(aligned) == {0: 0, 1: 5 * SECOND}
    assert _rules(aligned) == {}
    ctx = build_group_context("g", aligned)
    r0, r1 = ctx.ranks
    assert abs(r1.bucket_start_ns[3][0] - r0.bucket_start_ns[3][0]) < 1 * MS


def test_offsets_are_not_applied_on_one_host():
    rows = rank_rows(group_steps(2), offsets={1: 5 * SECOND})
    assert clock_shifts(rows) == {0: 0, 1: 0}
    assert _rules(rows) == {}


def test_a_rank_on_another_host_without_an_offset_is_not_compared():
    steps = group_steps(3, clock_shift={2: 5 * SECOND})
    rows = rank_rows(steps, hosts={0: "a", 1: "a", 2: "b"})
    assert clock_shifts(rows) == {0: 0, 1: 0, 2: None}
    ctx = build_group_context("g", rows)
    assert [bool(r.bucket_start_ns) for r in ctx.ranks] == [True, True, False]
    assert _rules(rows) == {}
    # a host's offset is its ranks' (one clock): rank 3 borrows rank 2's
    rows = rank_rows(
        group_steps(4, clock_shift={2: 5 * SECOND, 3: 5 * SECOND}),
        hosts={0: "a", 1: "a", 2: "b", 3: "b"},
        offsets={2: 5 * SECOND},
    )
    assert clock_shifts(rows) == {0: 0, 1: 0, 2: 5 * SECOND, 3: 5 * SECOND}
    assert _rules(rows) == {}


def test_no_ranks_or_no_common_steps():
    assert build_group_context("g", []).ranks == ()
    steps = group_steps(2, n_steps=4)
    steps[1] = []  # rank 1 sent no step
    ctx = build_group_context("g", rank_rows(steps))
    assert all(r.step_ms == () for r in ctx.ranks)
    assert group_rules(ctx) == []
