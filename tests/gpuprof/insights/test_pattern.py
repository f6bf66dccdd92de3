"""The shape of slow steps: a regular interval, or bursts."""

from __future__ import annotations

from gpuprof.insights.pattern import bursts, bursts_text, period


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


def test_bursts_join_steps_one_fast_step_apart_and_are_named_in_short():
    assert bursts([22, 29, 30, 31, 32, 38]) == [(22, 22), (29, 32), (38, 38)]
    assert bursts([10, 12, 13]) == [(10, 13)]
    assert bursts_text(bursts([22, 29, 30, 31, 32, 38])) == "22, 29–32, 38"
    many = [(i * 10, i * 10) for i in range(8)]
    assert bursts_text(many) == "0, 10, 20, 30, 40, 50 and 2 more"
