"""The daemon's evidence requests (gpuprofd.services.evidence): one pending
at a time and re-sent until the shim answers, one per rule per run, the
budget, and what a refusal means for later passes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpuprof.insights import Insight
from gpuprofd.services.evidence import EvidencePlanner

SEC = 10**9
RUN = {"id": 3, "start_mono_ns": 0}


def ctx(n: int = 200, ms: float = 5.0) -> Any:
    return SimpleNamespace(step_ms=tuple([ms] * n), numbers=tuple(range(n)), traced_step_numbers=())


def found(*rules: str) -> list[Insight]:
    return [Insight(r, "MED", "t", "d", "f", {}) for r in rules]


class Clock:
    def __init__(self, s: float) -> None:
        self.ns = int(s * SEC)

    def __call__(self) -> int:
        return self.ns


def test_one_request_pending_and_resent_until_answered():
    planner = EvidencePlanner(clock=Clock(60))
    req = planner.after_pass(RUN, found("low_mfu", "kernel_drift"), ctx())
    assert req is not None and req.rule == "low_mfu"
    assert planner.after_pass(RUN, found("low_mfu", "kernel_drift"), ctx()) is None  # one at a time
    assert planner.reply(3, None) == req.to_wire()
    assert planner.reply(3, {"id": "other", "state": "taken"}) == req.to_wire()  # not its answer
    assert planner.reply(3, {"id": req.id, "state": "taken", "cost_ns": 70 * 10**6}) is None
    assert planner.runs[3].used_ms == 70.0
    nxt = planner.after_pass(RUN, found("low_mfu", "kernel_drift"), ctx())
    assert nxt is not None and nxt.rule == "kernel_drift"  # low_mfu had its window
    assert planner.reply(99, None) is None  # a run it never asked


def test_nothing_asked_for_findings_an_op_view_does_not_explain():
    planner = EvidencePlanner(clock=Clock(60))
    assert planner.after_pass(RUN, found("dataloader_stall"), ctx()) is None
    assert planner.reply(3, None) is None


def test_nothing_asked_before_the_budget_covers_a_window():
    clock = Clock(5)  # 1 % of 5 s = 50 ms < 4 x 5 ms + 45 ms
    planner = EvidencePlanner(clock=clock)
    assert planner.after_pass(RUN, found("low_mfu"), ctx()) is None
    clock.ns = 7 * SEC  # 70 ms >= 65 ms
    assert planner.after_pass(RUN, found("low_mfu"), ctx()) is not None


def test_a_budget_refusal_is_asked_again_once_the_budget_covers_it():
    clock = Clock(10)
    planner = EvidencePlanner(clock=clock)
    req = planner.after_pass(RUN, found("low_mfu"), ctx())
    assert req is not None
    report = {"id": req.id, "state": "refused", "why": "over", "need_ns": 150 * 10**6}
    assert planner.reply(3, report) is None
    clock.ns = 14 * SEC  # the shim needs 150 ms: 15 s of run
    assert planner.after_pass(RUN, found("low_mfu"), ctx()) is None
    clock.ns = 16 * SEC
    again = planner.after_pass(RUN, found("low_mfu"), ctx())
    assert again is not None and again.id != req.id


def test_a_refusal_without_a_need_is_final():
    planner = EvidencePlanner(clock=Clock(60))
    req = planner.after_pass(RUN, found("low_mfu"), ctx())
    assert req is not None
    planner.reply(3, {"id": req.id, "state": "refused", "why": "auto_evidence=False"})
    assert planner.after_pass(RUN, found("low_mfu"), ctx()) is None
    assert planner.runs[3].refused == [("low_mfu", "auto_evidence=False")]
    planner.forget(3)
    assert 3 not in planner.runs
