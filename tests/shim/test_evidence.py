"""Evidence windows in the shim (gpuprof_shim.trace.evidence and the
Tracer's evidence windows): the slot between the resend thread and the
training thread, windows opened only between steps, the budget, the switch,
and the whole path from an ``ack`` reply to a ``kernels`` event on a real
CPU torch loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gpuprof
from gpuprof.evidence import WINDOW_OVERHEAD_MS, EvidenceRequest
from gpuprof_shim.trace import evidence as slot_mod
from gpuprof_shim.trace.evidence import EvidenceSlot
from gpuprof_shim.trace.options import TraceOptions
from gpuprof_shim.trace.windows import Tracer

from .training import train

SEC = 10**9


def request(rid: str = "r1", rule: str = "high_step_variance", **kw: Any) -> dict[str, Any]:
    return EvidenceRequest(rid, rule, **kw).to_wire()


class Clock:
    def __init__(self, t: int = 0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


# --- the slot ----------------------------------------------------------------------


def test_a_request_is_due_at_the_next_boundary_and_taken_once():
    slot = EvidenceSlot(True, 0, Clock(1000 * SEC))
    slot.offer(request(steps=2))
    got = slot.due(7, 5_000_000)
    assert got is not None and (got.id, got.steps) == ("r1", 2)
    assert slot.due(8, 5_000_000) is None  # handed out once
    slot.offer(request(steps=2))  # the daemon re-sends it until it hears back
    assert slot.due(9, 5_000_000) is None
    slot.done(got, 80_000_000)
    assert slot.report() == {"id": "r1", "state": "taken", "cost_ns": 80_000_000}
    assert slot.used_ns == 80_000_000


def test_malformed_requests_are_counted_and_ignored():
    slot = EvidenceSlot(True, 0, Clock(1000 * SEC))
    for bad in ("x", {"id": "r1"}, request(steps=0), request(rid="a b"), {**request(), "every": 5}):
        slot.offer(bad)
    assert slot.malformed == 5
    assert slot.due(1, 1) is None and slot.report() is None
    slot.offer(None)  # an ack reply without a request
    assert slot.malformed == 5


def test_auto_evidence_off_refuses_every_request():
    slot = EvidenceSlot(False, 0, Clock(1000 * SEC))
    slot.offer(request())
    assert slot.due(1, 1) is None
    assert slot.report() == {"id": "r1", "state": "refused", "why": "auto_evidence=False"}


def test_one_window_per_rule():
    slot = EvidenceSlot(True, 0, Clock(1000 * SEC))
    slot.offer(request("r1"))
    first = slot.due(1, 1)
    assert first is not None
    slot.done(first, 1)
    slot.offer(request("r2"))  # the same rule, a new id (a restarted daemon)
    assert slot.due(2, 1) is None
    assert slot.report()["state"] == "refused"  # type: ignore[index]
    slot.offer(request("r3", rule="low_mfu"))  # another rule is fine
    assert slot.due(3, 1) is not None


def test_a_window_past_the_budget_is_refused_with_what_it_needs():
    clock = Clock(10 * SEC)  # 10 s into the run: 1 % is 100 ms
    slot = EvidenceSlot(True, 0, clock)
    slot.offer(request("r1", steps=4))
    assert slot.due(5, 20_000_000) is None  # 4 x 20 ms + 45 ms = 125 ms > 100 ms
    need = 4 * 20_000_000 + int(WINDOW_OVERHEAD_MS * 1e6)
    assert slot.report() == {
        "id": "r1",
        "state": "refused",
        "why": "over the 1% budget",
        "need_ns": need,
    }
    assert "evidence window for high_step_variance not taken" in slot.notes()[0]
    clock.t = 20 * SEC  # 200 ms of budget now
    slot.offer(request("r2", steps=4))
    assert slot.due(6, 20_000_000) is not None
    assert slot.notes() == []  # taken in the end: nothing to say


def test_windows_taken_count_against_the_budget():
    slot = EvidenceSlot(True, 0, Clock(20 * SEC))  # 200 ms
    slot.offer(request("r1", steps=1))
    got = slot.due(1, 10_000_000)
    assert got is not None
    slot.done(got, 150_000_000)  # it took 150 ms
    slot.offer(request("r2", rule="low_mfu", steps=1))
    assert slot.due(2, 10_000_000) is None  # 150 + 55 > 200
    assert slot.report()["state"] == "refused"  # type: ignore[index]


def test_a_periodic_request_waits_for_its_slow_step():
    slot = EvidenceSlot(True, 0, Clock(1000 * SEC))
    slot.offer(request(steps=1, at_step=45, every=20))
    assert [s for s in range(40, 90) if slot.due(s, 1) is None][:5] == [40, 41, 42, 43, 44]
    slot2 = EvidenceSlot(True, 0, Clock(1000 * SEC))
    slot2.offer(request(steps=1, at_step=45, every=20))
    # the shim is already past step 45: the next one on the lattice, 65
    assert [s for s in range(50, 90) if slot2.due(s, 1) is not None] == [65]


# --- the fold's CPU time (a CPU-only run's evidence window) ---------------------------


def test_cpu_time_fold_gives_operators_their_self_cpu_time():
    from gpuprof_shim.trace.fold import fold_kineto

    from .test_trace import FakeEvent

    ev = [
        FakeEvent("aten::linear", start=0, end=100, corr=1),
        FakeEvent("aten::addmm", start=10, end=70, corr=2, flops=10),
        FakeEvent("aten::t", start=75, end=80, corr=3),
        FakeEvent("aten::mm", start=200, end=500, corr=4, flops=99),
    ]
    got = {r.name: (r.count, r.total_ns, r.self_ns) for r in fold_kineto(ev, "cpu", True)[0]}
    assert got == {
        "aten::linear": (1, 100, 35),  # less addmm's 60 and t's 5
        "aten::addmm": (1, 60, 60),
        "aten::t": (1, 5, 5),
        "aten::mm": (1, 300, 300),
    }
    # without it (the trace modes): device time only, FLOP-carrying ops kept at zero
    plain = {r.name: r.total_ns for r in fold_kineto(ev, "cpu")[0]}
    assert plain == {"aten::addmm": 0, "aten::mm": 0}


# --- the Tracer: windows open only between steps -------------------------------------


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_request_arriving_mid_step_opens_at_the_next_boundary_and_names_the_op():
    """The resend thread hands the request over while a step runs: the
    profiler starts only at the next boundary, covers the asked steps, and
    the window (CPU time on a CPU run) names the large matmul in them."""
    sent: list[dict[str, Any]] = []
    slot = EvidenceSlot(True, 0, time.monotonic_ns)  # uptime: the budget is no limit
    tracer = Tracer(
        TraceOptions(),
        run_key="k" * 16,
        run_name="t",
        send=lambda m: sent.append(dict(m)) or True,
        clock=time.monotonic_ns,
        evidence=slot,
    )
    tracer.open()
    assert tracer._guard is not None  # torch is imported: the guard sees the user's profiler
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    running_mid_step = []
    a, b = torch.randn(384, 384), torch.randn(384, 384)  # made outside the window
    try:
        for i in range(8):
            tracer.boundary(i)
            out = model(torch.randn(8, 32)).square().mean()
            if i == 2:  # mid-step, from another thread (as the resend thread does)
                t = threading.Thread(target=slot.offer, args=(request(steps=2),))
                t.start()
                t.join()
                running_mid_step.append(tracer.running)
            if i in (3, 4):  # the slow work the window should name
                a @ b
            out.backward()
            opt.step()
            opt.zero_grad()
            if i == 3:
                running_mid_step.append(tracer.running)
        tracer.boundary(8)
    finally:
        tracer.close()
    assert running_mid_step == [False, True]
    assert not torch._C._autograd._profiler_enabled()
    (msg,) = [m for m in sent if m["type"] == "kernels"]
    assert msg["source"] == "evidence" and msg["steps"] == [3, 4]
    assert msg["evidence"] == {"id": "r1", "rule": "high_step_variance", "time": "cpu"}
    ops = sorted((r for r in msg["rows"] if r[1] == "op"), key=lambda r: -r[5])
    assert ops[0][0] == "aten::mm" and ops[0][5] > 0  # its self CPU time, ns
    assert slot.report()["state"] == "taken"  # type: ignore[index]
    assert tracer.traced(msg["t0"], msg["t1"])


def test_a_request_while_the_users_scheduled_profiler_warms_up_is_refused():
    """The user's profiler prepared (its schedule's warm-up: Kineto set up,
    not yet recording) when a request comes: no second Kineto session starts
    (torch crashes on two), the request is refused, the user's profile works."""
    slot = EvidenceSlot(True, 0, time.monotonic_ns)
    sent: list[dict[str, Any]] = []
    tracer = Tracer(
        TraceOptions(),
        run_key="k" * 16,
        run_name="t",
        send=lambda m: sent.append(dict(m)) or True,
        clock=time.monotonic_ns,
        evidence=slot,
    )
    tracer.open()
    model = Model()
    sched = torch.profiler.schedule(wait=0, warmup=3, active=1, repeat=1)
    try:
        with torch.profiler.profile(schedule=sched) as user:
            for i in range(5):
                tracer.boundary(i)
                if i == 1:
                    slot.offer(request())
                model(torch.randn(4, 32)).sum().backward()
                user.step()
        tracer.boundary(5)
    finally:
        tracer.close()
    assert sent == []
    assert slot.report() == {
        "id": "r1",
        "state": "refused",
        "why": "your own torch.profiler was active",
    }
    assert any(e.key == "aten::linear" for e in user.key_averages())


