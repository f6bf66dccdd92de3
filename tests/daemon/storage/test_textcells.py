"""Text cells that are not UTF-8: decoded with U+FFFD on every SQLite
connection gpuprof opens, counted and named by run; Postgres refuses them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuprofd.storage import schema, textcells, unreadable
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.reads.queries import run_from_row
from gpuprofd.storage.textcells import Undecodable, UndecodedCells
from gpuprofd.storage.writes import runsdb
from tests.daemon.helpers import open_store


def _rows(sql: str) -> list[sqlite3.Row]:
    conn = textcells.connect(":memory:")
    conn.row_factory = sqlite3.Row
    return conn.execute(sql).fetchall()


def test_text_that_is_utf8_is_plain_text_and_other_bytes_are_replaced() -> None:
    conn = textcells.connect(":memory:")
    conn.execute("CREATE TABLE t (a TEXT, b TEXT, n INTEGER)")
    conn.execute("INSERT INTO t VALUES ('é', CAST(x'41ff' AS TEXT), 7)")
    conn.execute("INSERT INTO t VALUES ('', x'42fe', NULL)")
    rows = conn.execute("SELECT a, b, n FROM t").fetchall()
    assert rows == [("é", "A\ufffd", 7), ("", b"B\xfe", None)]  # a BLOB: bytes (see row)
    assert [type(v) for v in rows[0]] == [str, Undecodable, int]  # only the bad one marked
    assert conn.execute("SELECT b || '' FROM t LIMIT 1").fetchone() == ("A\ufffd",)


def test_a_row_reads_its_blobs_as_text_but_in_the_blob_columns() -> None:
    conn = textcells.connect(":memory:")
    conn.row_factory = textcells.row
    (row,) = conn.execute(
        "SELECT 4 AS id, 'k' AS run_key, x'fffe41' AS run_name, x'7b7d' AS tags, '' AS host, "
        "x'00ff' AS data, x'01ff' AS packed"
    ).fetchall()
    assert tuple(row) == (4, "k", "\ufffd\ufffdA", "{}", "", b"\x00\xff", b"\x01\xff")
    assert run_from_row(row)["tags"] == {}
    cells = UndecodedCells()
    cells.add([row])  # the BLOB that is not UTF-8 counts; the one that is does not
    assert cells.describe() == "run 4: run_name"
    conn.row_factory = None  # plain tuples (the bulk reads of numbers) are left as read
    assert conn.execute("SELECT x'ff'").fetchall() == [(b"\xff",)]


def test_the_blob_columns_are_those_of_the_schema(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    blobs = {
        col[1]
        for t in tables
        for col in conn.execute(f"PRAGMA table_info({t})")
        if col[2].upper() == "BLOB"
    }
    assert blobs == textcells.BLOB_COLUMNS


def test_cells_are_named_by_their_run_once_each() -> None:
    cells = UndecodedCells()
    runs_row = "SELECT 2 AS id, 'k' AS run_key, CAST(x'ff' AS TEXT) AS run_name"
    cells.add(_rows(runs_row))
    cells.add(_rows(runs_row))  # read again: the same cell
    cells.add(_rows("SELECT 3 AS run_id, CAST(x'ff' AS TEXT) AS name, 'ok' AS kind"))
    assert (len(cells), cells.describe()) == (2, "run 2: run_name; run 3: name")


def test_a_row_that_names_no_run_is_counted_by_column() -> None:
    cells = UndecodedCells()
    # an id without run_key is some other table's (gpus, kernel_windows): not a run
    cells.add(_rows("SELECT 5 AS id, CAST(x'ff' AS TEXT) AS uuid"))
    cells.add(_rows("SELECT 5 AS id, CAST(x'ff' AS TEXT) AS uuid"))
    conn = textcells.connect(":memory:")
    cells.add(conn.execute("SELECT CAST(x'ff' AS TEXT), 'ok'").fetchall())  # plain tuples
    assert len(cells) == 3
    assert cells.describe() == "rows without a run id: ? (1), uuid (2)"
    # plain tuples with their columns' names: named as rows are
    cells.add(conn.execute("SELECT 7, CAST(x'ff' AS TEXT)").fetchall(), ["run_id", "phases"])
    assert cells.describe() == "run 7: phases; rows without a run id: ? (1), uuid (2)"


def test_no_cells_when_every_cell_decodes() -> None:
    cells = UndecodedCells()
    cells.add(_rows("SELECT 2 AS id, 'k' AS run_key, 'fine' AS run_name"))
    assert (len(cells), bool(cells)) == (0, False)


async def test_a_file_reader_notes_the_cells_of_what_it_read(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    async with open_store(str(db)) as store:
        for key in ("a", "b"):
            row = {"run_key": key, "run_name": key, "status": "finished", "options": {}}
            await runsdb.insert_run(store, row)
        await store.flush()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET run_name = CAST(x'ff' AS TEXT) WHERE id = 2")
    conn.commit()
    conn.close()
    with unreadable.collecting() as lost:
        async with open_reader(db) as reader:
            assert (await reader.fetchone("SELECT * FROM runs WHERE id = 1"))["run_name"] == "a"
            assert not lost
            got = await reader.fetchone("SELECT * FROM runs WHERE id = 2")
            assert got["run_name"] == "\ufffd"
    assert lost.text.describe() == "run 2: run_name"
    async with open_reader(db) as reader:  # outside a read that counts: read all the same
        assert (await reader.fetchone("SELECT * FROM runs WHERE id = 2"))["run_name"] == "\ufffd"


async def test_postgres_refuses_text_that_is_not_utf8(pg_url: str) -> None:
    """Why only SQLite needs the decoding: a UTF8 database (the default
    encoding) never stores such bytes, whatever SQL writes them."""
    import asyncpg

    async with open_store(pg_url) as store:
        row = {"run_key": "k", "run_name": "a", "status": "finished", "options": {}}
        await runsdb.insert_run(store, row)
        await store.flush()
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("SHOW server_encoding") == "UTF8"
        for sql in (
            r"UPDATE runs SET run_name = E'\xff\xfeA'",
            r"UPDATE runs SET run_name = convert_from('\xfffe41'::bytea, 'UTF8')",
        ):
            with pytest.raises(asyncpg.CharacterNotInRepertoireError):
                await conn.execute(sql)
        assert await conn.fetchval("SELECT run_name FROM runs") == "a"
    finally:
        await conn.close()
