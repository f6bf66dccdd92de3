"""The auto-mode step state machine, driven with hand-made timestamps (ns)
and stand-in optimizer objects."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from gpuprof_shim.auto.gap import ADJACENT_NS
from gpuprof_shim.auto.machine import IDLE, StepMachine
from gpuprof_shim.auto.segment import Segment as _Segment
from gpuprof_shim.steps import OptimizerUse, StepRecord


class Opt:
    """Stands in for an optimizer: only its identity and class name matter."""


class Adam(Opt):
    pass


class SGD(Opt):
    pass


def make(start_ns: int = 0, **kw) -> tuple[StepMachine, list[StepRecord]]:
    out: list[StepRecord] = []
    return StepMachine(out.append, start_ns, clock=lambda: 0, **kw), out


def micro(m: StepMachine, fwd: int, bwd: int, bwd_end: int) -> None:
    m.on_forward(fwd)
    m.on_forward_end(bwd - 1)
    assert m.on_backward_start(bwd)
    m.on_backward_end(bwd_end)


def opt_step(m: StepMachine, opt: object, pre: int, post: int) -> None:
    m.on_optimizer_pre(pre, opt)
    m.on_optimizer_post(post, opt)


def test_one_step_boundaries_phases_and_gap_wait():
    m, out = make(start_ns=100)
    opt = SGD()
    micro(m, fwd=1_000, bwd=1_300, bwd_end=1_700)
    opt_step(m, opt, 1_750, 1_900)
    assert out == []  # closed lazily: another optimizer could still step
    m.flush(5_000)
    assert out == [
        StepRecord(
            i=0,
            t0=1_000,
            t1=1_900,
            wait=900,
            explicit=False,
            micro=1,
            phases={"forward": 300, "backward": 400, "optimizer": 150},
            optimizers=[OptimizerUse(name="SGD#0", updates=1, skipped=0, ns=150)],
            clean=True,  # its event takes the phases and optimizers as they are
        )
    ]
    assert m.state is IDLE


def test_a_step_is_emitted_when_the_primary_optimizer_steps_again():
    m, out = make()
    opt = SGD()
    for base in (1_000, 5_000):
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
        opt_step(m, opt, base + 250, base + 300)
    assert [s.i for s in out] == [0]
    m.flush(9_000)
    assert [s.i for s in out] == [0, 1]
    assert out[1].wait == 5_000 - 1_300
    assert (out[1].t0, out[1].t1) == (5_000, 5_300)


def test_gradient_accumulation_is_one_step_with_micro_count_and_summed_phases():
    m, out = make()
    opt = SGD()
    for k in range(4):  # each micro-batch: 100 forward, 200 backward, 50 idle
        base = 1_000 + k * 350
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 300)
    opt_step(m, opt, 2_500, 2_600)
    m.flush(3_000)
    (step,) = out
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
    opt_step(m, SGD(), 1_500, 1_600)
    m.flush(2_000)
    assert out[0].micro == 1
    assert out[0].phases["forward"] == 300  # from the model's call to backward start


def test_forward_during_backward_belongs_to_backward():
    m, out = make()
    m.on_forward(1_000)
    m.on_backward_start(1_100)
    m.on_forward(1_150)  # activation checkpointing recomputes in backward
    m.on_forward_end(1_200)
    m.on_backward_end(1_300)
    opt_step(m, SGD(), 1_400, 1_500)
    m.flush(2_000)
    assert out[0].phases == {"forward": 100, "backward": 200, "optimizer": 100}
    assert out[0].micro == 1


def test_closure_forward_and_backward_count_as_such_not_as_optimizer():
    m, out = make()
    opt = Opt()
    m.on_optimizer_pre(1_000, opt)  # LBFGS: optimizer.step(closure)
    for k in range(3):  # the closure evaluated three times
        base = 1_100 + k * 500
        m.on_forward(base)
        m.on_forward_end(base + 90)
        assert m.on_backward_start(base + 100)
        m.on_backward_end(base + 300)
    m.on_optimizer_post(3_000, opt)
    m.flush(4_000)
    (step,) = out
    assert step.phases == {"forward": 300, "backward": 600, "optimizer": 2_000 - 900}
    assert step.micro == 1  # one batch, evaluated three times
    assert (step.t0, step.t1) == (1_000, 3_000)


def test_accumulation_then_closure_step_counts_every_micro_batch():
    m, out = make()
    opt = Opt()
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_200)  # Lightning: closure run directly
    m.on_optimizer_pre(1_300, opt)  # then optimizer.step(closure) on the last one
    m.on_forward(1_310)
    m.on_backward_start(1_400)
    m.on_backward_end(1_500)
    m.on_optimizer_post(1_600, opt)
    m.flush(2_000)
    assert out[0].micro == 2
    assert out[0].phases["optimizer"] == 300 - 190


def test_gan_two_optimizers_make_one_step_per_iteration():
    m, out = make()
    d_opt, g_opt = Adam(), SGD()
    for k in range(3):
        base = 10_000 * (k + 1)
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)  # discriminator
        opt_step(m, d_opt, base + 300, base + 400)
        micro(m, fwd=base + 500, bwd=base + 600, bwd_end=base + 700)  # generator
        opt_step(m, g_opt, base + 800, base + 1_000)
    m.flush(50_000)
    assert [s.i for s in out] == [0, 1, 2]
    for k, s in enumerate(out):
        base = 10_000 * (k + 1)
        assert (s.t0, s.t1, s.micro) == (base, base + 1_000, 1)
        assert s.phases == {"forward": 200, "backward": 200, "optimizer": 300}
        assert s.optimizers == [
            OptimizerUse(name="Adam#0", updates=1, skipped=0, ns=100),
            OptimizerUse(name="SGD#1", updates=1, skipped=0, ns=200),
        ]
    assert out[1].wait == 20_000 - 11_000


def test_skipped_update_ends_the_step_and_is_marked():
    m, out = make()
    opt = SGD()
    for k in range(3):
        base = 1_000 * (k + 1)
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
        m.on_scaler_step_start(base + 300, opt)
        if k != 1:  # iteration 1: inf grads, the scaler skips optimizer.step()
            opt_step(m, opt, base + 350, base + 400)
        m.on_scaler_step_end(base + 450, opt)
    m.flush(9_000)
    assert [(s.i, s.micro, s.skipped) for s in out] == [(0, 1, False), (1, 1, True), (2, 1, False)]
    assert out[1].optimizers == [OptimizerUse(name="SGD#0", updates=0, skipped=1, ns=150)]
    assert out[0].optimizers == [OptimizerUse(name="SGD#0", updates=1, skipped=0, ns=150)]


def test_nested_optimizer_steps_count_once():
    m, out = make()
    outer, inner = Opt(), SGD()
    micro(m, fwd=0, bwd=100, bwd_end=200)
    m.on_optimizer_pre(300, outer)  # wrapper optimizer
    opt_step(m, inner, 310, 390)
    m.on_optimizer_post(400, outer)
    m.flush(1_000)
    (step,) = out
    assert step.phases["optimizer"] == 100 and step.t1 == 400
    assert [o["name"] for o in step.optimizers] == ["Opt#0"]


def test_backward_without_seen_forward_starts_the_step():
    m, out = make()
    m.on_backward_start(500)
    m.on_backward_end(700)
    opt_step(m, SGD(), 800, 900)
    m.flush(1_000)
    assert (out[0].t0, out[0].micro, out[0].phases["forward"]) == (500, 1, 0)


def test_explicit_loader_waits_replace_the_gap_and_in_step_waits_become_data_phase():
    m, out = make()
    opt = SGD()
    m.mark_explicit()
    m.add_loader_wait(40)  # before the step: its wait
    m.add_loader_wait(2)
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_200)
    m.add_loader_wait(30)  # second micro-batch fetched inside the step
    micro(m, fwd=1_250, bwd=1_300, bwd_end=1_400)
    opt_step(m, opt, 1_500, 1_600)
    m.add_loader_wait(7)
    micro(m, fwd=9_000, bwd=9_100, bwd_end=9_200)
    opt_step(m, opt, 9_300, 9_400)
    m.flush(10_000)
    assert (out[0].wait, out[0].explicit, out[0].phases["data"]) == (42, True, 30)
    assert (out[1].wait, out[1].explicit) == (7, True)
    assert "data" not in out[1].phases


MS = 1_000_000


def test_eval_loop_between_steps_is_eval_time_not_loader_wait():
    m, out = make()
    opt = SGD()
    micro(m, fwd=1 * MS, bwd=2 * MS, bwd_end=3 * MS)
    opt_step(m, opt, 4 * MS, 5 * MS)
    assert m.wants_eval()
    for k in range(5):  # validation: 2 ms no-grad forwards, 5 ms apart (val loading between)
        m.on_eval_call(10 * MS + 5 * MS * k, 12 * MS + 5 * MS * k)
    micro(m, fwd=60 * MS, bwd=61 * MS, bwd_end=62 * MS)  # 28 ms of train loading first
    assert not m.wants_eval()
    opt_step(m, opt, 63 * MS, 64 * MS)
    m.flush(70 * MS)
    second = out[1]
    assert second.eval_ns == 32 * MS - 10 * MS
    assert second.wait == (60 * MS - 5 * MS) - second.eval_ns
    assert second.t0 == 60 * MS


def test_an_eval_loop_running_straight_into_training_is_still_eval():
    m, out = make()
    for k in range(4):  # no loading anywhere: each call ends right before the next
        m.on_eval_call(10 * MS + 3 * MS * k, 13 * MS + 3 * MS * k - 10)
    micro(m, fwd=22 * MS, bwd=23 * MS, bwd_end=24 * MS)
    opt_step(m, SGD(), 25 * MS, 26 * MS)
    m.flush(30 * MS)
    assert (out[0].t0, out[0].eval_ns) == (22 * MS, 12 * MS - 10)


def test_a_teacher_forward_under_no_grad_is_part_of_the_step():
    m, out = make()
    opt = SGD()
    for base in (1 * MS, 20 * MS):
        m.on_eval_call(base + 5 * MS, base + 8 * MS)  # 5 ms loading, then teacher(x)
        micro(m, fwd=base + 8 * MS + 20, bwd=base + 9 * MS, bwd_end=base + 10 * MS)
        opt_step(m, opt, base + 11 * MS, base + 12 * MS)
    m.flush(40 * MS)
    assert [(s.t0, s.eval_ns) for s in out] == [(6 * MS, 0), (25 * MS, 0)]
    assert out[1].phases["forward"] == 4 * MS  # teacher + student forward
    assert out[1].wait == 25 * MS - 13 * MS  # the loading before the teacher


def test_an_ema_forward_after_the_update_is_eval_not_step_or_wait():
    m, out = make()
    opt = SGD()
    for base in (1 * MS, 20 * MS):
        micro(m, fwd=base, bwd=base + 1 * MS, bwd_end=base + 2 * MS)
        opt_step(m, opt, base + 3 * MS, base + 4 * MS)
        m.on_eval_call(base + 4 * MS + 10, base + 6 * MS)  # ema(x) right after the update
    assert ADJACENT_NS < 14 * MS  # then the next batch loads for 15 ms
    m.flush(40 * MS)
    assert out[1].t0 == 20 * MS
    assert out[1].eval_ns == 6 * MS - (4 * MS + 10)
    assert out[1].wait == (20 * MS - 5 * MS) - out[1].eval_ns
    assert m.trailing_eval_ns == 6 * MS - (4 * MS + 10)


def test_explicit_mode_excludes_the_eval_loops_own_loading():
    m, out = make()
    opt = SGD()
    m.mark_explicit()
    micro(m, fwd=1 * MS, bwd=2 * MS, bwd_end=3 * MS)
    opt_step(m, opt, 4 * MS, 5 * MS)
    m.add_loader_wait(5)  # first val batch: before the first eval call
    for k in range(4):
        m.on_eval_call(10 * MS + 5 * MS * k, 11 * MS + 5 * MS * k)
        m.add_loader_wait(1_000)  # the val loader between eval calls (and the last one after)
    m.add_loader_wait(70)  # the next epoch's first train batch
    micro(m, fwd=60 * MS, bwd=61 * MS, bwd_end=62 * MS)
    opt_step(m, opt, 63 * MS, 64 * MS)
    m.flush(70 * MS)
    assert out[1].wait == 5 + 1_000 + 70  # before, and after the last eval call
    assert out[1].eval_ns == 26 * MS - 10 * MS


def test_explicit_mode_loading_between_eval_and_a_teacher_is_wait():
    m, out = make()
    m.mark_explicit()
    for k in range(3):  # an eval loop...
        m.on_eval_call(10 * MS + 5 * MS * k, 11 * MS + 5 * MS * k)
        m.add_loader_wait(300)
    m.add_loader_wait(4_000)  # ...then the train batch, then teacher + student
    m.on_eval_call(30 * MS, 32 * MS)
    micro(m, fwd=32 * MS + 50, bwd=33 * MS, bwd_end=34 * MS)
    opt_step(m, SGD(), 35 * MS, 36 * MS)
    m.flush(40 * MS)
    (step,) = out
    assert (step.t0, step.eval_ns) == (30 * MS, 21 * MS - 10 * MS)
    assert step.wait == 300 + 4_000  # the last val fetch and the train fetch


def test_flush_counts_trailing_eval_and_drops_a_forward_only_tail():
    m, out = make()
    opt = SGD()
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_200)
    opt_step(m, opt, 1_300, 1_400)
    for k in range(3):
        m.on_eval_call(2_000 + 100 * k, 2_050 + 100 * k)
    m.flush(3_000)
    assert len(out) == 1
    assert m.trailing_eval_ns == 250
    m2, out2 = make()
    m2.on_forward(10)  # grad-enabled forward, never backward: not a training step
    m2.on_forward_end(20)
    m2.flush(30)
    assert out2 == []


def test_work_after_the_last_update_is_not_a_step():
    m, out = make()
    opt = SGD()
    micro(m, fwd=100, bwd=200, bwd_end=300)
    opt_step(m, opt, 400, 500)
    micro(m, fwd=600, bwd=700, bwd_end=800)  # accumulated, never followed by an update
    m.on_forward(900)
    m.on_backward_start(1_000)  # and one interrupted in backward
    m.flush(2_000)
    assert [(s.i, s.micro, s.t1) for s in out] == [(0, 1, 500)]
    assert m.unfinished_micro == 2


def test_a_step_whose_closure_raised_is_not_a_step():
    m, out = make()
    opt = Opt()
    for base in (1_000, 2_000):
        m.on_optimizer_pre(base, opt)
        m.on_forward(base + 10)
        m.on_backward_start(base + 20)
        m.on_backward_end(base + 30)
        m.on_optimizer_post(base + 40, opt)
    m.on_optimizer_pre(3_000, opt)
    m.on_forward(3_010)  # the closure raises here: no post hook
    m.flush(4_000)
    assert [s.i for s in out] == [0, 1]
    assert m.unfinished_micro == 0


def test_external_mode_steps_end_only_at_end_step():
    m, out = make(external=True)
    opt = SGD()
    for k in range(2):  # a framework calls step() every micro-batch; inner updates once
        micro(m, fwd=1_000 + 400 * k, bwd=1_100 + 400 * k, bwd_end=1_200 + 400 * k)
    opt_step(m, opt, 1_700, 1_800)
    m.end_step(1_850, micro=2)
    micro(m, fwd=3_000, bwd=3_100, bwd_end=3_200)
    m.end_step(3_300, skipped=True)  # the framework skipped the update
    m.end_step(3_400)  # nothing happened since: no step
    m.flush(4_000)
    assert [(s.i, s.t0, s.t1, s.micro, s.skipped) for s in out] == [
        (0, 1_000, 1_850, 2, False),
        (1, 3_000, 3_300, 1, True),
    ]
    assert out[1].wait == 3_000 - 1_850


def test_a_replaced_primary_optimizer_hands_over_to_the_next():
    m, out = make()
    first = SGD()
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_200)
    opt_step(m, first, 1_300, 1_400)
    del first
    gc.collect()
    second = Adam()  # the user rebuilt the optimizer
    for base in (2_000, 3_000, 4_000):
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
        opt_step(m, second, base + 300, base + 400)
    m.flush(9_000)
    # the new optimizer's first step is a cycle of its own, not part of the old step
    assert [(s.t0, s.t1) for s in out] == [
        (1_000, 1_400),
        (2_000, 2_400),
        (3_000, 3_400),
        (4_000, 4_400),
    ]


def test_loading_before_a_closure_step_is_the_data_phase_only_if_the_closure_runs_forward():
    m, out = make()
    opt = SGD()
    micro(m, fwd=1_000, bwd=1_100, bwd_end=1_200)  # Lightning: micro-batch 1, closure run directly
    m.on_optimizer_pre(1_500, opt)  # 300 ns fetching micro-batch 2, then step(closure)
    m.on_forward(1_510)
    m.on_backward_start(1_600)
    m.on_backward_end(1_700)
    m.on_optimizer_post(1_800, opt)
    micro(m, fwd=5_000, bwd=5_100, bwd_end=5_200)  # a plain loop: clip grads, then step()
    m.on_optimizer_pre(5_500, opt)
    m.on_optimizer_post(5_600, opt)
    m.flush(9_000)
    assert out[0].phases["data"] == 300
    assert "data" not in out[1].phases  # grad clipping is not loading


def test_a_step_call_that_raised_and_was_caught_does_not_stall_counting():
    m, out = make()
    opt = SGD()
    for k in range(6):
        base = 1_000 * (k + 1)
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
        m.on_optimizer_pre(base + 300, opt)
        if k != 2:  # iteration 2: step() raises (an OOM), the loop catches it and goes on
            m.on_optimizer_post(base + 400, opt)
    m.flush(9_000)
    # five updates, five steps; the failed iteration's micro-batch joins the next step
    assert [(s.i, s.micro) for s in out] == [(0, 1), (1, 1), (2, 2), (3, 1), (4, 1)]


def test_loading_inside_the_forward_window_is_data_not_forward():
    m, out = make()
    m.mark_explicit()
    m.on_forward(1_000)
    m.on_forward_end(1_100)
    m.add_loader_wait(5_000)  # next(it) between the forward and its backward (prefetch)
    m.on_backward_start(6_200)
    m.on_backward_end(6_300)
    opt_step(m, SGD(), 6_400, 6_500)
    m.flush(7_000)
    (step,) = out
    assert step.phases == {"forward": 200, "backward": 100, "optimizer": 100, "data": 5_000}
    assert sum(step.phases.values()) <= step.t1 - step.t0


def test_no_grad_calls_from_another_thread_are_not_this_loops_eval():
    import threading

    m, out = make()
    opt = SGD()
    micro(m, fwd=1 * MS, bwd=2 * MS, bwd_end=3 * MS)
    opt_step(m, opt, 4 * MS, 5 * MS)
    other = threading.Thread(target=lambda: [m.on_eval_call(6 * MS, 9 * MS)])
    other.start()
    other.join()
    micro(m, fwd=20 * MS, bwd=21 * MS, bwd_end=22 * MS)
    opt_step(m, opt, 23 * MS, 24 * MS)
    m.flush(30 * MS)
    assert (out[1].eval_ns, out[1].wait) == (0, 15 * MS)


def test_reentrant_checkpointing_from_the_loop_is_the_forward_not_eval():
    m, out = make()
    for k in range(6):  # checkpoint(block, h) runs each block under no_grad, back to back
        m.on_eval_call(10 * MS + 2 * MS * k, 12 * MS + 2 * MS * k - 50)
    m.on_backward_start(22 * MS)  # then backward: no grad-enabled forward was seen
    m.on_backward_end(40 * MS)
    opt_step(m, SGD(), 41 * MS, 42 * MS)
    m.flush(50 * MS)
    (step,) = out
    assert (step.t0, step.eval_ns, step.wait) == (10 * MS, 0, 10 * MS)
    assert step.phases["forward"] == 12 * MS


def _iteration(m: StepMachine, opt: object, base: int) -> None:
    micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
    opt_step(m, opt, base + 300, base + 400)


@pytest.mark.parametrize("stage2", [4, 40])
def test_a_second_stage_optimizer_takes_over_while_the_first_is_still_referenced(stage2):
    m, out = make()
    head_opt, full_opt = SGD(), Adam()  # both stay referenced (linear probe, then fine-tune)
    for k in range(4):
        _iteration(m, head_opt, 1_000 * (k + 1))
    for k in range(stage2):
        _iteration(m, full_opt, 10_000 + 1_000 * k)
    m.flush(10**9)
    assert [s.i for s in out] == list(range(4 + stage2))
    assert [[o["name"] for o in s.optimizers] for s in out] == [["SGD#0"]] * 4 + [
        ["Adam#1"]
    ] * stage2
    assert all(s.micro == 1 for s in out)
    for a, b in zip(out, out[1:], strict=False):
        assert b.t0 >= a.t1


def test_wgan_generator_first_with_five_critic_updates_is_one_step_per_generator_cycle():
    m, out = make()
    gen_opt, critic_opt = Adam(), SGD()
    base = 1_000
    for _ in range(4):
        _iteration(m, gen_opt, base)
        for _ in range(5):
            base += 1_000
            _iteration(m, critic_opt, base)
        base += 1_000
    m.flush(10**9)
    assert len(out) == 4
    assert [[(o["name"], o["updates"]) for o in s.optimizers] for s in out] == [
        [("Adam#0", 1), ("SGD#1", 5)]
    ] * 4
    assert all(s.micro == 1 for s in out)  # the critic's backward calls are not micro-batches


def test_time_spent_sending_events_is_its_own_phase_not_the_optimizers():
    clock = iter(range(0, 10**9, 1))
    sends = []

    def slow_emit(rec):  # a burst of sends takes 500 ns of the clock, and says so
        sends.append(rec)
        t = next(clock)
        for _ in range(500):
            next(clock)
        return next(clock) - t

    m = StepMachine(slow_emit, 0, clock=lambda: next(clock))
    opt = SGD()
    for base in (10_000, 20_000):
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
        opt_step(m, opt, base + 300, base + 1_300)
    m.flush(10**6)
    assert sends[1].phases["optimizer"] == 1_000 - 501  # the step's own 1000 ns, less the send
    assert 500 <= sends[1].phases["gpuprof"] <= 502


def test_an_emitted_segment_is_reset_to_a_fresh_one():
    m, out = make()
    seg = _Segment()
    for f in dataclasses.fields(_Segment):  # every field away from its default
        default = getattr(seg, f.name)
        if isinstance(default, bool):
            setattr(seg, f.name, True)
        elif isinstance(default, int):
            setattr(seg, f.name, 7)
        else:
            default[0] = {"name": "SGD#0", "updates": 1, "skipped": 0, "ns": 7}
        assert getattr(seg, f.name) != getattr(_Segment(), f.name), f.name
    m._emit_segment(seg, 9)
    assert len(out) == 1 and out[0].t0 == 7
    assert seg == _Segment()  # reused as the next segment: nothing of the step left


def test_optimizers_past_the_protocols_sixteen_share_the_last_slot_as_other():
    m, out = make()
    opts = [SGD() for _ in range(17)]
    for base in (10_000, 20_000):
        micro(m, fwd=base, bwd=base + 100, bwd_end=base + 200)
        for k, opt in enumerate(opts):  # the first is the primary; the others are its tails
            opt_step(m, opt, base + 300 + 10 * k, base + 305 + 10 * k)
    m.flush(10**6)
    assert len(out) == 2
    for step in out:
        names = [o["name"] for o in step.optimizers]
        assert names == [f"SGD#{k}" for k in range(15)] + ["other"]
        assert step.optimizers[-1]["updates"] == 2  # the 16th and the 17th
