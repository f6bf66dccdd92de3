"""The runs list's filter (gpuprofd.views.runs.run_matches): each filter with
a run it keeps and one it drops, and the time filter's edges (a running
run runs until now, a run that ended without an end time ended at its start)."""

from __future__ import annotations

from typing import Any

from gpuprofd.views.runs import run_matches

S = 1_000_000_000


def run(**kw: Any) -> dict[str, Any]:
    base = {"run_name": "llama-sft", "status": "finished", "host": "gpu-07", "node_id": "n7"}
    return {**base, "start_wall_ns": 100 * S, "end_wall_ns": 200 * S, **kw}


def test_each_filter_keeps_and_drops() -> None:
    r = run()
    assert run_matches(r) and run_matches(r, name="sft") and not run_matches(r, name="SFT")
    assert run_matches(r, status="finished") and not run_matches(r, status="running")
    assert run_matches(r, node="n7") and run_matches(r, node="gpu-07")
    assert not run_matches(r, node="gpu-0") and not run_matches(r, node="n8")
    assert not run_matches(run(node_id=None, host=None), node="n7")


def test_the_time_filter_keeps_runs_that_ran_in_the_window() -> None:
    r = run()
    assert run_matches(r, from_ns=200 * S) and run_matches(r, to_ns=100 * S)  # edges touch
    assert not run_matches(r, from_ns=201 * S) and not run_matches(r, to_ns=99 * S)
    assert run_matches(r, from_ns=150 * S, to_ns=160 * S)  # inside the run
    assert run_matches(r, from_ns=50 * S, to_ns=300 * S)  # around it
    live = run(status="running", end_wall_ns=None)
    assert run_matches(live, from_ns=900 * S, now_ns=1000 * S)
    assert not run_matches(live, from_ns=1001 * S, now_ns=1000 * S)
    lost = run(status="lost", end_wall_ns=None)
    assert run_matches(lost, from_ns=100 * S) and not run_matches(lost, from_ns=101 * S)
    assert not run_matches(run(start_wall_ns=None), from_ns=0)
    assert run_matches(run(start_wall_ns=None))  # no time filter: every run
