"""Packing a run's older steps (gpuprofd.storage.upkeep.steppack) loses
nothing and changes no read, on each backend: every reader of steps
(gpuprofd.storage.reads.steprows and the reads over it) gives the same
before and after; the recent window and the blocks not yet in both tiers
stay rows; a step stored for a packed block later is read beside it; an
older database gets the table and keeps its steps."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuprofd.storage import reads, schema, unreadable
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.reads import groups, queries, series, steprows
from gpuprofd.storage.upkeep import backlog, steppack, steprollup
from gpuprofd.storage.writes import Store, runsdb
from tests.daemon.storage.test_backends import open_store, run_row
from tests.daemon.storage.test_steptotals import _step

STEPS = 3_500


async def _fill(store: Store) -> int:
    run_id = await runsdb.insert_run(store, run_row())
    for i in range(STEPS):
        msg = _step(i)
        if i % 400 == 3:
            msg["optimizers"] = [{"name": "adam", "updates": 1, "skipped": 0, "ns": 70 + i}]
        store.submit_nowait(runsdb.step_op(run_id, msg))
    await store.flush()
    # rows the protocol does not send but a database may hold: NULL phases and t1
    await store.write(
        "UPDATE steps SET phases = NULL, t1_ns = NULL WHERE run_id = ? AND step IN (5, 1500)",
        (run_id,),
    )
    return run_id


async def _everything(store: Store, run_id: int) -> dict[str, Any]:
    t0 = 10**12
    hi = t0 + STEPS * 10_000_000
    return {
        "rows": await steprows.rows(store, run_id),
        "columns": (await steprows.columns(store, run_id)).rows(),
        "window": await steprows.rows(
            store, run_id, first_step=900, last_step=2100, t0_from=t0 + 950 * 10**7
        ),
        "context": await reads.run_steps(store, run_id),
        "by_rows": [queries.step_from_row(r) for r in await steprows.rows(store, run_id)],
        "count": await reads.count_steps(store, run_id),
        "max": await reads.max_step(store, run_id),
        "t1": await reads.last_step_end(store, run_id),
        "history": await reads.history_iterations(store, run_id),
        "tail": await groups.group_tail(store, run_id, 2_500),
        "buckets": await series.step_buckets(store, run_id, t0, hi, 50 * 10**7),
        "by_index": await series.step_index_buckets(store, run_id, 100),
        "after": await series.steps_after(store, run_id, 990, 30),
        "last": await series.steps_last(store, run_id, 20),
        "since": [await series.steps_since(store, run_id, s) for s in (-1, 1_000, 1_500, 3_499)],
        "first": await series.steps_after(store, run_id, -1, 5),
        "worst": await reads.worst_iteration_ns(store, run_id, 3),
        "agg": (await reads.run_overview(store, run_id))["agg"],
    }


def _fields_match_the_steps(f: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    """The columnar fields hold what each step's dict does."""
    assert f["t0"].tolist() == [s["t0"] for s in steps]
    assert f["t1"].tolist() == [s["t1"] or 0 for s in steps]
    assert f["wait"].tolist() == [s["wait"] for s in steps]
    assert f["micro"].tolist() == [s["micro"] for s in steps]
    assert f["step"].tolist() == [s["step"] for s in steps] and f["numbered"]
    assert f["traced"].tolist() == [bool(s.get("traced")) for s in steps]
    assert f["skipped"].tolist() == [s["skipped"] for s in steps]
    assert f["eval"].tolist() == [s["eval"] for s in steps]
    assert f["has_mem"].tolist() == ["mem" in s for s in steps]
    assert f["mem_peak"].tolist() == [s["mem"][2] if "mem" in s else 0 for s in steps]
    assert f["mem_reserved"].tolist() == [s["mem"][1] if "mem" in s else 0 for s in steps]
    for name in ("forward", "backward", "comm", "data"):
        assert f["phases"][name].tolist() == [s["phases"].get(name, 0) for s in steps]
        assert f["has_phase"][name].tolist() == [name in s["phases"] for s in steps]
    assert list(f["optimizers"]) == [s["optimizers"] for s in steps if s["optimizers"]]
    assert len(f["optimizers"]) == 9


def _same(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12), where
    else:
        assert got == want, where


