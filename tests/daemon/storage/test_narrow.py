"""Schema 22's narrow tables on both backends: a database written by schema 21
(wide GPU rollups, one row per DDP bucket) upgraded with all its data, and a
GPU second stored twice merged."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from gpuprofd.sampling import rollup
from gpuprofd.storage import reads, schema
from gpuprofd.storage.dialect import POSTGRES
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.url import parse
from gpuprofd.storage.writes import runsdb
from tests.daemon.helpers import open_store
from tests.daemon.storage.test_schema import SCHEMA_21_TABLES

S = 10**9
_DROP_22 = ("DROP VIEW gpu_rollups", "DROP TABLE gpu_seconds", "DROP TABLE gpus")
_DROP_22 += ("DROP TABLE comm_steps",)


def _rollup(sec: int, uuid: str, boot: str | None, n: int, util: tuple, **more: Any) -> tuple:
    """A rollup row (ROLLUP_COLUMNS order): util (min, mean, max) over *n* samples."""
    r: dict[str, Any] = dict.fromkeys(rollup.ROLLUP_COLUMNS)
    r.update(sec_ns=sec * S, uuid=uuid, boot_id=boot, n=n, idle_n=0, reasons_n=n, slow_n=0)
    r.update(util_min=util[0], util_mean=util[1], util_max=util[2], reasons_any=0)
    r.update(more)
    return tuple(r[c] for c in rollup.ROLLUP_COLUMNS)


#: Schema 21's rollups: GPU aaaa in boot b1 (second 2 stored twice: a daemon
#: restarted within it) and in no boot; GPU bbbb in b1.
OLD_ROLLUPS = [
    _rollup(1, "aaaa", "b1", 10, (50.0, 50.0, 50.0), power_mean_mw=100_000.5),
    _rollup(2, "aaaa", "b1", 10, (60.0, 60.0, 60.0), power_mean_mw=110_000.0),
    _rollup(2, "aaaa", "b1", 30, (70.0, 80.0, 90.0), power_mean_mw=120_000.0, reasons_any=4),
    _rollup(1, "aaaa", None, 5, (10.0, 10.0, 10.0), mem_total_bytes=8 * 2**30),
    _rollup(1, "bbbb", "b1", 1, (None, None, None)),
]
#: ... read back (sec_ns, uuid, boot_id, n, util min/mean/max, power, reasons), merged.
NEW_ROLLUPS = [
    (1 * S, "aaaa", None, 5, 10.0, 10.0, 10.0, None, 0),
    (1 * S, "aaaa", "b1", 10, 50.0, 50.0, 50.0, 100_000.5, 0),
    (2 * S, "aaaa", "b1", 40, 60.0, 75.0, 90.0, 117_500.0, 4),
    (1 * S, "bbbb", "b1", 1, None, None, None, None, 0),
]
_READ_ROLLUPS = (
    "SELECT sec_ns, uuid, boot_id, n, util_min, util_mean, util_max, power_mean_mw, "
    "reasons_any FROM gpu_rollups ORDER BY uuid, boot_key, sec_ns"
)
#: Schema 21's bucket rows of run 1 (step 1's index used twice, by a manual
#: loop); NULL: not given (a team server's rows may lack them).
OLD_BUCKETS = [
    (1, 0, 0, 100, 200, 1000),
    (1, 0, 1, 110, 210, 1000),
    (1, 0, 2, 120, 220, 1000),
    (1, 1, 0, 300, None, None),
    (1, 1, 0, 900, 950, 5),
]


def _old_rows(sql_of: Any) -> list[tuple[str, list[tuple]]]:
    cols = ", ".join(rollup.ROLLUP_COLUMNS)
    marks = ", ".join("?" * len(rollup.ROLLUP_COLUMNS))
    return [
        (sql_of(f"INSERT INTO gpu_rollups ({cols}) VALUES ({marks})"), OLD_ROLLUPS),
        (
            sql_of(
                "INSERT INTO comm_buckets (run_id, step, bucket, start_ns, end_ns, bytes) "
                "VALUES (?, ?, ?, ?, ?, ?)"
            ),
            OLD_BUCKETS,
        ),
    ]


async def _as_schema_21(url: str) -> None:
    """Today's empty database at *url* turned into one schema 21 wrote, with its rows."""
    run = (
        "INSERT INTO runs (id, run_key, run_name, status, options) "
        "VALUES (1, 'k', 'old', 'finished', '{}')"
    )
    version = "UPDATE meta SET value = '21' WHERE key = 'schema_version'"
    path = parse(url).path
    if path is not None:
        conn = sqlite3.connect(path)
        conn.executescript(";".join(_DROP_22) + ";" + SCHEMA_21_TABLES)
        conn.execute(run)
        conn.execute(version)
        for sql, rows in _old_rows(lambda s: s):
            conn.executemany(sql, rows)
        conn.commit()
        conn.close()
        return
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(";".join(_DROP_22) + ";" + POSTGRES.ddl(SCHEMA_21_TABLES))
        await conn.execute(run)
        await conn.execute(version)
        for sql, rows in _old_rows(POSTGRES.sql):
            await conn.executemany(sql, rows)
    finally:
        await conn.close()


