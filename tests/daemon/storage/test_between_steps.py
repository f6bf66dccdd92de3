"""The host time between steps (gpuprof.window.between_steps_ns) in every
read of a run's step series, on each backend: the charts' buckets, the
compare's step-index buckets, the live feed's rows and the step rollups
count it in the iteration and as its own ``between_steps`` part, from the
steps stored as rows (SQL) and packed (Python) alike."""

from __future__ import annotations

from typing import Any

import pytest

from gpuprof.window import between_steps_ns
from gpuprofd.storage.reads import series
from gpuprofd.storage.reads.steptotals import STEP_BLOCK
from gpuprofd.storage.upkeep import steppack, steprollup
from gpuprofd.storage.writes import Store, runsdb
from gpuprofd.web.series import CHART_PHASES, Buckets, merge_step_rollups
from tests.daemon.storage.test_backends import open_store, run_row

MS = 1_000_000
STEPS = 2_400
T0 = 10**12


def _t0(i: int) -> int:
    # 10 ms steps 12 ms apart (2 ms of it the timed loader wait); every 5th
    # step 40 ms more in the loop's own code (a sleep), every 50th evaluated
    return T0 + i * 12 * MS + (i // 5) * 40 * MS + (i // 50) * 3 * MS


def _step(i: int) -> dict[str, Any]:
    t0 = _t0(i)
    return {
        "i": i,
        "t0": t0,
        "t1": t0 + 10 * MS,
        "wait": 2 * MS,
        "explicit": i < 2_000,  # the last steps: a loop without a timed loader
        "micro": 1,
        "phases": {"forward": 3 * MS, "backward": 4 * MS},
        "skipped": False,
        "eval": 3 * MS if i % 50 == 0 else 0,
        "traced": False,
    }


def _want_between(i: int) -> int:
    s, prev = _step(i), (_step(i - 1)["t1"] if i else None)
    return between_steps_ns(prev, s["t0"], s["wait"], s["eval"], s["explicit"])


def test_the_definition() -> None:
    assert between_steps_ns(None, 50, 0, 0, True) == 0  # a first step
    assert between_steps_ns(10, 50, 5, 5, True) == 30
    assert between_steps_ns(10, 50, 5, 5, False) == 0  # the wait is that whole gap
    assert between_steps_ns(10, 50, 45, 0, True) == 0  # clocks overlapping: never < 0
    assert [_want_between(i) for i in (1, 4, 5, 6, 50, 2_000)] == [0, 0, 40 * MS, 0, 40 * MS, 0]


async def _fill(store: Store) -> int:
    run_id = await runsdb.insert_run(store, run_row())
    for i in range(STEPS):
        store.submit_nowait(runsdb.step_op(run_id, _step(i)))
    await store.flush()
    return run_id


async def _reads(store: Store, run_id: int) -> dict[str, Any]:
    hi = _t0(STEPS)
    return {
        "buckets": await series.step_buckets(store, run_id, T0, hi, 300 * MS),
        "late_buckets": await series.step_buckets(store, run_id, _t0(1_005), hi, 300 * MS),
        "by_index": await series.step_index_buckets(store, run_id, 10),
        "after": await series.steps_after(store, run_id, 1_004, 6),
        "last": await series.steps_last(store, run_id, 3),
    }


def _check(got: dict[str, Any]) -> None:
    after = got["after"]
    assert [r["step"] for r in after] == list(range(1_005, 1_011))
    for r in after:
        i = r["step"]
        assert r["between_steps"] == _want_between(i)
        assert r["iter"] == 12 * MS + _want_between(i)  # wait + between + step
        parts = sum(r[p] for p in series.CHART_PARTS)
        assert parts == pytest.approx(r["iter"])  # the parts stack to the iteration
    assert after[0]["between_steps"] == 40 * MS  # the first new step has its gap
    assert [r["between_steps"] for r in got["last"]] == [0, 0, 0]  # no timed loader
    first = got["buckets"][0]  # steps 0-14 (5 steps: 100 ms)
    n = first["n"]
    want = [12 * MS + _want_between(i) for i in range(n)]
    assert first["iter_mean"] == pytest.approx(sum(want) / n)
    assert (first["iter_min"], first["iter_max"]) == (min(want), max(want))
    assert first["between_steps"] == pytest.approx(sum(want) / n - 12 * MS)
    late = got["late_buckets"][0]  # a window's first step keeps its gap
    assert late["first_step"] == 1_005 and late["iter_max"] == 52 * MS
    by_index = got["by_index"]
    assert by_index[1]["step"] == 10 and by_index[1]["iter_max"] == 52 * MS
    assert by_index[1]["iter_mean"] == pytest.approx(12 * MS + 2 * 40 * MS / 10)


async def test_every_step_read_counts_the_time_between_steps_packed_or_not(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 200)
    async with open_store(storage_url) as store:
        run_id = await _fill(store)
        await steprollup.roll_pass(store)
        rows = await _reads(store, run_id)
        _check(rows)
        assert await steppack.pack_round(store) == 2  # blocks 0 and 1: packed
        packed = await _reads(store, run_id)
        _check(packed)
        assert packed == rows


async def test_the_step_rollups_count_it_in_the_iteration(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run_id = await _fill(store)
        await steprollup.roll_pass(store)
        rolled = await steprollup.rollup_rows(store, run_id, T0, _t0(STEPS))
        first = rolled[0]
        want = [12 * MS + _want_between(i) for i in range(first["n"])]
        assert first["n"] == STEP_BLOCK and first["iter_sum_ns"] == pytest.approx(sum(want))
        assert first["iter_max_ns"] == max(want) and first["iter_min_ns"] == 12 * MS
        # the chart's whole-run view of the blocks: the part between steps, stacking
        span = rolled[1]["t0_ns"] - T0  # one block a bucket
        merged = merge_step_rollups(rolled[:2], Buckets(T0, T0 + 2 * span, 2, span))
        assert merged[0]["between_steps"] == pytest.approx(sum(want) / STEP_BLOCK - 12 * MS)
        # steps 5, 10 ... 95 slept
        assert merged[0]["between_steps"] == pytest.approx(19 * 40 * MS / STEP_BLOCK)
        for m in merged:
            assert sum(m[p] for p in CHART_PHASES) == pytest.approx(m["iter_mean"])
