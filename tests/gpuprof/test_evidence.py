"""gpuprof.evidence: requests and their wire checks, scheduling (one per
rule, the budget, the periodic slow step), the protocol's fields, and the
window's top rows attached to a finding."""

from __future__ import annotations

import pytest

from gpuprof.evidence import (
    DEFAULT_STEPS,
    WINDOW_OVERHEAD_MS,
    EvidenceRequest,
    attach,
    parse_request,
    plan,
    report_problem,
    summary_lines,
    tag_problem,
    top_rows,
    within_budget,
)
from gpuprof.insights import Insight
from gpuprof.kernels import KernelAgg
from gpuprof.protocol import PROTOCOL_VERSION, ProtocolError, decode, encode


def finding(rule: str, **evidence) -> Insight:
    return Insight(rule, "MED", "t", "d", "f", evidence)


def plan_for(findings, asked=(), **kw):
    args = {
        "request_id": "req1",
        "step_ms": 5.0,
        "slow_step_ms": 50.0,
        "latest_step": 300,
        "elapsed_s": 60.0,
        "used_ms": 0.0,
    }
    args.update(kw)
    return plan(findings, asked, **args)


# --- requests on the wire ----------------------------------------------------------


def test_request_round_trips():
    req = EvidenceRequest("a-1_B", "kernel_drift", 3, 40, 20)
    assert parse_request(req.to_wire()) == req
    assert parse_request(EvidenceRequest("x", "low_mfu").to_wire()) == EvidenceRequest(
        "x", "low_mfu", DEFAULT_STEPS
    )


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"id": "x", "rule": "low_mfu"},  # no steps
        {"id": "x y", "rule": "low_mfu", "steps": 1},
        {"id": "x" * 65, "rule": "low_mfu", "steps": 1},
        {"id": "x", "rule": "Low MFU", "steps": 1},
        {"id": "x", "rule": "low_mfu", "steps": 0},
        {"id": "x", "rule": "low_mfu", "steps": 65},
        {"id": "x", "rule": "low_mfu", "steps": True},
        {"id": "x", "rule": "low_mfu", "steps": 1, "at_step": -1},
        {"id": "x", "rule": "low_mfu", "steps": 1, "at_step": 1.5},
        {"id": "x", "rule": "low_mfu", "steps": 1, "every": 5},  # every needs at_step
        {"id": "x", "rule": "low_mfu", "steps": 1, "at_step": 3, "every": 0},
    ],
)
def test_malformed_requests_parse_to_none(bad):
    assert parse_request(bad) is None


def test_due_with_and_without_a_period():
    assert EvidenceRequest("x", "r").due(0)
    assert [s for s in range(10) if EvidenceRequest("x", "r", 1, 6).due(s)] == [6, 7, 8, 9]
    assert [s for s in range(30) if EvidenceRequest("x", "r", 1, 25, 10).due(s)] == [5, 15, 25]


def test_report_and_tag_checks():
    assert report_problem({"id": "x", "state": "taken", "cost_ns": 5}) is None
    assert report_problem({"id": "x", "state": "refused", "why": "over", "need_ns": 9}) is None
    assert report_problem({"id": "x", "state": "lost"}) == "bad state"
    assert report_problem({"id": "x", "state": "taken", "cost_ns": -1}) == "bad cost_ns"
    assert report_problem({"id": "x", "state": "refused", "why": "a\x1bb"}) == "bad why"
    assert report_problem({"id": "x", "state": "taken", "extra": 1}) is not None
    assert tag_problem({"id": "x", "rule": "low_mfu"}) is None
    assert tag_problem({"id": "x", "rule": "low_mfu", "time": "cpu"}) is None
    assert tag_problem({"id": "x", "rule": "low_mfu", "time": "wall"}) == "bad time"
    assert tag_problem({"id": "x"}) is not None


# --- the protocol --------------------------------------------------------------------


def kernels_msg(**kw):
    msg = {
        "v": PROTOCOL_VERSION,
        "type": "kernels",
        "run_key": "abc123",
        "t0": 10,
        "t1": 20,
        "source": "evidence",
        "steps": [3, 4],
        "rows": [["aten::mm", "op", "compute", 2, 900, 800, 1e9]],
        "evidence": {"id": "r1", "rule": "high_step_variance", "time": "cpu"},
    }
    msg.update(kw)
    return {k: v for k, v in msg.items() if v is not None}


def test_protocol_accepts_an_evidence_window_and_an_ack_with_a_report():
    assert decode(encode(kernels_msg()))["evidence"]["rule"] == "high_step_variance"
    ack = {
        "v": PROTOCOL_VERSION,
        "type": "ack",
        "run_key": "abc123",
        "evidence": {"id": "r1", "state": "taken", "cost_ns": 12},
    }
    assert decode(encode(ack), channel="control")["evidence"]["state"] == "taken"


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (kernels_msg(evidence=None), "bad_field:evidence"),  # source evidence, no tag
        (kernels_msg(source="snapshot"), "bad_field:evidence"),  # a tag on another source
        (kernels_msg(evidence={"id": "r 1", "rule": "x"}), "bad_field:evidence"),
    ],
)
def test_protocol_rejects_bad_evidence_windows(msg, reason):
    with pytest.raises(ProtocolError) as err:
        decode(encode(msg))
    assert err.value.reason == reason