async def _read(db: Any) -> tuple[list, list, dict]:
    rollups = [tuple(r) for r in await db.fetchall(_READ_ROLLUPS)]
    return rollups, await reads.comm_buckets(db, 1), await reads.comm_totals(db, 1)


_WANT_BUCKETS = [r[1:] for r in OLD_BUCKETS]
_WANT_TOTALS = {"steps": 2, "buckets": 5, "bytes": 3005.0}


async def test_a_schema_21_database_is_upgraded_with_all_its_rows(storage_url: str) -> None:
    async with open_store(storage_url):
        pass
    await _as_schema_21(storage_url)
    path = parse(storage_url).path
    if path is not None:  # gpuprofctl reads it as it is, the file untouched
        before = path.read_bytes()
        async with open_reader(path) as reader:
            rollups, buckets, totals = await _read(reader)
        assert path.read_bytes() == before
        assert sorted(rollups, key=lambda r: (r[1], r[2] or "", r[0])) == [
            (1 * S, "aaaa", None, 5, 10.0, 10.0, 10.0, None, 0),
            *[(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]) for r in _old_b1()],
            (1 * S, "bbbb", "b1", 1, None, None, None, None, 0),
        ]
        assert (buckets, totals) == (_WANT_BUCKETS, _WANT_TOTALS)
    async with open_store(storage_url) as store:  # the daemon upgrades it
        rollups, buckets, totals = await _read(store)
        version = await store.fetchone("SELECT value FROM meta WHERE key = 'schema_version'")
        gpus = await reads.series.sampled_gpus(store, "b1", 0, 10 * S)
    assert version[0] == str(schema.SCHEMA_VERSION)
    assert rollups == NEW_ROLLUPS
    assert (buckets, totals) == (_WANT_BUCKETS, _WANT_TOTALS)
    assert [g["uuid"] for g in gpus] == ["aaaa", "bbbb"]
    async with open_store(storage_url) as store:  # the old tables are dropped
        for table in ("gpu_rollups_21", "comm_buckets"):
            try:
                await store.fetchall(f"SELECT 1 FROM {table}")
            except Exception as exc:  # noqa: BLE001 - either backend's "no such table"
                assert table in str(exc) or "does not exist" in str(exc)
            else:
                raise AssertionError(f"{table} is still there")


def _old_b1() -> list[tuple]:
    """GPU aaaa's boot-b1 rows as schema 21 stored them (read as they are)."""
    cols = rollup.ROLLUP_COLUMNS
    want = ("sec_ns", "uuid", "boot_id", "n", "util_min", "util_mean", "util_max")
    want += ("power_mean_mw", "reasons_any")
    rows = [dict(zip(cols, r, strict=True)) for r in OLD_ROLLUPS if r[1] == "aaaa" and r[-1]]
    return [tuple(r[c] for c in want) for r in rows]


async def test_a_second_stored_twice_is_merged(storage_url: str) -> None:
    first = _rollup(7, "cccc", "b2", 4, (20.0, 30.0, 40.0), temp_max_c=50.0)
    again = _rollup(7, "cccc", "b2", 12, (10.0, 50.0, 60.0), temp_max_c=None, reasons_any=8)
    async with open_store(storage_url) as store:
        await store.submit(runsdb.rollup_op(first))
        await store.submit(runsdb.rollup_op(again))
        await store.submit(runsdb.rollup_op(_rollup(8, "cccc", "b2", 1, (5.0, 5.0, 5.0))))
        # every sample the same: the total is left out (the minimum says it), then merged
        await store.submit(runsdb.rollup_op(_rollup(9, "cccc", "b2", 2, (5.0, 5.0, 5.0))))
        await store.submit(runsdb.rollup_op(_rollup(9, "cccc", "b2", 2, (1.0, 3.0, 5.0))))
        await store.submit(runsdb.rollup_op(_rollup(10, "cccc", "b2", 3, (7.0, 7.0, 7.0))))
        await store.flush()
        totals = await store.fetchall("SELECT util_total FROM gpu_seconds ORDER BY sec_ns")
        rows = await store.fetchall(
            "SELECT sec_ns, n, util_min, util_mean, util_max, temp_max_c, reasons_any "
            "FROM gpu_rollups WHERE uuid = 'cccc' AND boot_key = 'b2' ORDER BY sec_ns"
        )
        (gpus,) = await store.fetchone("SELECT COUNT(*) FROM gpus")
    assert [tuple(r) for r in rows] == [
        (7 * S, 16, 10.0, 45.0, 60.0, 50.0, 8),
        (8 * S, 1, 5.0, 5.0, 5.0, None, 0),
        (9 * S, 4, 1.0, 4.0, 5.0, None, 0),
        (10 * S, 3, 7.0, 7.0, 7.0, None, 0),
    ]
    assert [r[0] for r in totals] == [45.0 * 16, None, 16.0, None]
    assert gpus == 1


