"""Packing the 2 Hz host and run CPU samples (gpuprofd.storage.upkeep.samplepack,
gpuprofd.storage.samplecodec) loses nothing and changes no figure, on each
backend: a group's report (each rank's summary and the group's, as
``gpuprofctl insights --format json`` prints them), the dashboard's series
and every other reader of those samples give the same bytes before and after;
the blocks not yet rolled and the newest samples stay rows; a sample stored for
a packed block later is read beside it."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import test_utils

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import samplecodec, schema
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.reads import context, samplerows, series
from gpuprofd.storage.samplecodec import HOST_COLUMNS, RUN_CPU_COLUMNS, Samples
from gpuprofd.storage.upkeep import hostrollup, samplepack, steprollup
from gpuprofd.storage.writes import Store, runsdb
from gpuprofd.views.runs import load_group, load_summary
from gpuprofd.web.app import build_app
from gpuprofd.web.state import WebState
from tests.daemon.storage.test_backends import open_store

S = 1_000_000_000
START = 5_000 * S
START_WALL = 1_796_000_000_000_000_000
SECONDS = 600
PACK_NS = 60 * S  # blocks of 120 samples here (the daemon's: 600 s)
BOOT = "boot-a"
GROUP = "job-1"


def _host_row(k: int) -> tuple[Any, ...]:
    """Sample *k* (2 Hz from 30 s before the runs): readings that change,
    with NULLs where a platform lacks one."""
    return (
        START - 30 * S + k * S // 2,
        (k * 37 % 1000) / 10 + 0.125,
        None if k % 211 == 7 else 8,
        float(k % 13) * 1e6,
        None if k % 5 == 0 else 100.0 + k % 7,
        None if k % 9 == 0 else (3 + k % 4) * 2**30,
        16 * 2**30 if k % 301 else 0,  # no total: no page cache fraction
        None if k % 3 else 0.5 * (k % 11),
    )


async def _write(store: Store) -> list[int]:
    ids = []
    for rank in range(2):
        ids.append(
            await runsdb.insert_run(
                store,
                {
                    "run_key": f"k{rank}",
                    "run_name": "packed",
                    "status": "running",
                    "host": "h",
                    "pid": 10 + rank,
                    "rank": rank,
                    "local_rank": rank,
                    "world_size": 2,
                    "local_world_size": 2,
                    "auto": 1,
                    "start_wall_ns": START_WALL,
                    "start_mono_ns": START,
                    "options": {},
                    "cpu_count": 8,
                    "boot_id": BOOT,
                    "group_id": GROUP,
                },
            )
        )
    for i in range(SECONDS * 2 - 4):
        for rank, run_id in enumerate(ids):
            t0 = START + i * S // 2 + 1_000_000
            dur = 400_000_000 + (i * 7919 % 97) * 1_000_000 * (1 + rank)
            phases = {"forward": dur // 3, "backward": dur // 2, "data": 5_000_000}
            msg = {"i": i, "t0": t0, "t1": t0 + dur, "wait": 20_000_000, "explicit": False,
                   "micro": 1, "phases": phases}  # fmt: skip
            store.submit_nowait(runsdb.step_op(run_id, msg))
    for k in range(2 * (SECONDS + 30 + 300)):  # on 5 min past the runs' end
        row = _host_row(k)
        store.submit_nowait(runsdb.host_sample_op(*row, BOOT))
        t = row[0]
        if not START <= t <= START + SECONDS * S:
            continue
        if k % 37:  # rank 0 lacks some ticks (its tree unreadable then)
            cores = None if k % 53 == 0 else 1.5 + (k % 17) / 8
            store.submit_nowait(runsdb.run_cpu_op(ids[0], t, cores))  # type: ignore[arg-type]
        store.submit_nowait(runsdb.run_cpu_op(ids[1], t, 0.75 + (k % 5) / 4))
    await store.flush()
    for run_id in ids:
        await runsdb.update_run(
            store, run_id, status="finished", end_mono_ns=START + SECONDS * S,
            end_wall_ns=START_WALL + SECONDS * S,
        )  # fmt: skip
    await store.flush()
    return ids


async def _reads(store: Store, ids: list[int]) -> bytes:
    """Every read of the samples, as bytes: the reports, the series API, the rest."""
    out: dict[str, Any] = {
        "summaries": [await load_summary(store, i) for i in ids],
        "group": await load_group(store, GROUP),
    }
    state = WebState(reader=store, devices=(), now_mono_ns=None)
    async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
        for i in ids:
            for q in ("width=50", "width=2000", "from=1796000000.2&to=1796000123.7&width=400",
                      "from=1796000580&to=1796000600&width=10"):  # fmt: skip
                resp = await client.get(f"/api/v1/runs/{i}/series?{q}")
                assert resp.status == 200, await resp.text()
                out[f"series {i} {q}"] = await resp.json()
    host = await context.host_columns(store, START, START + SECONDS * S, BOOT)
    out["host"] = [c.tolist() for c in host[:5]] + [host.means]
    for i in ids:
        cpu = await context.run_cpu_columns(store, i)
        out[f"cpu {i}"] = [c.tolist() for c in cpu]
        run = {"id": i, "group_id": GROUP, "host": "h", "boot_id": BOOT}
        out[f"job {i}"] = await context.job_cpu(store, run)
        out[f"after {i}"] = await series.host_samples_after(store, i, BOOT, START + 7 * S, 50)
        out[f"span {i}"] = await samplerows.span(
            store, samplerows.RUN_CPU, i, START, START + S * 99
        )
    for lo, hi in ((START, START + 100 * S), (START - 10 * S, START + 2_000 * S)):
        out[f"latest {lo}"] = await series.latest_host(store, BOOT, lo, hi)
    out["cores at"] = await series.run_cores_at(store, ids, START + 61 * S)
    return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


async def _count(store: Store, sql: str) -> int:
    row = await store.fetchone(sql)
    return int(row[0] or 0)


@contextlib.asynccontextmanager
async def _packing(monkeypatch: pytest.MonkeyPatch, url: str) -> AsyncIterator[Store]:
    monkeypatch.setattr(samplerows, "SAMPLE_PACK_NS", PACK_NS)
    monkeypatch.setattr(samplepack, "SAMPLE_PACK_NS", PACK_NS)
    monkeypatch.setattr(samplepack, "SAMPLES_RAW_KEPT_NS", 2 * PACK_NS)
    async with open_store(url) as store:
        yield store


async def test_packing_changes_no_report_series_or_figure(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _packing(monkeypatch, storage_url) as store:
        ids = await _write(store)
        await samplepack.pack_round(store)  # nothing rolled yet: only what no run holds
        assert await _count(store, "SELECT COUNT(*) FROM run_cpu_packs") == 0
        assert await _count(store, "SELECT MAX(t_max_ns) FROM host_packs") < START
        while await steprollup.roll_pass(store) or await hostrollup.roll_pass(store):
            pass
        before = await _reads(store, ids)
        stored = "SELECT (SELECT COUNT(*) FROM host_samples) + (SELECT SUM(n) FROM host_packs)"
        rows_before = await _count(store, stored)

        packed = await samplepack.pack_round(store)
        assert packed > 20 and await samplepack.pack_round(store) == 0
        host_packs = await _count(store, "SELECT COUNT(*) FROM host_packs")
        assert host_packs >= 10 and await _count(store, stored) == rows_before
        newest = await _count(store, "SELECT MAX(mono_ns) FROM host_samples")
        assert await _count(store, "SELECT MAX(t_max_ns) FROM host_packs") < newest - 2 * PACK_NS
        assert await _count(store, "SELECT COUNT(*) FROM run_cpu_packs") > 15
        after = await _reads(store, ids)
        assert after == before

        # a sample stored later for a packed block is read beside the pack
        late = (START + 123 * S + 1, 99.5, 8, 1.0, None, None, None, None)
        await store.write(
            "INSERT INTO host_samples (mono_ns, cpu_pct, cpu_count, disk_read_bps, "
            "disk_read_iops, page_cache_bytes, mem_total_bytes, swap_in_bps, boot_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*late, BOOT),
        )
        got = await samplerows.read(store, samplerows.HOST, BOOT, START + 123 * S, START + 124 * S)
        assert got.rows() == [_host_row(306), late, _host_row(307), _host_row(308)]


def test_codec_round_trip_keeps_values_nulls_and_types() -> None:
    rows = [_host_row(k) for k in range(500)]
    got = samplecodec.unpack(samplecodec.encode(HOST_COLUMNS, rows))
    assert got.rows() == rows
    assert [type(v) for v in got.rows()[7]] == [type(v) for v in rows[7]]
    edge = [
        (1, -0.0, 2**63 - 1, math.inf, None),
        (2, 1e-300, -(2**63), -math.inf, "text"),
        (2, None, None, 5e-324, 1.5),  # a repeated time, a NULL in each kind
    ]
    names = ("mono_ns", "a", "b", "c", "mixed")
    back = samplecodec.unpack(samplecodec.encode(names, edge)).rows()
    assert back == edge and math.copysign(1, back[0][1]) == -1.0
    assert type(back[2][4]) is float and type(back[0][0]) is int


@pytest.mark.parametrize("n", [0, 1, 2])
def test_codec_round_trips_edge_blocks(n: int) -> None:
    rows = [(10 + i * 500, None if i else 0.25) for i in range(n)]
    got = samplecodec.unpack(samplecodec.encode(RUN_CPU_COLUMNS, rows))
    assert got.rows() == rows and len(got) == n
    every_null = [(5, None), (6, None)]
    assert samplecodec.unpack(samplecodec.encode(RUN_CPU_COLUMNS, every_null)).rows() == every_null


def test_codec_refuses_a_damaged_block_and_an_unpackable_value() -> None:
    data = samplecodec.encode(RUN_CPU_COLUMNS, [(1, 1.0), (2, 2.0)])
    with pytest.raises(DatabaseError, match="damaged"):
        samplecodec.unpack(data[:-3])
    with pytest.raises(ValueError, match="not JSON"):
        samplecodec.encode(RUN_CPU_COLUMNS, [(1, b"bytes")])


def test_columns_concat_and_numbers() -> None:
    a = Samples.from_rows(RUN_CPU_COLUMNS, [(1, 1.0), (2, None)])
    b = Samples.from_rows(RUN_CPU_COLUMNS, [(3, 3)])  # an integer in a REAL column (SQLite)
    both = Samples.concat(RUN_CPU_COLUMNS, [a, b])
    assert both.rows() == [(1, 1.0), (2, None), (3, 3)]
    assert [None if math.isnan(v) else v for v in both.numbers("cores").tolist()] == [
        1.0,
        None,
        3.0,
    ]


async def test_a_block_stored_packed_reads_back_on_each_backend(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _packing(monkeypatch, storage_url) as store:
        ids = await _write(store)
        while await hostrollup.roll_pass(store):
            pass
        want = (await samplerows.read(store, samplerows.RUN_CPU, ids[0])).rows()
        host = (await samplerows.read(store, samplerows.HOST, BOOT)).rows()
        await samplepack.pack_round(store)
        assert (await samplerows.read(store, samplerows.RUN_CPU, ids[0])).rows() == want
        assert (await samplerows.read(store, samplerows.HOST, BOOT)).rows() == host
        assert any(r[1] is None for r in want) and any(r[4] is None for r in host)
        data = await store.fetchone("SELECT data FROM host_packs ORDER BY block LIMIT 1")
        block = samplecodec.unpack(data[0])
        assert block.rows() == host[: block.n]


async def test_a_live_run_carried_to_a_new_file_keeps_its_packed_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database file replaced under a live run (gpuprofd.storage.upkeep.dbrotate):
    its CPU packs and the boot's host packs of its span go with its rows and
    host rollups, and every sample of its span reads the same there."""
    import aiosqlite

    from gpuprofd.storage.upkeep import dbrotate

    old, new = tmp_path / "old.db", tmp_path / "new.db"
    async with _packing(monkeypatch, f"sqlite:///{old}") as store:
        ids = await _write(store)
        while await hostrollup.roll_pass(store):
            pass
        assert await samplepack.pack_round(store) > 20
        span = (START, START + SECONDS * S)
        want = [(await samplerows.read(store, samplerows.RUN_CPU, i)).rows() for i in ids]
        host = (await samplerows.read(store, samplerows.HOST, BOOT, *span)).rows()
    schema.prepare(new)
    async with aiosqlite.connect(old) as o, aiosqlite.connect(new) as n:
        moved = await dbrotate.write_live_runs(n, await dbrotate.read_live_runs(o, ids))
    async with open_reader(new) as reader:
        got = [(await samplerows.read(reader, samplerows.RUN_CPU, moved[i])).rows() for i in ids]
        assert got == want and len(want[1]) > 1_000
        assert (await samplerows.read(reader, samplerows.HOST, BOOT, *span)).rows() == host
        packs = await reader.fetchone("SELECT COUNT(*) AS n FROM run_cpu_packs")
        assert packs["n"] > 15


