"""The shape of slow steps: a regular interval, or bursts."""

from __future__ import annotations

from gpuprof.insights.pattern import (
    Period,
    burst_loss,
    bursts,
    bursts_text,
    heaviest,
    period,
)

#: The steady steps of a 140-step run (the first 3 are warm-up).
RUN = range(3, 140)


def test_a_regular_interval_is_found_despite_a_few_extra_slow_steps():
    assert period([20, 40, 60, 80, 100, 120], RUN) == Period(20, 0, 6, 6)
    extras = [20, 33, 40, 60, 71, 80, 100, 120]  # two extras: still every 20
    assert period(extras, RUN) == Period(20, 0, 6, 6)
    assert period([20, 40, 80, 100, 120], RUN) == Period(20, 0, 5, 6)  # one missed: 5 of 6
    # a busy host's jitter: more short slow steps than periodic ones, but the
    # periodic ones lost most of the time
    jitter = [3, 7, 11, 26, 29, 33, 47, 52, 55, 66, 71, 77]
    steps = sorted([20, 40, 60, 80] + jitter)
    lost = [50.0 if s % 20 == 0 else 10.0 for s in steps]
    assert period(steps, range(3, 100)) is None
    assert period(steps, range(3, 100), lost) == Period(20, 0, 4, 4)


def test_bursts_and_scattered_steps_are_not_periodic():
    assert period([22, 29, 30, 31, 32, 38], range(3, 60)) is None  # the GPT run
    assert period(list(range(40, 60)) + list(range(100, 118)), RUN) is None  # two long bursts
    assert period([5, 17, 44], range(3, 60)) is None
    assert period([3, 4, 5], range(3, 60)) is None  # consecutive: a burst, not an interval of 1
    burst = list(range(40, 60))
    heavy_every_other = [30.0 if s % 2 else 10.0 for s in burst]
    assert period(burst, RUN, heavy_every_other) is None  # a burst, not "every 2 steps"
    assert period([20, 40], RUN) is None  # two are not a pattern


def test_slow_steps_n_apart_in_one_part_of_the_run_are_not_periodic():
    episode = [100, 105, 110, 115, 120]  # a busy-host episode, 5 steps apart
    assert period(episode, range(3, 300)) is None
    assert period(episode, range(98, 123)) == Period(5, 0, 5, 5)  # the run was only that
    # every 10 steps, but only in the first half of the run
    first_half = list(range(10, 150, 10))
    assert period(first_half, range(3, 300)) is None
    assert period(first_half, range(3, 155)) == Period(10, 0, 14, 15)  # to near its end


def test_periodic_needs_the_repeats_and_no_long_stretch_missing():
    assert period([20, 40, 60], range(3, 70)) is None  # three: could be chance
    assert period([20, 40, 60, 80], range(3, 90)) == Period(20, 0, 4, 4)
    every_20 = list(range(20, 200, 20))  # 9 times
    assert period(every_20, range(3, 200), min_repeats=10) is None
    assert period([*every_20, 200], range(3, 220), min_repeats=10) == Period(20, 0, 10, 10)
    # 25 of 30 on the lattice, but the 5 missed ones in a row: stopped for a while
    gap = [s for s in range(10, 310, 10) if not 200 <= s <= 240]
    assert period(gap, range(3, 310)) is None
    spread = [s for s in range(10, 310, 10) if s not in (50, 110, 170, 230, 290)]
    assert period(spread, range(3, 310)) == Period(10, 0, 25, 30)  # missed here and there


def test_a_drifting_phase_is_not_a_fixed_interval():
    # work on a timer: every 20 or 21 steps as step times vary, the phase drifts
    drift = [20, 40, 61, 81, 102, 122, 143, 163, 184]
    assert period(drift, range(3, 200)) is None


def test_the_interval_is_counted_in_step_numbers_with_steps_missing():
    # a checkpoint every 25 steps; steps 90-129 were lost on the way (the
    # lattice's 100 and 125 unknown, neither slow nor fast)
    ran = [s for s in range(3, 300) if not 90 <= s < 130]
    slow = [s for s in range(25, 300, 25) if s in ran]
    assert period(slow, ran) == Period(25, 0, 9, 9)


def test_a_jump_in_the_step_numbers_costs_its_steps_not_its_span():
    # a manual loop that numbered one step 2**40 (the shim's largest index):
    # the lattice is walked over the steps that ran, not the 2**40 numbers between
    import time

    every_25 = list(range(25, 300, 25))
    started = time.perf_counter()
    assert period(every_25, [*range(3, 300), 1 << 40]) == Period(25, 0, 11, 11)
    assert period([10, 12, 14, 16, 500, 502, 504, 506], [*range(1000), 1 << 40]) is None
    assert time.perf_counter() - started < 1.0


def test_bursts_join_steps_up_to_four_fast_steps_apart_and_are_named_in_short():
    assert bursts([22, 29, 30, 31, 32, 38]) == [(22, 22), (29, 32), (38, 38)]
    assert bursts([10, 12, 13]) == [(10, 13)]
    # a loaded scheduler leaves a few unpreempted steps inside a burst of load
    assert bursts([10, 13, 14, 19, 20]) == [(10, 20)]
    assert bursts([10, 16]) == [(10, 10), (16, 16)]  # five fast steps between: two
    assert bursts_text(bursts([22, 29, 30, 31, 32, 38])) == "22, 29–32, 38"
    many = [(i * 10, i * 10) for i in range(8)]
    assert bursts_text(many) == "0, 10, 20, 30, 40, 50 and 2 more"


def test_many_bursts_are_named_by_the_time_they_lost_in_step_order():
    slow = [3, 9, 20, 21, 22, 30, 41, 50, 51, 60, 70, 80]
    runs = bursts(slow)
    assert runs == [(3, 3), (9, 9), (20, 22), (30, 30), (41, 41), (50, 51)] + [
        (60, 60),
        (70, 70),
        (80, 80),
    ]
    excess = [5.0, 5.0, 90.0, 80.0, 70.0, 5.0, 5.0, 100.0, 100.0, 6.0, 5.0, 5.0]
    lost = burst_loss(runs, slow, excess)
    assert lost == [5.0, 5.0, 240.0, 5.0, 5.0, 200.0, 6.0, 5.0, 5.0]
    assert heaviest(runs, lost, 2) == [(20, 22), (50, 51)]
    # the heaviest six, in step order (ties to the earlier); the rest counted
    assert bursts_text(runs, lost) == "3, 9, 20–22, 30, 50–51, 60 and 3 smaller"
    assert bursts_text(runs[:3], lost[:3]) == "3, 9, 20–22"
