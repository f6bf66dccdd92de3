"""gpuprofctl on a database written by a real daemon, and against a live one."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gpuprof.summary import format_summary
from gpuprofd.commands.insights import LIVE_NOTE
from gpuprofd.ctl import main
from tests.daemon import helpers as h


@pytest.fixture(scope="module")
def real_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A DB with run 1 finished (12 steps) and run 2 still running (3 steps)."""
    tmp = tmp_path_factory.mktemp("ctl")
    sock = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = h.Daemons(tmp)
    try:
        db = tmp / "g.db"
        proc, client = daemons.start_ready(sock, db)
        client.request(h.hello("done", os.getpid(), run_name="baseline"))
        base = time.monotonic_ns()
        for i in range(12):
            client.push(h.step("done", i, base))
        assert client.request(h.bye("done", sent=12, dropped=2))["ok"]
        client.request(h.hello("live", os.getpid(), run_name="ongoing"))
        for i in range(3):
            client.push(h.step("live", i, base))
        client.wait_for(lambda r: r["received"] == 15)
        assert daemons.stop(proc) == 0
        yield db
    finally:
        daemons.kill_all()
        for p in sock.iterdir():
            p.unlink()
        sock.rmdir()


def test_runs_json_has_exact_breakdown(real_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(real_db), "--format", "json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)
    assert [(r["id"], r["run_name"], r["status"], r["steps"]) for r in rows] == [
        (2, "ongoing", "running", 3), (1, "baseline", "finished", 12),
    ]  # fmt: skip
    done = rows[1]
    # phases 3/4/2 ms of a 10 ms step; wait 8 ms of an 18 ms iteration
    assert done["phase_pct"] == {"forward": 30.0, "backward": 40.0, "optimizer": 20.0,
                                 "other": 10.0}  # fmt: skip
    assert done["loader_wait_pct"] == 44.4
    assert done["dropped_events"] == 2
    assert done["median_step_ms"] == 18.0
    assert rows[0]["median_step_ms"] == 18.0  # running: computed from its steps


def test_runs_text_table(real_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(real_db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "STEPS", "MEDIAN_MS", "FWD%", "BWD%",
                                "OPT%", "OTHER%", "WAIT%", "DROPPED"]  # fmt: skip
    assert lines[2].split() == ["1", "baseline", "finished", "12", "18.0", "30.0", "40.0", "20.0",
                                "10.0", "44.4", "2"]  # fmt: skip


def test_insights_prints_the_stored_summary(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = orjson.loads(h.query(real_db, "SELECT summary FROM runs WHERE id = 1")[0][0])
    assert main(["insights", str(real_db), "1"]) == 0
    assert capsys.readouterr().out == format_summary(stored, details=True) + "\n"
    assert main(["insights", str(real_db), "1", "--format", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == stored
    assert "2 events dropped in the training process" in stored["notes"]


def test_insights_defaults_to_latest_run_and_builds_a_live_summary(
    real_db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPROF_DB", str(real_db))
    assert main(["insights", "--format", "json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert (summary["run_id"], summary["run_name"], summary["status"], summary["steps"]) == (
        2, "ongoing", "running", 3,
    )  # fmt: skip
    assert summary["notes"] == [LIVE_NOTE]


def test_missing_db_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.db"
    assert main(["insights", str(missing)]) == 2
    assert main(["runs", str(missing)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"gpuprofctl: error: no database at {missing} (run a script under gpuprof.profile() "
        "first, or pass the path)"
    ] * 2
    assert not missing.exists()  # read-only: nothing created


def test_corrupt_and_foreign_dbs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = tmp_path / "c.db"
    corrupt.write_bytes(b"\x00garbage" * 500)
    foreign = tmp_path / "f.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    assert main(["runs", str(corrupt)]) == 2
    assert main(["insights", str(foreign)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "not a usable SQLite database" in err[0]
    assert err[1] == f"gpuprofctl: error: {foreign} is an SQLite database but not a gpuprof one"


def test_unknown_run_id_exits_2(real_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["insights", str(real_db), "99"]) == 2
    assert capsys.readouterr().err == "gpuprofctl: error: no run with id 99 in this database\n"


def test_status_without_daemon_exits_3(sock_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--socket-dir", str(sock_dir)]) == 3
    assert capsys.readouterr().err == f"gpuprofctl: error: no gpuprofd answering on {sock_dir}\n"


def test_status_with_a_silent_socket_times_out_exit_3(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import zmq

    from gpuprof import config

    ctx = zmq.Context()
    mute = ctx.socket(zmq.ROUTER)  # binds but never answers
    mute.bind(config.control_endpoint(sock_dir))
    try:
        t0 = time.monotonic()
        assert main(["status", "--socket-dir", str(sock_dir), "--timeout", "0.3"]) == 3
        assert time.monotonic() - t0 < 5
    finally:
        mute.close(0)
        ctx.term()
    assert "no gpuprofd answering" in capsys.readouterr().err


def test_status_with_daemon(
    daemons, sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], my_pid: int
) -> None:
    proc, client = daemons.start_ready(sock_dir, tmp_path / "g.db")
    client.request(h.hello("st", my_pid, run_name="watched"))
    client.push(b"junk")
    client.wait_for(lambda r: r["dropped"])
    assert main(["status", "--socket-dir", str(sock_dir), "--format", "json"]) == 0
    reply = orjson.loads(capsys.readouterr().out)
    assert reply["pid"] == proc.pid and reply["dropped"] == {"not_json": 1}
    assert reply["live_runs"][0]["run_name"] == "watched"
    assert main(["status", "--socket-dir", str(sock_dir)]) == 0
    out = capsys.readouterr().out
    assert f"gpuprofd pid {proc.pid}" in out and "not_json=1" in out and "watched" in out


def test_version_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprofd import __version__

    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"gpuprof {__version__}\n"
    assert main(["insights", "x.db", "not-a-number"]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["--help"]) == 0