async def test_packing_loses_nothing_and_changes_no_read(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 1_000)
    async with open_store(storage_url) as store:
        run_id = await _fill(store)
        assert await steppack.pack_round(store) == 0  # nothing rolled yet: nothing packed
        await steprollup.roll_pass(store)
        before = await _everything(store, run_id)
        assert before["context"] == before["by_rows"]  # columns and rows: the same dicts
        assert before["count"] == STEPS and before["rows"][5][0] == 5
        assert before["rows"][5][6] is None and before["rows"][5][2] is None
        assert before["rows"][403][9] is not None and before["rows"][17][13] == 1

        # index 3,499: rows from 2,500 on stay; blocks 0 and 1 (rolled) are packed
        assert await steppack.pack_round(store) == 2
        assert await steppack.pack_round(store) == 0
        packs = await store.fetchall(
            "SELECT block, n, first_step, last_step FROM step_packs ORDER BY block"
        )
        assert [tuple(p) for p in packs] == [(0, 1000, 0, 999), (1, 1000, 1000, 1999)]
        raw = await store.fetchone("SELECT COUNT(*) AS n, MIN(step) AS lo FROM steps")
        assert (raw["n"], raw["lo"]) == (STEPS - 2000, 2000)
        _same(await _everything(store, run_id), before)
        _fields_match_the_steps(
            queries.step_fields(await steprows.columns(store, run_id)), before["context"]
        )

        # a late step of a packed block stays a row, read beside the pack
        late = {**_step(10), "i": 10, "t0": 10**12 + 10 * 10**7 + 5, "t1": 10**12 + 10**8 + 9}
        store.submit_nowait(runsdb.step_op(run_id, late))
        await store.flush()
        assert await steppack.pack_round(store) == 0
        assert len(await steprows.columns(store, run_id)) == STEPS + 1
        got = await steprows.rows(store, run_id, first_step=10, last_step=10)
        first = next(r[1] for r in before["rows"] if r[0] == 10)
        assert [(r[0], r[1]) for r in got] == [(10, late["t0"]), (10, first)]  # by t0
        assert await reads.count_steps(store, run_id) == STEPS + 1


async def test_a_backlog_is_packed_in_rounds_until_none_is_left_or_the_budget_is_spent(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three packable blocks, rounds of one: no budget packs only the first
    round's; a budget packs the other two in one call, and stops after a round
    that packed less than its most."""
    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 500)
    async with open_store(storage_url) as store:
        await _fill(store)
        await steprollup.roll_pass(store)
        assert await backlog.pack_backlog(steppack.pack_round, store, 0.0, 1) == 1
        assert await backlog.pack_backlog(steppack.pack_round, store, 60.0, 1) == 2
        assert await backlog.pack_backlog(steppack.pack_round, store, 60.0, 1) == 0
        packed = await store.fetchall("SELECT block FROM step_packs ORDER BY block")
        assert [p["block"] for p in packed] == [0, 1, 2]


async def test_the_first_step_stays_uncounted_in_later_totals(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's first step (packed with block 0) is not taken for the first
    row left: blocks totalled after packing count every step they hold."""
    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 100)
    async with open_store(storage_url) as store:
        run_id = await runsdb.insert_run(store, run_row())
        for i in range(1_300):
            store.submit_nowait(runsdb.step_op(run_id, _step(i)))
        await store.flush()
        await steprollup.roll_pass(store)
        assert await steppack.pack_round(store) == 1
        for i in range(1_300, 1_500):
            store.submit_nowait(runsdb.step_op(run_id, _step(i)))
        await store.flush()
        await steprollup.roll_pass(store)
        totals = await store.fetchone(
            "SELECT counted_steps AS c, steps AS n FROM step_totals WHERE block = 13"
        )
        traced = sum(1 for i in range(1_300, 1_400) if i % 200 == 17)
        assert (totals["n"], totals["c"]) == (100, 100 - traced)


