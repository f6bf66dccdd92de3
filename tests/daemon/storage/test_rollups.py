"""The team's GPU-hours (run_costs rows written when a run ends, summed by
SQL) against figures worked out by hand, on SQLite and the real Postgres:
totals, groups with their share and week-over-week trend, lost GPU-hours by
finding (two findings claiming the same lost time counted once), the worst
runs, the weekly bars; a late change to a run (its summary, its project)
corrects its row."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gpuprofd.storage.reads.rollups import WEEK_NS, rollup
from gpuprofd.storage.writes import costs, runsdb
from tests.daemon.storage.test_backends import open_store, run_row

H = 3600 * 10**9  # ns per hour
DAY = 24 * H
UNTIL = 2976 * 7 * DAY  # a multiple of a week: a digest period ends there
RATE = 4.0  # USD per GPU-hour (the cost line's)
FIXES = {"dataloader_stall": "Raise DataLoader num_workers"}


def _cost_line(rate: float | None) -> list[dict[str, Any]]:
    if rate is None:
        return []
    return [{"rule": "estimated_cost", "evidence": {"usd_per_hour": rate}, "gain_run_s": None}]


def _summary(fix_all_s: float, gains: dict[str, float], rate: float | None = RATE) -> str:
    found = [
        {"rule": r, "evidence": {}, "gain_run_s": s, "fix": FIXES.get(r)} for r, s in gains.items()
    ]
    return orjson.dumps(
        {"insights": _cost_line(rate) + found, "gains": {"fix_all_run_s": fix_all_s}}
    ).decode()


async def _run(
    store: Any, key: str, name: str, user: str, project: str | None, end: int, hours: float,
    gpus: int, summary: str | None, status: str = "finished",
) -> int:  # fmt: skip
    row = {**run_row(key, name), "user_name": user, "project": project, "gpu_count": gpus}
    row["start_wall_ns"] = end - int(hours * H)
    run_id = await runsdb.insert_run(store, row)
    await runsdb.update_run(store, run_id, status=status, end_wall_ns=end, summary=summary)
    return run_id


async def _fixture(store: Any) -> dict[str, int]:
    ids = {
        # 10 h x 8 GPUs = 80 GPU-h ($320); fix-all 1 h of run time = 8 GPU-h lost, claimed
        # by a loader stall (1 h) and the GPU idle it causes (0.75 h): 8 x 8/14 and 6 x 8/14
        "pretrain": await _run(
            store, "a", "pretrain", "alice", "llm", UNTIL - 3 * DAY, 10, 8,
            _summary(3600, {"dataloader_stall": 3600, "gpu_idle_between_steps": 2700}),
        ),
        # 2 h x 4 GPUs = 8 GPU-h ($32); 900 s x 4 GPUs = 1 GPU-h lost to the stall
        "sft": await _run(
            store, "b", "sft", "bob", "llm", UNTIL - DAY, 2, 4,
            _summary(900, {"dataloader_stall": 900}),
        ),
        # 1 h x 2 GPUs = 2 GPU-h, unpriced, nothing lost
        "resnet": await _run(
            store, "c", "resnet", "bob", "vision", UNTIL - 2 * DAY, 1, 2,
            _summary(0, {}, rate=None),
        ),
        # the week before: 5 h x 8 = 40 GPU-h, 2 h x 8 = 16 GPU-h lost to the stall
        "old": await _run(
            store, "d", "pretrain-old", "alice", "llm", UNTIL - 10 * DAY, 5, 8,
            _summary(7200, {"dataloader_stall": 7200}),
        ),
        # a month ago: outside both weeks
        "ancient": await _run(
            store, "e", "ancient", "carol", "llm", UNTIL - 30 * DAY, 1, 8, _summary(0, {}),
        ),
        # still running: no row
        "live": await _run(
            store, "f", "live", "alice", "llm", UNTIL - H, 1, 8, None, status="running",
        ),
    }  # fmt: skip
    assert await costs.refresh_runs(store, list(ids.values())) == 5
    return ids


STALL = 8 * 8 / 14 + 1.0
IDLE = 8 * 6 / 14


async def test_rollup_by_project_matches_the_hand_figures(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        ids = await _fixture(store)
        got = await rollup(store, "project", UNTIL - 7 * DAY, UNTIL)
        t = got["totals"]
        assert t["runs"] == 3
        assert t["gpu_hours"] == pytest.approx(90.0)
        assert t["usd"] == pytest.approx(352.0)  # the unpriced run adds none
        assert t["lost_gpu_hours"] == pytest.approx(9.0)
        assert t["lost_usd"] == pytest.approx(36.0)
        assert t["lost_share"] == pytest.approx(0.1)
        llm, vision = got["groups"]
        assert (llm["key"], llm["runs"], vision["key"], vision["runs"]) == ("llm", 2, "vision", 1)
        assert llm["gpu_hours"] == pytest.approx(88.0)
        assert llm["share"] == pytest.approx(88 / 90)
        assert llm["lost_gpu_hours"] == pytest.approx(9.0)
        assert llm["prev_gpu_hours"] == pytest.approx(40.0)
        assert llm["trend"] == pytest.approx((88 - 40) / 40)
        assert llm["lost_trend"] == pytest.approx((9 - 16) / 16)
        assert vision["usd"] is None and vision["trend"] is None
        assert vision["lost_gpu_hours"] == 0.0 and vision["worst_runs"] == []
        worst = [(r["id"], r["lost_gpu_hours"]) for r in llm["worst_runs"]]
        assert worst == [(ids["pretrain"], pytest.approx(8.0)), (ids["sft"], pytest.approx(1.0))]


async def test_lost_time_by_finding_is_counted_once(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        await _fixture(store)
        got = await rollup(store, "finding", UNTIL - 7 * DAY, UNTIL)
        stall, idle = got["groups"]
        assert (stall["rule"], stall["runs"], idle["rule"], idle["runs"]) == (
            "dataloader_stall", 2, "gpu_idle_between_steps", 1,
        )  # fmt: skip
        assert stall["lost_gpu_hours"] == pytest.approx(STALL)
        assert idle["lost_gpu_hours"] == pytest.approx(IDLE)
        # the findings' lost time adds up to the runs' (8 + 1), not to 8 + 6 + 1
        assert stall["lost_gpu_hours"] + idle["lost_gpu_hours"] == pytest.approx(9.0)
        assert stall["lost_usd"] == pytest.approx(STALL * RATE)
        assert stall["fix"] == "Raise DataLoader num_workers"
        assert idle["fix"] is None  # no finding of it said
        assert stall["lost_trend"] == pytest.approx((STALL - 16) / 16)


async def test_by_user_and_the_weekly_bars(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        await _fixture(store)
        got = await rollup(store, "user", UNTIL - 14 * DAY, UNTIL)
        by = {g["key"]: (g["runs"], g["gpu_hours"]) for g in got["groups"]}
        assert by == {"alice": (2, pytest.approx(120.0)), "bob": (2, pytest.approx(10.0))}
        older, newer = got["weeks"]
        assert (older["start_ns"], newer["start_ns"]) == (UNTIL - 2 * WEEK_NS, UNTIL - WEEK_NS)
        assert older["lost"] == {"dataloader_stall": pytest.approx(16.0)}
        assert newer["lost"] == {
            "dataloader_stall": pytest.approx(STALL),
            "gpu_idle_between_steps": pytest.approx(IDLE),
        }


async def test_a_late_change_corrects_the_runs_row(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        ids = await _fixture(store)
        # a late forward: the run's findings re-made (the stall alone, 2 h) and its project
        await runsdb.update_run(
            store,
            ids["pretrain"],
            project="vision",
            summary=_summary(7200, {"dataloader_stall": 7200}),
        )
        await costs.refresh_runs(store, [ids["pretrain"]])
        got = await rollup(store, "project", UNTIL - 7 * DAY, UNTIL)
        by = {g["key"]: (g["gpu_hours"], g["lost_gpu_hours"]) for g in got["groups"]}
        assert by == {
            "vision": (pytest.approx(82.0), pytest.approx(16.0)),
            "llm": (pytest.approx(8.0), pytest.approx(1.0)),
        }
        rows = await store.fetchall(
            "SELECT rule FROM run_cost_findings WHERE run_id = ?", (ids["pretrain"],)
        )
        assert [r["rule"] for r in rows] == ["dataloader_stall"]  # gpu_idle's row is gone


async def test_an_unknown_grouping_or_empty_period_is_refused(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        with pytest.raises(ValueError, match="by must be one of"):
            await rollup(store, "gpu", 0, 1)
        with pytest.raises(ValueError, match="period is empty"):
            await rollup(store, "user", 5, 5)


async def test_runs_stored_before_get_their_rows_once(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        ids = await _fixture(store)
        await store.write("DELETE FROM run_costs WHERE run_id = ?", (ids["sft"],))
        assert await costs.refresh_all(store, missing_only=True) == 1  # sft only
        assert await costs.refresh_all(store, missing_only=True) == 0
        got = await rollup(store, "project", UNTIL - 7 * DAY, UNTIL)
        assert got["totals"]["gpu_hours"] == pytest.approx(90.0)
