"""The shape of slow steps: a regular interval, or bursts."""

from __future__ import annotations

from gpuprof.insights.pattern import burst_loss, bursts, bursts_text, heaviest, period


def test_a_regular_interval_is_found_despite_a_few_extra_slow_steps():
    assert period([20, 40, 60, 80, 100]) == 20
    assert period([20, 33, 40, 60, 71, 80, 100, 120]) == 20  # two extras: still every 20
    assert period([20, 40, 80, 100, 120]) == 20  # one occurrence missed (5 of 6 on the lattice)
    # a busy host's jitter: more short slow steps than periodic ones, but the
    # periodic ones lost most of the time
    jitter = [3, 7, 11, 26, 29, 33, 47, 52, 55, 66, 71, 77]
    steps = sorted([20, 40, 60, 80] + jitter)
    lost = [50.0 if s % 20 == 0 else 10.0 for s in steps]
    assert period(steps) is None and period(steps, lost) == 20


def test_bursts_and_scattered_steps_are_not_periodic():
    assert period([22, 29, 30, 31, 32, 38]) is None  # the GPT run
    assert period(list(range(40, 60)) + list(range(100, 118))) is None  # two long bursts
    assert period([5, 17, 44]) is None
    assert period([3, 4, 5]) is None  # consecutive: a burst, not an interval of 1
    burst = list(range(40, 60))
    heavy_every_other = [30.0 if s % 2 else 10.0 for s in burst]
    assert period(burst, heavy_every_other) is None  # a burst, not "every 2 steps"
    assert period([20, 40]) is None  # two are not a pattern


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