def test_manual_mode_window_covers_its_steps_and_not_the_next():
    """Manual mode (``prof.step(i)``): the window opens before the step the
    request is due at and closes after its last step."""
    sent: list[dict[str, Any]] = []
    slot = EvidenceSlot(True, 0, time.monotonic_ns)
    tracer = Tracer(
        TraceOptions(),
        run_key="k" * 16,
        run_name="t",
        send=lambda m: sent.append(dict(m)) or True,
        clock=time.monotonic_ns,
        evidence=slot,
    )
    slot.offer(request(steps=3, at_step=20))
    running = {}
    try:
        for i in range(0, 60, 10):  # a loop that numbers its steps 0, 10, 20, ...
            tracer.start_window(i)
            running[i] = tracer.running
            torch.randn(64, 64) @ torch.randn(64, 64)
            tracer.after_step(i)
    finally:
        tracer.close()
    assert running == {0: False, 10: False, 20: True, 30: True, 40: True, 50: False}
    (msg,) = [m for m in sent if m["type"] == "kernels"]
    assert msg["steps"] == [20, 30, 40]  # the loop's own numbers


# --- the whole path: ack replies to a kernels event -------------------------------------


def _run_until(prof_kw: dict[str, Any], socket_dir: Path, make_daemon, stop) -> Any:
    req = request("abc123", steps=2)
    holder: dict[str, Any] = {}

    def ack_reply(msg: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "acked": holder["d"].last_seq, "evidence": req}

    daemon = make_daemon(
        hello_reply=lambda m: {
            "ok": True,
            "run_id": 7,
            "db": "x.db",
            "daemon_pid": 1,
            "notes": [],
            "acked": 0,
        },
        ack_reply=ack_reply,
    )
    holder["d"] = daemon
    deadline = time.monotonic() + 60

    def on_step(i: int) -> None:
        time.sleep(0.005)
        if stop(daemon) or time.monotonic() > deadline:
            raise StopIteration

    with gpuprof.profile(
        "ev",
        socket_dir=socket_dir,
        autostart=False,
        print_summary=False,
        count_flops=False,
        **prof_kw,
    ):
        try:
            train(100_000, on_step=on_step)
        except StopIteration:
            pass
    return daemon