def test_an_older_database_reads_its_samples_and_gets_the_pack_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    schema.prepare(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE host_packs")
    conn.execute("DROP TABLE run_cpu_packs")
    conn.execute("UPDATE meta SET value = '23' WHERE key = 'schema_version'")
    rows = [_host_row(k) for k in range(30)]
    conn.executemany(
        "INSERT INTO host_samples (mono_ns, cpu_pct, cpu_count, disk_read_bps, disk_read_iops, "
        "page_cache_bytes, mem_total_bytes, swap_in_bps, boot_id) VALUES (?,?,?,?,?,?,?,?, NULL)",
        rows,
    )
    conn.executemany(
        "INSERT INTO run_cpu_samples (run_id, mono_ns, cores) VALUES (1, ?, ?)",
        [(r[0], r[1] / 10) for r in rows],
    )
    conn.commit()
    conn.close()

    async def read() -> tuple[list[Any], list[Any]]:
        async with open_reader(path) as reader:  # read-only: TEMP tables stand in
            host = await samplerows.read(reader, samplerows.HOST, None)
            cpu = await samplerows.read(reader, samplerows.RUN_CPU, 1, rows[3][0], rows[5][0])
            return host.rows(), cpu.rows()

    host, cpu = asyncio.run(read())
    assert host == rows and cpu == [(r[0], r[1] / 10) for r in rows[3:6]]
    schema.prepare(path)
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    kept = conn.execute("SELECT COUNT(*) FROM host_samples").fetchone()
    conn.close()
    assert version == (str(schema.SCHEMA_VERSION),) and kept == (30,)
    assert {"host_packs", "run_cpu_packs"} <= tables


async def test_retention_deletes_the_packs_with_the_rows(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A team server's retention: the ended runs' CPU packs go with them, and
    the boot's host packs no remaining run reaches with its host samples."""
    from gpuprofd.storage.upkeep import retention

    async with _packing(monkeypatch, storage_url) as store:
        await _write(store)
        while await hostrollup.roll_pass(store):
            pass
        assert await samplepack.pack_round(store) > 20
        runs, _ = await retention.apply_retention(store, START_WALL + 10 * SECONDS * S)
        left = [
            await _count(store, f"SELECT COUNT(*) FROM {t}")
            for t in ("run_cpu_packs", "run_cpu_samples", "host_packs", "host_samples")
        ]
    assert runs == 2 and left == [0, 0, 0, 0]


async def test_a_run_rolled_after_its_samples_were_packed_gets_the_same_rollups(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose span is packed before its host rollups are written (a run
    a team server receives late) is rolled from the packs: the rows the SQL
    over the samples wrote, value for value."""
    async with _packing(monkeypatch, storage_url) as store:
        ids = await _write(store)
        while await hostrollup.roll_pass(store):
            pass
        cols = hostrollup._COLUMNS  # not Postgres's rowid: a new row gets a new one
        sql = f"SELECT {cols} FROM host_rollups WHERE run_id = ? ORDER BY block"
        want = [tuple(r) for r in await store.fetchall(sql, (ids[0],))]
        assert await samplepack.pack_round(store) > 20
        await store.write("DELETE FROM host_rollups WHERE run_id = ?", (ids[0],))
        assert await series.host_packed(store, ids[0], BOOT, START, START + SECONDS * S)
        while await hostrollup.roll_pass(store):
            pass
        got = [tuple(r) for r in await store.fetchall(sql, (ids[0],))]
    assert len(want) == SECONDS // 10 and got == want


def test_bucket_sums_add_one_after_another_as_sql_sum_does() -> None:
    """The chart's buckets of packed samples sum as SQL's ``SUM`` adds rows
    (sequentially; Python 3.12's ``sum()`` compensates: 4.0 here)."""
    vals = [1e16, 1.0, -1e16, 3.0]  # the 1.0 is lost when added to 1e16 first
    empty = {"other_cores": None, "disk_read_bps": None, "page_cache_bytes": None}
    rows = [
        {"mono_ns": 10 + i, "cpu_count": 8, "run_cores": v, **empty} for i, v in enumerate(vals)
    ]
    (bucket,) = series.host_bucketed(rows, 0, 100)
    assert samplerows.sum_in_order(vals) == 3.0
    assert bucket["run_cores_sum"] == 3.0 and bucket["run_cores_n"] == 4
    assert bucket["other_cores_sum"] is None and bucket["other_cores_n"] == 0
