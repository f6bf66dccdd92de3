"""A damaged database file: found at gpuprofd's start, and said the same
way wherever it is met.

A file whose header is whole but whose pages are not (overwritten, a bad
disk, a copy taken while it was written) opens and answers its first
queries, then fails on some later write or read. So gpuprofd runs SQLite's
own check, ``PRAGMA quick_check`` (every page and row of every table, less
the index contents ``integrity_check`` adds), before it writes anything,
and refuses a damaged file (:func:`damaged`: exit status 2).

The check reads the whole file: 0.3 s for the 24-hour, 8-GPU database of
``bench/storage.py`` (docs/benchmarks.md), growing with the file. A restart
skips it when the file is exactly as the last clean stop left it
(:func:`left_clean`): that stop wrote the file's identity, size and change
times (:func:`note_clean`) to the socket directory. A crash, a reboot that
empties the socket directory, or anything else writing the file since
(``dd``, a copy put in its place) means a check.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sqlite3
from pathlib import Path

import orjson

from gpuprofd.core.errors import DatabaseError

log = logging.getLogger(__name__)

#: Problems ``quick_check`` lists at most: it stops there (a file in pieces
#: is not read to its end to say so).
MAX_PROBLEMS = 5
#: The file in the socket directory that a clean stop leaves (:func:`note_clean`).
CLEAN_STAMP = "gpuprofd.clean"
#: SQLite's result code for a damaged file (``SQLITE_CORRUPT``; its extended
#: codes share the low byte).
_SQLITE_CORRUPT = 11


def is_damage(exc: BaseException) -> bool:
    """Is *exc* SQLite finding the file damaged (not a bad query, a lock, a full disk)?"""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF == _SQLITE_CORRUPT
    return "malformed" in str(exc)


def damaged(path: Path, detail: str) -> DatabaseError:
    """The error for the damaged file *path*: what SQLite said (*detail*) and
    what to do (move it aside with its ``-wal``, which holds its last writes),
    the what-to-do early (a run's summary shows the first 300 characters)."""
    aside = path.with_name(path.name + ".damaged")
    files = [path] + [
        p for p in (path.with_name(path.name + s) for s in ("-wal", "-shm")) if p.exists()
    ]
    move = " ".join(shlex.quote(str(f)) for f in [*files, aside])
    return DatabaseError(
        f"{path} is damaged ({detail}). gpuprofd will not write to it: move it aside with "
        f"its -wal and -shm files (mkdir {shlex.quote(str(aside))} && mv {move}/) and the "
        "next start makes a new database; gpuprofctl reads what is still readable in the "
        "moved one"
    )


def quick_check(conn: sqlite3.Connection, path: Path) -> None:
    """SQLite's ``quick_check`` of *conn*'s file (*path*).

    Raises:
        DatabaseError: it is damaged (:func:`damaged`, naming the first problems).
    """
    try:
        rows = [r[0] for r in conn.execute(f"PRAGMA quick_check({MAX_PROBLEMS})")]
    except sqlite3.DatabaseError as exc:
        if not is_damage(exc):
            raise DatabaseError(f"{path} is not a usable SQLite database ({exc})") from None
        rows = [str(exc)]
    if rows == ["ok"]:
        return
    lines = (line.strip() for r in rows for line in str(r).splitlines())
    problems = [line for line in lines if line and not line.startswith("*** in database")]
    problems = problems or ["not ok"]
    more = ", and more" if len(problems) > 1 else ""
    raise damaged(path, f"SQLite's quick_check: {problems[0][:120]}{more}")


def _identity(path: Path) -> dict[str, int | str] | None:
    """What :func:`left_clean` compares: the file, its size and its change times."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {
        "db": str(path.absolute()),
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,  # no program can set it back
    }


def note_clean(stamp: Path, db: Path, file_id: tuple[int, int]) -> None:
    """After a clean stop: note in *stamp* that *db* is as gpuprofd left it,
    when it is still the file gpuprofd had open (*file_id*: ``(st_dev,
    st_ino)``); a file put in its place is checked at the next start."""
    now = _identity(db)
    if now is None or (now["dev"], now["ino"]) != file_id:
        return
    tmp = stamp.with_name(stamp.name + ".tmp")
    try:
        tmp.write_bytes(orjson.dumps(now))
        tmp.replace(stamp)
    except OSError as exc:  # the next start checks the file: slower, never wrong
        log.warning("cannot note the clean stop in %s (%s)", stamp, exc)


def left_clean(stamp: Path, db: Path) -> bool:
    """Is *db* exactly as the last clean stop left it (:func:`note_clean`)?
    The note is used once: it is removed here, so a crash before the next
    clean stop means a check."""
    try:
        noted = orjson.loads(stamp.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    finally:
        with contextlib.suppress(OSError):
            stamp.unlink()
    return noted == _identity(db)