def test_an_older_database_gets_the_table_and_keeps_its_steps(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    schema.prepare(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE step_packs")
    conn.execute("UPDATE meta SET value = '21' WHERE key = 'schema_version'")
    conn.execute("INSERT INTO runs (id, run_key, run_name, status) VALUES (1, 'k', 'n', 'x')")
    conn.executemany(
        "INSERT INTO steps (run_id, step, t0_ns, t1_ns, phases) VALUES (1, ?, ?, ?, ?)",
        [(i, 10 * i, 10 * i + 5, '{"forward": 3}') for i in range(20)],
    )
    conn.commit()
    conn.close()

    async def read() -> tuple[int, list[Any]]:
        async with open_reader(path) as reader:  # read-only: a TEMP table stands in
            return await reads.count_steps(reader, 1), await steprows.rows(reader, 1)

    import asyncio

    n, rows = asyncio.run(read())
    assert n == 20 and rows[3][:3] == (3, 30, 35) and rows[3][6] == {"forward": 3}
    schema.prepare(path)
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    kept = conn.execute("SELECT COUNT(*) FROM steps").fetchone()
    conn.close()
    assert version == (str(schema.SCHEMA_VERSION),) and "step_packs" in tables and kept == (20,)


async def test_a_forwarded_run_packs_and_a_resend_of_packed_steps_is_stored_once(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a team server (batches applied, then its rollup and packing
    passes), steps sent again under a new sequence after their block was
    packed are found in the pack, not stored twice."""
    from gpuprofd.storage.writes import apply_batch, validate
    from tests.daemon.batches import batch, new_uuid, run_event, steps_event

    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 100)
    run = new_uuid()
    async with open_store(storage_url) as store:
        events = [run_event(1, run)] + [steps_event(2 + k, run, k * 200, n=200) for k in range(7)]
        await apply_batch(store, validate(batch("n1", events)))
        run_id = (await store.fetchone("SELECT id FROM runs"))[0]
        before = await steprows.rows(store, run_id)
        await steprollup.roll_pass(store)
        assert await steppack.pack_round(store) == 1  # index 1,399: block 0 packed
        got = await apply_batch(store, validate(batch("n1", [steps_event(9, run, 300, n=40)])))
        assert got.applied == 1
        assert await reads.count_steps(store, run_id) == 1_400
        _same(await steprows.rows(store, run_id), before)


async def test_a_block_with_unreadable_phases_stays_rows(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 100)
    async with open_store(storage_url) as store:
        run_id = await runsdb.insert_run(store, run_row())
        for i in range(2_300):
            store.submit_nowait(runsdb.step_op(run_id, _step(i)))
        await store.flush()
        await steprollup.roll_pass(store)  # (its SQL refuses such a row: damaged since)
        await store.write("UPDATE steps SET phases = 'not json' WHERE step = 7")
        assert await steppack.pack_round(store) == 1  # block 1; block 0 left as rows
        left = await store.fetchone("SELECT COUNT(*) AS n FROM steps WHERE step < 1000")
        packs = await store.fetchall("SELECT block FROM step_packs")
        assert left["n"] == 1000 and [p[0] for p in packs] == [1]
        with unreadable.collecting() as lost:  # read: that step's phases as NULL, counted
            got = await steprows.rows(store, run_id)
        assert len(got) == 2_300 and got[7][6] is None and got[8][6] is not None
        assert lost.values == {(run_id, "steps.phases", 7)}


async def test_a_live_run_carried_to_a_new_file_keeps_its_packed_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database file replaced under a live run (gpuprofd.storage.upkeep.dbrotate):
    its packs go with its rows, rollups and totals, and read the same there."""
    import aiosqlite

    from gpuprofd.storage.upkeep import dbrotate

    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 100)
    old = tmp_path / "old.db"
    async with open_store(f"sqlite:///{old}") as store:
        run_id = await runsdb.insert_run(store, run_row())
        for i in range(1_300):
            store.submit_nowait(runsdb.step_op(run_id, _step(i)))
        await store.flush()
        await steprollup.roll_pass(store)
        assert await steppack.pack_round(store) == 1
        before = await steprows.rows(store, run_id)
        agg = (await reads.run_overview(store, run_id))["agg"]
    new = tmp_path / "new.db"
    schema.prepare(new)
    async with aiosqlite.connect(old) as o, aiosqlite.connect(new) as n:
        ids = await dbrotate.write_live_runs(n, await dbrotate.read_live_runs(o, [run_id]))
    async with open_reader(new) as reader:
        _same(await steprows.rows(reader, ids[run_id]), before)
        _same((await reads.run_overview(reader, ids[run_id]))["agg"], agg)