def _evidence_windows(daemon) -> list[dict[str, Any]]:
    return [m for m in daemon.data if m["type"] == "kernels" and m["source"] == "evidence"]


def _reports(daemon) -> list[dict[str, Any]]:
    return [m["evidence"] for m in daemon.of_type("ack") if "evidence" in m]


def test_a_request_on_the_ack_reply_takes_one_window(socket_dir, make_daemon, monkeypatch):
    monkeypatch.setattr(slot_mod, "BUDGET_SHARE", 1.0)  # no wait for the run's 1 %
    daemon = _run_until({}, socket_dir, make_daemon, lambda d: len(_reports(d)) >= 3)
    (window,) = _evidence_windows(daemon)  # re-sent on every ack: still one window
    assert window["evidence"]["id"] == "abc123" and len(window["steps"]) == 2
    assert {r["state"] for r in _reports(daemon)} == {"taken"}
    traced = {s["i"] for s in daemon.steps if s.get("traced")}
    assert set(window["steps"]) <= traced


def test_auto_evidence_false_takes_no_window(socket_dir, make_daemon, monkeypatch):
    monkeypatch.setattr(slot_mod, "BUDGET_SHARE", 1.0)
    daemon = _run_until(
        {"auto_evidence": False}, socket_dir, make_daemon, lambda d: len(_reports(d)) >= 3
    )
    assert _evidence_windows(daemon) == []
    assert {r["state"] for r in _reports(daemon)} == {"refused"}
    assert not any(s.get("traced") for s in daemon.steps)


@pytest.mark.parametrize("auto_evidence", [True, False])
def test_without_an_acking_daemon_nothing_is_asked(socket_dir, fake_daemon, auto_evidence):
    with gpuprof.profile(
        "ev",
        socket_dir=socket_dir,
        autostart=False,
        print_summary=False,
        count_flops=False,
        auto_evidence=auto_evidence,
    ) as prof:
        train(5)
    assert prof._evidence is None and prof._windows is None
