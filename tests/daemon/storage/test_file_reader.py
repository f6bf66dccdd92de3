"""gpuprofctl's SQLite reader: queries awaited together each get a connection
of their own (a bounded number), and each answers its own question."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import schema
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.sqlite import SqliteFileReader


def _db(tmp_path: Path) -> Path:
    db = tmp_path / "r.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    conn.executemany(
        "INSERT INTO run_cpu_samples (run_id, mono_ns, cores) VALUES (?, ?, ?)",
        [(run, t, float(run)) for run in range(1, 9) for t in range(1000)],
    )
    conn.commit()
    conn.close()
    return db


async def test_queries_awaited_together_each_read_their_own_rows(tmp_path: Path) -> None:
    sql = "SELECT SUM(cores) AS s, COUNT(*) AS n FROM run_cpu_samples WHERE run_id = ?"
    async with open_reader(_db(tmp_path)) as reader:
        assert isinstance(reader, SqliteFileReader)
        rows = await asyncio.gather(*(reader.fetchone(sql, (run,)) for run in range(1, 9)))
        assert [(r["s"], r["n"]) for r in rows] == [(1000.0 * run, 1000) for run in range(1, 9)]
        # eight at once, but no more connections than the cap
        assert reader._opened == SqliteFileReader.MAX_CONNECTIONS
        assert len(reader._free) == SqliteFileReader.MAX_CONNECTIONS


async def test_one_query_at_a_time_uses_one_connection(tmp_path: Path) -> None:
    async with open_reader(_db(tmp_path)) as reader:
        assert isinstance(reader, SqliteFileReader)
        for run in (1, 2, 3):
            row = await reader.fetchone("SELECT COUNT(*) AS n FROM runs WHERE id = ?", (run,))
            assert row["n"] == 0
        assert reader._opened == 1


async def test_a_bad_query_is_a_clear_error_and_frees_its_connection(tmp_path: Path) -> None:
    async with open_reader(_db(tmp_path)) as reader:
        assert isinstance(reader, SqliteFileReader)
        with pytest.raises(DatabaseError, match="damaged or incomplete"):
            await reader.fetchall("SELECT nothing FROM no_such_table")
        assert (reader._opened, len(reader._free)) == (1, 1)


async def test_rows_as_tuples_are_the_rows_values(tmp_path: Path) -> None:
    sql = "SELECT run_id, mono_ns, cores FROM run_cpu_samples WHERE run_id = ? ORDER BY mono_ns"
    async with open_reader(_db(tmp_path)) as reader:
        rows = await reader.fetchall(sql, (3,))
        tuples = await reader.fetchtuples(sql, (3,))
        again = await reader.fetchall(sql, (3,))  # the connection still gives Rows
    assert [type(r) for r in tuples[:1]] == [tuple]
    assert tuples == [tuple(r) for r in rows] and len(tuples) == 1000
    assert tuples[7] == (3, 7, 3.0)
    assert isinstance(again[0], sqlite3.Row) and again[0]["cores"] == 3.0


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a writable directory, the same directory seen read-only): a read-only
    bind mount where this process may mount (root), else the directory with
    its write bits off (root ignores those)."""
    src, seen = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    if os.geteuid() != 0:
        yield src, src
        src.chmod(0o755)
        return
    seen.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(src), str(seen)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount as root here: {mounted.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(seen)], check=True)
        yield src, seen
    finally:
        subprocess.run(["umount", str(seen)], check=False)


async def test_a_database_in_a_read_only_directory_is_read(
    tmp_path: Path, read_only_dir: tuple[Path, Path]
) -> None:
    src, seen = read_only_dir
    db = _db(tmp_path)
    # a copy of a daemon's file as an archive holds it: WAL mode, no -wal beside it
    with (
        contextlib.closing(sqlite3.connect(db)) as conn,
        contextlib.closing(sqlite3.connect(src / "archive.db")) as copy,
    ):
        conn.backup(copy)
        assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    if os.geteuid() != 0:
        src.chmod(0o555)
    assert not os.access(seen, os.W_OK)
    sql = "SELECT COUNT(*) AS n FROM run_cpu_samples"
    async with open_reader(seen / "archive.db") as reader:
        assert (await reader.fetchone(sql))["n"] == 8000
    assert sorted(p.name for p in seen.iterdir()) == ["archive.db"]  # nothing written beside it
