"""The auto-mode step state machine, driven with hand-made timestamps (ns)."""

from __future__ import annotations

from gpuprof_shim.auto import AFTER_BACKWARD, IDLE, StepMachine
from gpuprof_shim.steps import StepRecord, WaitTracker


def make(start_ns: int = 0) -> tuple[StepMachine, list[StepRecord]]:
    out: list[StepRecord] = []
    return StepMachine(out.append, WaitTracker(start_ns), clock=lambda: 0), out


def micro(m: StepMachine, fwd: int, bwd: int, bwd_end: int) -> None:
    m.on_forward(fwd)
    m.on_forward_end(bwd - 1)
    assert m.on_backward_start(bwd)
    m.on_backward_end(bwd_end)


def test_one_step_boundaries_phases_and_gap_wait():
    m, out = make(start_ns=100)
    micro(m, fwd=1_000, bwd=1_300, bwd_end=1_700)
    m.on_optimizer_pre(1_750)
    m.on_optimizer_post(1_900)
    assert out == [
        StepRecord(
            i=0, t0=1_000, t1=1_900, wait=900, explicit=False, micro=1,
            phases={"forward": 300, "backward": 400, "optimizer": 150},
        )
    ]  # fmt: skip
    assert m.state is IDLE


def test_second_step_wait_is_gap_from_previous_end_and_index_counts():
    m, out = make()
    for base in (1_000, 5_000):
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
        m.on_optimizer_pre(base + 250)
        m.on_optimizer_post(base + 300)
    assert [s.i for s in out] == [0, 1]
    assert out[1].wait == 5_000 - 1_300
    assert out[1].t0 == 5_000


def test_gradient_accumulation_is_one_step_with_micro_count_and_summed_phases():
    m, out = make()
    for k in range(4):  # each micro-batch: 100 forward, 200 backward, 50 idle
        base = 1_000 + k * 350
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 300)
    m.on_optimizer_pre(2_500)
    m.on_optimizer_post(2_600)
    assert len(out) == 1
    step = out[0]
    assert (step.t0, step.t1, step.micro) == (1_000, 2_600, 4)
    # the 50 ns gaps before micro-batches 2-4 are their loading: the "data" phase
    assert step.phases == {"forward": 400, "backward": 800, "optimizer": 100, "data": 150}


def test_extra_outermost_calls_in_forward_do_not_start_a_new_forward():
    m, out = make()
    m.on_forward(1_000)  # the model
    m.on_forward_end(1_200)
    m.on_forward(1_210)  # the loss module
    m.on_forward_end(1_250)
    m.on_backward_start(1_300)
    m.on_backward_end(1_400)
    m.on_optimizer_pre(1_500)
    m.on_optimizer_post(1_600)
    assert out[0].micro == 1
    assert out[0].phases["forward"] == 300  # from the model's call to backward start


def test_forward_during_backward_or_optimizer_belongs_to_that_phase():
    m, out = make()
    m.on_forward(1_000)
    m.on_backward_start(1_100)
    m.on_forward(1_150)  # activation checkpointing recomputes in backward
    m.on_backward_end(1_300)
    m.on_optimizer_pre(1_400)
    m.on_forward(1_450)  # an optimizer closure
    m.on_optimizer_post(1_600)
    assert out[0].phases == {"forward": 100, "backward": 200, "optimizer": 200}
    assert out[0].micro == 1


def test_nested_backward_start_while_in_backward_is_not_counted():
    m, out = make()
    m.on_forward(0)
    assert m.on_backward_start(10)
    assert not m.on_backward_start(20)  # e.g. another thread's reentrant backward
    m.on_backward_end(30)
    m.on_optimizer_pre(40)
    m.on_optimizer_post(50)
    assert out[0].micro == 1 and out[0].phases["backward"] == 20


def test_optimizer_step_without_forward_is_ignored_and_closes_the_gap():
    m, out = make()
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_200)
    m.on_optimizer_pre(1_300)
    m.on_optimizer_post(1_400)
    m.on_optimizer_pre(1_500)  # a second optimizer, right after the first
    m.on_optimizer_post(2_000)
    micro(m, fwd=2_100, bwd=2_200, bwd_end=2_300)
    m.on_optimizer_pre(2_400)
    m.on_optimizer_post(2_500)
    assert [s.i for s in out] == [0, 1]
    assert out[1].wait == 100  # not 700: the second optimizer is not loader wait


def test_nested_optimizer_steps_count_once():
    m, out = make()
    micro(m, fwd=0, bwd=100, bwd_end=200)
    m.on_optimizer_pre(300)  # wrapper optimizer
    m.on_optimizer_pre(310)  # inner optimizer
    m.on_optimizer_post(390)
    assert out == []
    m.on_optimizer_post(400)
    assert len(out) == 1 and out[0].phases["optimizer"] == 100 and out[0].t1 == 400


def test_backward_without_seen_forward_starts_the_step():
    m, out = make()
    m.on_backward_start(500)
    m.on_backward_end(700)
    m.on_optimizer_pre(800)
    m.on_optimizer_post(900)
    assert (out[0].t0, out[0].micro, out[0].phases["forward"]) == (500, 1, 0)


def test_explicit_loader_waits_replace_the_gap_and_in_step_waits_become_data_phase():
    m, out = make()
    m.waits.mark_explicit()
    m.add_loader_wait(40)  # before the step: its wait
    m.add_loader_wait(2)
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_200)
    m.add_loader_wait(30)  # second micro-batch fetched inside the step
    micro(m, fwd=1_250, bwd=1_300, bwd_end=1_400)
    m.on_optimizer_pre(1_500)
    m.on_optimizer_post(1_600)
    m.add_loader_wait(7)
    micro(m, fwd=9_000, bwd=9_100, bwd_end=9_200)
    m.on_optimizer_pre(9_300)
    m.on_optimizer_post(9_400)
    assert (out[0].wait, out[0].explicit, out[0].phases["data"]) == (42, True, 30)
    assert (out[1].wait, out[1].explicit) == (7, True)
    assert "data" not in out[1].phases


def test_flush_emits_a_partial_step_ending_at_its_last_activity():
    m, out = make()
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_300)
    m.on_forward(1_400)
    m.on_forward_end(1_450)
    assert m.state is not AFTER_BACKWARD
    m.flush(99_999)
    assert (out[0].t0, out[0].t1, out[0].micro) == (1_000, 1_450, 1)
    assert out[0].phases == {"forward": 150, "backward": 200, "optimizer": 0, "data": 100}
    m.flush(100_000)
    assert len(out) == 1  # nothing left to flush


def test_flush_inside_optimizer_ends_at_flush_time():
    m, out = make()
    micro(m, fwd=0, bwd=10, bwd_end=20)
    m.on_optimizer_pre(30)
    m.flush(100)
    assert (out[0].t1, out[0].phases["optimizer"]) == (100, 70)


def test_idle_flush_emits_nothing():
    m, out = make()
    m.flush(5)
    assert out == []
