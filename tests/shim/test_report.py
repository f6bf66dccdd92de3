"""The shim's own step counts, for the summary it prints without a daemon."""

from __future__ import annotations

from gpuprof_shim.report import StepCounter
from gpuprof_shim.steps import StepRecord, new_step


def test_a_burst_counts_each_steps_iteration_time():
    counter = StepCounter()
    clean = [
        new_step(i, 1_000 * i, 1_000 * i + 600, 100, False, 1, {}, False, 0, (), True)
        for i in range(3)
    ]
    counter.add_steps(clean)
    assert (counter.steps, counter.total_iteration_ns) == (3, 3 * 700)
    # a step from a clock that went backwards counts as no time, not less
    odd = StepRecord(3, 5_000, 4_000, 0, False, 1)
    counter.add_steps([odd, StepRecord(4, 6_000, 6_500, 0, False, 1)])
    assert (counter.steps, counter.total_iteration_ns) == (5, 3 * 700 + 500)
    assert counter.avg_step_ms == round((3 * 700 + 500) / 5 / 1e6, 3)


def test_the_time_between_steps_of_a_timed_loader_counts_across_bursts():
    # steps of 600 ns, 1,000 ns apart, 100 ns of timed loader wait each: 300
    # ns between steps outside it; evaluation before step 2 holds 50 of them
    def step(i: int, explicit: bool, eval_ns: int = 0):
        t0 = 1_000 * i
        return new_step(i, t0, t0 + 600, 100, explicit, 1, {}, False, eval_ns, (), True)

    counter = StepCounter()
    counter.add_steps([step(0, True), step(1, True)])
    counter.add_steps([step(2, True, 50), step(3, True)])  # the burst's first: from step 1
    assert counter.total_iteration_ns == 4 * 700 + 300 + 250 + 300
    # without a timed loader the wait is already the whole gap: nothing added
    plain = StepCounter()
    plain.add_steps([step(0, False), step(1, False)])
    plain.add_steps([step(2, False)])
    assert plain.total_iteration_ns == 3 * 700
