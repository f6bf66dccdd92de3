"""What the adapters share: ``AdapterRun`` and the one step-machine call it
adds (``seal_eval``), on a fake clock."""

from __future__ import annotations

import pytest

from gpuprof_shim.adapters._run import AdapterRun
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.steps import StepRecord


def one_step(machine: StepMachine, t: int) -> None:
    """A training micro-batch and its update, starting at *t* (ns)."""
    opt = object()
    machine.on_forward(t)
    machine.on_forward_end(t + 10)
    machine.on_backward_start(t + 20)
    machine.on_backward_end(t + 30)
    machine.on_optimizer_pre(t + 40, opt)
    machine.on_optimizer_post(t + 50, opt)
    machine.flush(t + 60)


def run(seal: bool, teacher: bool = False) -> StepRecord:
    out: list[StepRecord] = []
    machine = StepMachine(out.append, 0)
    machine.on_eval_call(100, 200)  # a two-batch validation loop, right
    machine.on_eval_call(250, 350)  # before training (within ADJACENT_NS)
    if seal:
        machine.seal_eval()
    if teacher:
        machine.on_eval_call(370, 390)  # a teacher's forward after it
    one_step(machine, 400)
    (rec,) = out
    return rec


def test_unsealed_short_eval_right_before_training_is_taken_for_a_prelude():
    rec = run(seal=False)
    assert (rec.t0, rec.eval_ns) == (100, 0)


def test_sealed_eval_is_eval_however_short_and_close():
    rec = run(seal=True)
    assert (rec.t0, rec.eval_ns) == (400, 250)
    assert rec.wait == 400 - 250  # the gap minus the eval span


def test_a_teacher_after_a_sealed_eval_is_still_a_prelude():
    rec = run(seal=True, teacher=True)
    assert (rec.t0, rec.eval_ns) == (370, 250)


def test_seal_without_a_running_profile_does_nothing(socket_dir):
    run_ = AdapterRun("Test", "r", {"socket_dir": socket_dir, "autostart": False})
    run_.seal_eval()
    run_.mark_step_end()
    run_.stop()
    assert run_.profiler is None and not run_.active


def test_options_are_checked_when_the_adapter_is_made():
    with pytest.raises(TypeError, match="auto, step_source"):
        AdapterRun("Test", "r", {"auto": True, "step_source": "x"}, {"step_source": "external"})
    with pytest.raises(ValueError, match="step_source"):
        AdapterRun("Test", "r", {"step_source": "neither"})


def test_adapters_pass_project_and_tags_through(socket_dir, fake_daemon):
    opts = {"socket_dir": socket_dir, "autostart": False, "project": "llm", "tags": {"t": "1"}}
    run_ = AdapterRun("Test", "r", opts, {"step_source": "external"})
    prof = run_.start()
    assert prof is not None
    run_.stop()
    (hello,) = fake_daemon.of_type("hello")
    assert (hello["project"], hello["tags"]) == ("llm", {"t": "1"})
