"""A run's GPU-hours row (gpuprof.gpuhours.run_cost): wall time x GPUs, the
cost line's rate, the fix-all loss split over the findings without counting
shared time twice, never more than the run's own GPU-hours."""

from __future__ import annotations

import pytest

from gpuprof.gpuhours import run_cost

H = 3600 * 10**9


def _run(hours: float, gpus: int) -> dict[str, int]:
    return {"start_wall_ns": 0, "end_wall_ns": int(hours * H), "gpu_count": gpus}


def test_shared_lost_time_is_split_not_added() -> None:
    summary = {
        "insights": [
            {"rule": "estimated_cost", "evidence": {"usd_per_hour": 2.0}},
            {"rule": "dataloader_stall", "gain_run_s": 1800.0, "fix": "more workers"},
            {"rule": "gpu_idle_between_steps", "gain_run_s": 1800.0},
        ],
        "gains": {"fix_all_run_s": 1800.0},  # both claim the same half hour
    }
    cost = run_cost(_run(2, 4), summary)
    assert cost is not None
    assert (cost.gpu_hours, cost.usd) == (8.0, 16.0)
    assert cost.lost_gpu_hours == pytest.approx(2.0)  # 0.5 h x 4 GPUs, once
    assert cost.by_rule == {
        "dataloader_stall": pytest.approx(1.0),
        "gpu_idle_between_steps": pytest.approx(1.0),
    }
    assert cost.lost_usd == pytest.approx(4.0)
    assert cost.fixes == {"dataloader_stall": "more workers"}


def test_without_a_gains_block_fix_all_is_worked_out_and_capped() -> None:
    found = [
        {"rule": "dataloader_stall", "gain_run_s": 7200.0, "gain_ms_per_iteration": 10.0,
         "gain_parts_ms": {"loader_wait": 10.0}, "gain_iteration_ms": 10.0, "gain_usd": None},
    ]  # fmt: skip
    cost = run_cost(_run(1, 1), {"insights": found})
    assert cost is not None
    assert cost.usd is None  # no cost line: unpriced
    assert cost.lost_gpu_hours == pytest.approx(1.0)  # 2 h claimed, the run had 1 GPU-hour
    assert sum(cost.by_rule.values()) == pytest.approx(1.0)


def test_a_run_without_an_end_has_no_row_and_a_cpu_run_no_hours() -> None:
    assert run_cost({"start_wall_ns": 0, "end_wall_ns": None, "gpu_count": 8}, {}) is None
    cpu = run_cost(_run(3, 0), {"gains": {"fix_all_run_s": 100.0}})
    assert cpu is not None and (cpu.gpu_hours, cpu.lost_gpu_hours, cpu.by_rule) == (0.0, 0.0, {})