def test_protocol_rejects_a_bad_report_on_an_ack():
    ack = {"v": PROTOCOL_VERSION, "type": "ack", "run_key": "abc123", "evidence": {"id": "r1"}}
    with pytest.raises(ProtocolError) as err:
        decode(encode(ack), channel="control")
    assert err.value.reason == "bad_field:evidence"


# --- scheduling ------------------------------------------------------------------------


def test_plan_asks_the_next_steps_for_a_rule_an_op_view_explains():
    req = plan_for([finding("dataloader_stall"), finding("kernel_launch_overhead")])
    assert req == EvidenceRequest("req1", "kernel_launch_overhead", DEFAULT_STEPS)


def test_plan_asks_nothing_for_rules_an_op_view_does_not_explain():
    assert plan_for([finding("dataloader_stall"), finding("cold_cache")]) is None


def test_plan_one_per_rule_per_run():
    found = [finding("low_mfu"), finding("kernel_drift")]
    assert plan_for(found).rule == "low_mfu"  # type: ignore[union-attr]
    assert plan_for(found, asked={"low_mfu"}).rule == "kernel_drift"  # type: ignore[union-attr]
    assert plan_for(found, asked={"low_mfu", "kernel_drift"}) is None


def test_plan_waits_for_the_next_slow_step_of_a_periodic_pattern():
    f = finding("high_step_variance", period_steps=20, slow_step_numbers=[45, 65, 85, 105])
    req = plan_for([f], latest_step=117)
    # slow steps are 5 mod 20: the next after 117 is 125, one step
    assert req == EvidenceRequest("req1", "high_step_variance", 1, 125, 20)
    # a loaded host adds slow steps off the pattern: the phase is the one most share
    noisy = finding("high_step_variance", period_steps=20, slow_step_numbers=[45, 46, 65, 85, 99])
    assert plan_for([noisy], latest_step=117).at_step == 125  # type: ignore[union-attr]
    irregular = finding("high_step_variance", period_steps=None, slow_step_numbers=[45, 71])
    assert plan_for([irregular]).steps == DEFAULT_STEPS  # type: ignore[union-attr]


def test_plan_keeps_to_the_budget():
    f = [finding("low_mfu")]
    cost = DEFAULT_STEPS * 5.0 + WINDOW_OVERHEAD_MS  # 65 ms
    assert plan_for(f, elapsed_s=cost / 10.0 - 0.1) is None  # 1 % of 6.4 s < 65 ms
    assert plan_for(f, elapsed_s=cost / 10.0 + 0.1) is not None
    assert plan_for(f, elapsed_s=60.0, used_ms=560.0) is None  # 560 + 65 > 600
    assert within_budget(10.0, 0.0, 1.0)
    assert not within_budget(10.1, 0.0, 1.0)


# --- attaching -------------------------------------------------------------------------

ROWS = [
    KernelAgg("aten::linear", "op", "compute", 4, 9_000_000, 100_000),
    KernelAgg("aten::mm", "op", "compute", 2, 8_000_000, 8_000_000, 1e9),
    KernelAgg("aten::addmm", "op", "compute", 4, 900_000, 800_000),
    KernelAgg("(other)", "op", "compute", 9, 5_000_000, 5_000_000),
]


def test_top_rows_rank_ops_by_self_time():
    top = top_rows(ROWS, 2)
    assert [r["name"] for r in top] == ["aten::mm", "aten::addmm"]
    assert top[0]["self_ms"] == 8.0 and top[0]["share"] == round(8 / 8.9, 3)


def test_attach_puts_the_window_under_its_rules_finding_only():
    window = {
        "rule": "high_step_variance",
        "request_id": "r1",
        "window_id": 12,
        "t0_ns": 5,
        "steps": [120, 121, 122, 123],
        "time": "cpu",
        "rows": ROWS,
    }
    out = attach([finding("high_step_variance", p50_ms=5.0), finding("low_mfu")], [window])
    prof = out[0].evidence["profile"]
    assert prof["window_id"] == 12 and prof["time"] == "cpu" and prof["steps"][0] == 120
    assert prof["top"][0]["name"] == "aten::mm"
    assert out[0].evidence["p50_ms"] == 5.0
    assert "profile" not in out[1].evidence
    assert summary_lines([window]) == [
        "evidence: a profiler window of steps 120-123 taken for high_step_variance "
        "(top op aten::mm)"
    ]
