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
