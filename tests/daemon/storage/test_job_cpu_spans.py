"""How many of a job's runs were sampled together: from their sample spans."""

from __future__ import annotations

from gpuprofd.storage.reads.queries import most_at_once


def test_ranks_running_together_are_counted_together():
    assert most_at_once([(0, 100), (0, 100), (50, 200)]) == 3
    # spans that only touch at one sample time were sampled together then
    assert most_at_once([(0, 100), (100, 200)]) == 2


def test_a_rank_restarted_after_its_first_run_ended_is_one_rank():
    assert most_at_once([(0, 100), (101, 200), (150, 300)]) == 2
    assert most_at_once([(0, 100)]) == 1
    assert most_at_once([]) == 0
