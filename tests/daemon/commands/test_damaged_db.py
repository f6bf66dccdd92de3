"""gpuprofctl on a database a real daemon wrote and something else then
damaged: text cells whose bytes are not UTF-8 (raw SQL, a bad disk) are
shown with U+FFFD and counted on stderr, every run still listed; pages
overwritten with garbage are one clear line and exit 2, never a traceback."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gpuprofd.ctl import main
from tests.daemon import helpers as h

#: What each damaged cell reads as: invalid bytes become U+FFFD.
BAD_NAME = "\ufffd\ufffdA"  # x'fffe41'


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Runs 1-3 (alpha, beta, gamma; 12 steps each, finished) as a real
    daemon stored them, the daemon stopped."""
    tmp = tmp_path_factory.mktemp("damaged")
    sock = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = h.Daemons(tmp)
    try:
        db = tmp / "g.db"
        proc, client = daemons.start_ready(sock, db)
        base = time.monotonic_ns()
        for key, name in (("a", "alpha"), ("b", "beta"), ("c", "gamma")):
            client.request(h.hello(key, os.getpid(), run_name=name))
            for i in range(12):
                client.push(h.step(key, i, base))
            assert client.request(h.bye(key, sent=12))["ok"]
        client.wait_for(lambda r: r["received"] == 36)
        assert daemons.stop(proc) == 0
        yield db
    finally:
        daemons.kill_all()
        shutil.rmtree(sock, ignore_errors=True)


def _copy(db: Path, tmp_path: Path) -> Path:
    out = tmp_path / "g.db"
    shutil.copy(db, out)
    return out


@pytest.fixture
def bad_cells(written: Path, tmp_path: Path) -> Path:
    """A copy whose run 2 name and run 3 host and project are not UTF-8, as
    raw SQL writes them (CAST(x'..' AS TEXT) stores the bytes as they are),
    nor run 3's user, a BLOB; run 2's tags a BLOB that is UTF-8."""
    db = _copy(written, tmp_path)
    conn = sqlite3.connect(db)
    conn.execute(
        "UPDATE runs SET run_name = CAST(x'fffe41' AS TEXT), "
        'tags = CAST(\'{"team": "a"}\' AS BLOB) WHERE id = 2'
    )
    conn.execute(
        "UPDATE runs SET host = CAST(x'c3' AS TEXT), project = CAST(x'80ff' AS TEXT), "
        "user_name = x'75ff' WHERE id = 3"
    )
    conn.commit()
    conn.close()
    return db


def _note(db: Path, cells: str, where: str) -> str:
    verb = "is" if cells.startswith("1 ") else "are"
    return (
        f"gpuprofctl: warning: {cells} in {db.absolute()} {verb} not UTF-8 ({where}): shown with "
        "\ufffd in place of the bytes that are not; they were written outside gpuprof, or "
        "the file is damaged"
    )


def test_the_runs_list_shows_every_run_and_counts_the_bad_cells(
    bad_cells: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(bad_cells), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    rows = orjson.loads(out)
    assert [(r["id"], r["run_name"]) for r in rows] == [(3, "gamma"), (2, BAD_NAME), (1, "alpha")]
    three = (rows[0]["host"], rows[0]["project"], rows[0]["user"])
    assert three == ("\ufffd", "\ufffd\ufffd", "u\ufffd")
    assert rows[1]["tags"] == {"team": "a"}  # a BLOB, but UTF-8: read as text, nothing to say
    where = "run 2: run_name; run 3: host, project, user_name"
    assert err.splitlines() == [_note(bad_cells, "4 text cells", where)]

    assert main(["runs", str(bad_cells)]) == 0
    out, err = capsys.readouterr()
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["gamma", BAD_NAME, "alpha"]
    assert len(err.splitlines()) == 1


def test_a_clean_database_says_nothing_on_stderr(
    written: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(written), "--format", "json"]) == 0
    assert len(orjson.loads(capsys.readouterr().out)) == 3
    assert main(["runs", str(written)]) == 0
    assert capsys.readouterr().err == ""


def test_insights_and_compare_name_only_the_runs_they_read(
    bad_cells: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["insights", str(bad_cells), "2", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert orjson.loads(out)["run_id"] == 2  # its summary, stored whole when it ended
    assert err.splitlines() == [_note(bad_cells, "1 text cell", "run 2: run_name")]

    assert main(["insights", str(bad_cells), "1"]) == 0  # run 1 is whole: nothing to say
    assert capsys.readouterr().err == ""

    assert main(["compare", str(bad_cells), "1", "3", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    got = orjson.loads(out)
    assert (got["a"]["run_name"], got["b"]["run_name"]) == ("alpha", "gamma")
    where = "run 3: host, project, user_name"
    assert err.splitlines() == [_note(bad_cells, "3 text cells", where)]


def test_a_kernel_name_not_utf8_is_shown_and_counted(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _copy(written, tmp_path)
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO kernel_windows (id, run_id, t0_ns, t1_ns, source, steps) "
        "VALUES (1, 1, 0, 1000000, 'snapshot', '[0]')"
    )
    conn.executemany(
        "INSERT INTO kernel_stats (window_id, run_id, name, kind, cls, count, total_ns, self_ns) "
        "VALUES (1, 1, ?, 'kernel', 'compute', 1, ?, ?)",
        [("gemm", 600_000, 600_000), (b"relu\xff", 300_000, 300_000)],  # bytes: a BLOB
    )
    conn.execute("UPDATE kernel_stats SET name = CAST(name AS TEXT) WHERE name = x'72656c75ff'")
    conn.commit()
    conn.close()
    assert main(["kernels", str(db), "1", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [k["name"] for k in orjson.loads(out)["kernels"]] == ["gemm", "relu\ufffd"]
    assert err.splitlines() == [_note(db, "1 text cell", "run 1: name")]


def test_options_that_are_not_json_do_not_hide_the_runs(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _copy(written, tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET options = '{' WHERE id = 2")
    conn.execute("UPDATE runs SET options = '[1]' WHERE id = 3")  # JSON, not an object
    conn.commit()
    conn.close()
    assert main(["runs", str(db), "--format", "json"]) == 0
    assert [r["id"] for r in orjson.loads(capsys.readouterr().out)] == [3, 2, 1]
    assert main(["insights", str(db), "2", "--format", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["run_id"] == 2


@pytest.fixture
def damaged_pages(written: Path, tmp_path: Path) -> Path:
    """A copy with bytes 8192-16383 (pages 3 and 4: the runs table's root)
    overwritten with garbage: the header still valid, the file still opens."""
    db = _copy(written, tmp_path)
    with db.open("r+b") as f:
        f.seek(8192)
        f.write(os.urandom(8192))
    return db


def test_reading_damaged_pages_is_one_line_naming_the_file_and_what_to_do(
    damaged_pages: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = damaged_pages.read_bytes()
    for args in (["runs"], ["insights"], ["compare", "1", "2"]):
        assert main([args[0], str(damaged_pages), *args[1:]]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(
            f"gpuprofctl: error: {damaged_pages.absolute()} is damaged (database disk image "
            "is malformed). gpuprofd will not write to it: move it aside with its -wal and -shm "
            f"files (mkdir {damaged_pages}.damaged && mv {damaged_pages} "
        ), err
    assert damaged_pages.read_bytes() == before  # reading never writes
