"""A run's step aggregates from the ``step_totals`` tier (its blocks added up
and its steps after them) equal those computed from every step, on each
backend: traced steps, a first step that is not index 0 by time,
collectives, torch memory, evaluation and skipped updates; a running run's
complete blocks only; an ended run's last block once its summary is stored."""

from __future__ import annotations

from typing import Any

import pytest

from gpuprofd.storage import reads
from gpuprofd.storage.reads import steptotals
from gpuprofd.storage.upkeep import steprollup
from gpuprofd.storage.writes import Store, runsdb
from tests.daemon.storage.test_backends import open_store, run_row

STEPS = 1_234


def _step(i: int) -> dict[str, Any]:
    t0 = 10**12 + i * 10_000_000 + (i % 7) * 1000
    phases: dict[str, int] = {"forward": 2_000_000 + i, "backward": 3_000_000 + 2 * i}
    if i % 3 == 0:
        phases["comm"] = 400_000 + i
    if i % 5 == 0:
        phases["data"] = 100_000
    msg: dict[str, Any] = {
        "i": i,
        "t0": t0,
        "t1": t0 + 8_000_000 + (i % 11) * 10_000,
        "wait": 1_000_000 + (i % 13) * 1000,
        "explicit": False,
        "micro": 1 + i % 2,
        "phases": phases,
        "skipped": i % 97 == 0,
        "eval": 5_000_000 if i % 250 == 0 else 0,
        "traced": i % 200 == 17,
    }
    if i % 10 == 0:
        msg["mem"] = [10**9 + i, 2 * 10**9 + i, 3 * 10**9 + (i * 7919) % 10**6]
    return msg


async def _raw(store: Store, run_id: int) -> dict[str, Any]:
    sql = reads.overview_sql(store.dialect, "WHERE run_id = ?")
    return dict(await store.fetchone(sql, (run_id,)))


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k
        assert type(got[k]) is type(v) or v is None, k


async def test_totals_equal_the_steps_figures(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run_id = await runsdb.insert_run(store, run_row())
        # the first step by time is index 1 (index 0 started later)
        early = {**_step(1), "t0": 10**12 - 10**9, "t1": 10**12 - 10**9 + 8_000_000}
        for msg in (_step(0), early, *map(_step, range(2, STEPS))):
            store.submit_nowait(runsdb.step_op(run_id, msg))
        await store.flush()
        want = await _raw(store, run_id)
        traced = sum(1 for i in range(STEPS) if i % 200 == 17)
        assert (want["steps"], want["counted_steps"]) == (STEPS, STEPS - 1 - traced)

        await steprollup.roll_pass(store)  # running: the complete blocks 0-11
        n = await store.fetchone("SELECT COUNT(*) AS n, MAX(block) AS b FROM step_totals")
        assert (n["n"], n["b"]) == (12, 11)
        _same((await reads.run_overview(store, run_id))["agg"], want)  # + the raw tail

        await runsdb.update_run(store, run_id, status="finished")
        await store.flush()
        await steprollup.roll_pass(store)  # ended, no summary yet: late events may come
        assert (await store.fetchone("SELECT MAX(block) AS b FROM step_totals"))["b"] == 11
        await runsdb.update_run(store, run_id, summary="{}")
        await store.flush()
        await steprollup.roll_pass(store)
        n = await store.fetchone("SELECT COUNT(*) AS n, SUM(steps) AS s FROM step_totals")
        assert (n["n"], n["s"]) == (13, STEPS)
        _same((await reads.run_overview(store, run_id))["agg"], want)
        (listed,) = await reads.runs_overview(store)
        _same(listed["agg"], want)


async def test_the_runs_list_mixes_rolled_and_unrolled_runs(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        rolled = await runsdb.insert_run(store, {**run_row("a"), "group_id": "g"})
        short = await runsdb.insert_run(store, {**run_row("b"), "group_id": "g"})
        empty = await runsdb.insert_run(store, run_row("c"))
        for i in range(250):
            store.submit_nowait(runsdb.step_op(rolled, _step(i)))
        for i in range(40):
            store.submit_nowait(runsdb.step_op(short, _step(i)))
        await store.flush()
        want = {r: await _raw(store, r) for r in (rolled, short)}
        await steprollup.roll_pass(store)
        n = await store.fetchall("SELECT run_id, COUNT(*) AS n FROM step_totals GROUP BY run_id")
        assert [(r["run_id"], r["n"]) for r in n] == [(rolled, 2)]
        for group in (None, "g"):
            got = {r["id"]: r["agg"] for r in await reads.runs_overview(store, group)}
            assert set(got) == ({rolled, short, empty} if group is None else {rolled, short})
            for r in (rolled, short):
                _same(got[r], want[r])
            assert got.get(empty) is None
        agg = await reads.step_aggregates(store, [short, empty])
        assert set(agg) == {short}
        _same(agg[short], want[short])


def test_combining_blocks_and_a_tail() -> None:
    blocks = {c: 2 if c in steptotals.INTEGERS else 1.5 for c in steptotals.COLUMNS}
    blocks.update(run_id=3, mem_peak_bytes=None, mem_reserved_max_bytes=9)
    tail = {**blocks, "mem_peak_bytes": 4, "mem_reserved_max_bytes": 2}
    got = steptotals.combine(blocks, tail)
    assert got["steps"] == 4 and type(got["steps"]) is int and got["wait_ns"] == 3.0
    assert (got["mem_peak_bytes"], got["mem_reserved_max_bytes"]) == (4, 9)
    assert steptotals.combine(blocks, None)["wait_ns"] == 1.5
