"""Contended steps, the run's measurement validity, and its place in the evidence."""

from __future__ import annotations

from gpuprof.insights import TIMING_RULES, run_rules
from gpuprof.insights.contention import contended, contended_share, measured_under_contention

from .conftest import make_ctx


def _ctx(host, others, **kw):
    n = len(host)
    kw.setdefault("cpu_count", 2)
    return make_ctx(
        kw.pop("step_ms", [10.0] * n),
        kw.pop("wait_ms", [0.0] * n),
        step_host_pct=tuple(host),
        step_other_cores=tuple(others),
        step_own_cores=tuple([0.5] * n),
        **kw,
    )


def test_a_step_is_contended_when_the_host_is_full_and_others_hold_half_a_core():
    ctx = _ctx([100.0, 100.0, 60.0, 95.0, None], [0.9, 0.3, 1.5, 0.5, None])
    assert contended(ctx) == (True, False, False, True, None)
    assert contended_share(ctx) == 0.5  # of the 4 sampled steps


def test_measured_under_contention_needs_a_tenth_of_the_steps():
    hit = _ctx([100.0] * 2 + [30.0] * 18, [1.4] * 2 + [0.1] * 18)
    assert measured_under_contention(hit) == {
        "share_of_steps": 0.1,
        "other_cores": 1.4,
        "cpu_count": 2,
    }
    miss = _ctx([100.0] * 1 + [30.0] * 19, [1.4] * 1 + [0.1] * 19)
    assert measured_under_contention(miss) is None
    assert measured_under_contention(make_ctx([10.0] * 20)) is None  # unsampled


def test_timing_findings_carry_it_in_their_evidence_and_others_do_not():
    n = 20
    ctx = _ctx([100.0] * n, [1.2] * n, step_ms=[50.0] * n, wait_ms=[50.0] * n)
    found = {i.rule: i for i in run_rules(ctx)}
    stall = found["dataloader_stall"]
    assert stall.evidence["measured_under_contention"]["share_of_steps"] == 1.0
    assert "dataloader_stall" in TIMING_RULES
    assert "measured_under_contention" not in found["estimated_cost"].evidence
    quiet = _ctx([30.0] * n, [0.1] * n, step_ms=[50.0] * n, wait_ms=[50.0] * n)
    assert "measured_under_contention" not in {k for i in run_rules(quiet) for k in i.evidence}