async def test_reads_of_an_upgraded_sqlite_file_match_a_read_only_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    async with open_store(url):
        pass
    await _as_schema_21(url)
    async with open_reader(tmp_path / "g.db") as reader:
        window = ("aaaa", "b1", 0, 3 * S)
        ro = [dict(r) for r in await reader.fetchall(rollup.MERGED_SQL, window)]
    schema.prepare(tmp_path / "g.db")
    async with open_reader(tmp_path / "g.db") as reader:
        rw = [dict(r) for r in await reader.fetchall(rollup.MERGED_SQL, window)]
    assert ro == rw and rw[0]["n"] == 50 and rw[0]["util_mean"] == (500 + 600 + 2400) / 50


async def test_a_replaced_database_takes_the_live_runs_gpu_seconds_and_buckets(
    tmp_path: Path,
) -> None:
    """dbrotate: a live run's rows and the node's GPU seconds since it started
    go to the new file as they were (the view's rows, the unpacked buckets)."""
    import aiosqlite

    from gpuprofd.storage.upkeep import dbrotate
    from tests.daemon.helpers import insert_buckets, insert_rollups

    old, new = tmp_path / "old.db", tmp_path / "new.db"
    schema.prepare(old)
    schema.prepare(new)
    conn = sqlite3.connect(old)
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, options, start_mono_ns) "
        "VALUES (1, 'k', 'live', 'running', '{}', ?)",
        (2 * S,),
    )
    rows = [
        _rollup(1, "aaaa", "b1", 10, (1.0, 2.0, 3.0)),  # before the run: left behind
        _rollup(2, "aaaa", "b1", 10, (50.0, 50.0, 50.0), sm_limit_mhz=1980.0),
        _rollup(3, "aaaa", "b1", 10, (40.0, 45.5, 60.0), sm_limit_mhz=1980.0),
        _rollup(3, "bbbb", None, 0, (None, None, None), power_mean_mw=300_000.0),
    ]
    insert_rollups(conn, rows)
    insert_buckets(conn, OLD_BUCKETS)
    conn.commit()
    conn.close()
    async with aiosqlite.connect(old) as a, aiosqlite.connect(new) as b:
        ids = await dbrotate.write_live_runs(b, await dbrotate.read_live_runs(a, [1]))
    sql = f"SELECT {', '.join(rollup.ROLLUP_COLUMNS)} FROM gpu_rollups WHERE sec_ns >= ?"
    async with open_reader(old) as reader:
        want = [tuple(r) for r in await reader.fetchall(sql + " ORDER BY uuid, sec_ns", (2 * S,))]
        want_buckets = await reads.comm_buckets(reader, 1)
    async with open_reader(new) as reader:
        got = [tuple(r) for r in await reader.fetchall(sql + " ORDER BY uuid, sec_ns", (0,))]
        got_buckets = await reads.comm_buckets(reader, ids[1])
    assert len(want) == 3 and got == want
    assert got_buckets == want_buckets == [r[1:] for r in OLD_BUCKETS]
    means = {(r[0] // S, r[1]): (r[4], r[12], r[21]) for r in got}  # util, power, SM clock
    assert means == {
        (2, "aaaa"): (50.0, None, 1980.0),
        (3, "aaaa"): (45.5, None, 1980.0),
        (3, "bbbb"): (None, 300_000.0, None),
    }


async def test_merged_clock_reasons_are_every_mask_in_the_window_or_ed(storage_url: str) -> None:
    """MERGED_SQL ORs the distinct masks of the window's seconds (the GPU's,
    its boot's): one bit a second, a second without a mask, a mask repeated;
    another GPU's, another boot's and a later second's left out."""
    masks = {1: 0x1, 2: None, 3: 0x4, 4: 0x4, 5: 0x80000000, 6: 0x20}
    rows = [
        _rollup(s, "aaaa", "b1", 10, (50.0, 50.0, 50.0), reasons_any=m) for s, m in masks.items()
    ]
    rows += [
        _rollup(3, "bbbb", "b1", 10, (50.0, 50.0, 50.0), reasons_any=0x2),
        _rollup(3, "aaaa", "b2", 10, (50.0, 50.0, 50.0), reasons_any=0x8),
    ]
    async with open_store(storage_url) as store:
        for r in rows:
            store.submit_nowait(runsdb.rollup_op(r))
        await store.flush()
        got = await store.fetchone(rollup.MERGED_SQL, ("aaaa", "b1", 0, 6 * S))
        none = await store.fetchone(rollup.MERGED_SQL, ("aaaa", "b1", 1 * S, 2 * S))
    assert got["reasons_any"] == 0x1 | 0x4 | 0x80000000  # second 6 starts at the window's end
    assert got["n"] == 50
    assert none["reasons_any"] is None and none["n"] is None  # second 2 alone: no mask
