"""The stack sampler inside ``gpuprof.profile()``: open between phases,
closed inside them, counts sent as ``stacks`` events, stopped at exit."""

from __future__ import annotations

import inspect
import threading
import time

import pytest
import torch

from gpuprof_shim.auto.machine import StepMachine


class SGD:
    """Stands in for an optimizer in the machine-only test."""


def _gate_and_step_at_each_event() -> list[tuple[str, bool, int]]:
    m = StepMachine(lambda rec: None, 0, clock=lambda: 0)
    opt = SGD()
    seen = [("start", m.between_phases(), m.gap_step())]
    for k in range(2):
        base = 1_000 * (k + 1)
        m.on_forward(base)
        seen.append(("forward", m.between_phases(), m.gap_step()))
        m.on_forward_end(base + 100)
        assert m.on_backward_start(base + 200)
        seen.append(("backward", m.between_phases(), m.gap_step()))
        m.on_backward_end(base + 300)
        seen.append(("after_backward", m.between_phases(), m.gap_step()))
        m.on_optimizer_pre(base + 400, opt)
        seen.append(("optimizer", m.between_phases(), m.gap_step()))
        m.on_optimizer_post(base + 500, opt)
        seen.append(("gap", m.between_phases(), m.gap_step()))
    return seen


def test_the_gate_is_open_only_between_phases_and_names_the_next_step():
    assert _gate_and_step_at_each_event() == [
        ("start", True, 0),
        ("forward", False, 0),
        ("backward", False, 0),
        ("after_backward", True, 0),  # loading between micro-batches: step 0's data phase
        ("optimizer", False, 0),
        ("gap", True, 1),  # step 0 still open (closed lazily): the gap is step 1's wait
        ("forward", False, 1),
        ("backward", False, 1),
        ("after_backward", True, 1),
        ("optimizer", False, 1),
        ("gap", True, 2),
    ]


def _between_steps() -> None:
    time.sleep(0.02)  # the line the samples must name


def _stack_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpuprof-stacks"]


def test_a_loop_sleeping_between_steps_is_sent_as_its_own_line(socket_dir, fake_daemon):
    import gpuprof

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with gpuprof.profile("s", socket_dir=socket_dir, autostart=False) as prof:
        assert len(_stack_threads()) == 1
        # until the sampler caught a sleep (a busy host schedules it late), ≤ 300 steps
        for i in range(300):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            _between_steps()
            if i >= 5 and any(k.call == "time.sleep" for k in list(prof._stacks.counts)):
                break
    assert _stack_threads() == []
    line = inspect.getsourcelines(_between_steps)[1] + 1
    rows = [r for m in fake_daemon.data if m["type"] == "stacks" for r in m["rows"]]
    assert all(m["source"] == "main" for m in fake_daemon.data if m["type"] == "stacks")
    sleeps = [r for r in rows if r[:4] == [__file__, line, "_between_steps", "time.sleep"]]
    assert sleeps, rows
    # each sample counted in the step whose wait it fell in: 1..the last step + 1
    assert {r[4] for r in sleeps} <= set(range(1, i + 2))
    # nothing of the phases: no frame inside forward, backward or the optimizer
    assert not [r for r in rows if r[3].startswith(("torch.nn", "torch.optim", "torch.autograd"))]


def test_stacks_false_starts_no_sampler_and_sends_no_stacks(socket_dir, fake_daemon):
    import gpuprof

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile("s", socket_dir=socket_dir, autostart=False, stacks=False):
        assert _stack_threads() == []
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            time.sleep(0.02)
    assert [m for m in fake_daemon.data if m["type"] == "stacks"] == []


def test_the_sampler_stops_when_the_loop_raises(socket_dir, fake_daemon):
    import gpuprof

    with pytest.raises(KeyError):
        with gpuprof.profile("s", socket_dir=socket_dir, autostart=False, auto=False) as prof:
            with prof.step(0):
                pass
            assert len(_stack_threads()) == 1
            raise KeyError("boom")
    assert _stack_threads() == []
    (bye,) = fake_daemon.of_type("bye")
    assert bye["status"] == "failed"


def test_manual_mode_samples_only_outside_prof_step(socket_dir, fake_daemon):
    import gpuprof

    with gpuprof.profile("m", socket_dir=socket_dir, autostart=False, auto=False) as prof:
        rec = prof._recorder
        assert rec.between_steps()
        with prof.step(4):
            assert not rec.between_steps()
        assert rec.between_steps() and rec.next_index == 5
