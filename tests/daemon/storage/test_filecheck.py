"""A damaged database file: refused by the check before anything is written
to it (its -wal neither), and the note of a clean stop that lets a restart
skip the check only while the file is exactly as that stop left it."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import filecheck, schema


def _file_id(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _crashed_copy(tmp_path: Path) -> Path:
    """A gpuprof database and its -wal (holding commits not yet in the
    file) as a crash leaves them: copied while their writer is still open."""
    src = tmp_path / "src" / "g.db"
    src.parent.mkdir(parents=True)
    schema.prepare(src)
    conn = sqlite3.connect(src)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(50):
        conn.execute(
            "INSERT INTO runs (run_key, run_name, status) VALUES (?, 'r', 'finished')", (f"k{i}",)
        )
        conn.commit()
    out = tmp_path / "crash" / "g.db"
    out.parent.mkdir()
    for name in ("g.db", "g.db-wal"):
        shutil.copy(src.with_name(name), out.with_name(name))
    conn.close()
    return out


def test_a_damaged_file_is_refused_and_nothing_is_written_to_it(tmp_path: Path) -> None:
    db = _crashed_copy(tmp_path)
    wal = db.with_name("g.db-wal")
    assert wal.stat().st_size > 0
    schema.prepare(db)  # whole: accepted, and its -wal written into the file
    assert not wal.exists()

    db = _crashed_copy(tmp_path / "again")
    wal = db.with_name("g.db-wal")
    with db.open("r+b") as f:  # pages 3-4, the header whole
        f.seek(8192)
        f.write(bytes(range(256)) * 32)
    before = (db.read_bytes(), wal.read_bytes())
    with pytest.raises(DatabaseError) as err:
        schema.prepare(db)
    assert str(err.value).startswith(f"{db} is damaged (SQLite's quick_check: ")
    assert f"mkdir {db}.damaged && mv {db} {wal} " in str(err.value)
    assert (db.read_bytes(), wal.read_bytes()) == before  # not even a checkpoint


def test_not_sqlite_is_said_as_before(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    db.write_bytes(b"not a database\n" * 300)
    with pytest.raises(DatabaseError, match="is not a usable SQLite database"):
        schema.prepare(db)


def test_a_clean_stop_lets_the_next_start_skip_the_check_once(tmp_path: Path) -> None:
    db, stamp = tmp_path / "g.db", tmp_path / filecheck.CLEAN_STAMP
    schema.prepare(db)
    filecheck.note_clean(stamp, db, _file_id(db))
    assert filecheck.left_clean(stamp, db)
    assert not stamp.exists()
    assert not filecheck.left_clean(stamp, db)  # used once: a crash after it means a check


def test_a_file_written_since_the_clean_stop_is_checked(tmp_path: Path) -> None:
    db, stamp = tmp_path / "g.db", tmp_path / filecheck.CLEAN_STAMP
    schema.prepare(db)
    filecheck.note_clean(stamp, db, _file_id(db))
    st = os.stat(db)
    with db.open("r+b") as f:  # same size, its modification time put back: ctime still tells
        f.seek(8192)
        f.write(b"\0" * 16)
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(db).st_mtime_ns == st.st_mtime_ns
    assert not filecheck.left_clean(stamp, db)


def test_no_note_for_a_file_put_in_place_of_the_one_open(tmp_path: Path) -> None:
    db, stamp = tmp_path / "g.db", tmp_path / filecheck.CLEAN_STAMP
    schema.prepare(db)
    was_open = _file_id(db)
    moved_in = tmp_path / "other.db"
    schema.prepare(moved_in)
    moved_in.replace(db)
    filecheck.note_clean(stamp, db, was_open)
    assert not stamp.exists()
    assert not filecheck.left_clean(stamp, db)


def test_only_damage_is_damage() -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.OperationalError) as bad_query:
        conn.execute("SELECT * FROM nowhere")
    assert not filecheck.is_damage(bad_query.value)
    assert filecheck.is_damage(sqlite3.DatabaseError("database disk image is malformed"))
    assert not filecheck.is_damage(OSError("disk full"))


async def test_the_daemons_reads_of_a_damaged_file_are_the_same_clear_error(
    tmp_path: Path,
) -> None:
    from gpuprofd.core.counters import DropCounter
    from gpuprofd.storage.writes import Store

    db = _crashed_copy(tmp_path)
    schema.prepare(db)
    with db.open("r+b") as f:  # damaged while it is served: the start's check is past
        f.seek(8192)
        f.write(bytes(range(256)) * 32)
    store = Store(db, DropCounter())
    await store.open()
    try:
        with pytest.raises(DatabaseError, match=r"is damaged \(database disk image is malformed\)"):
            await store.fetchall("SELECT * FROM runs")
    finally:
        await store.close()
