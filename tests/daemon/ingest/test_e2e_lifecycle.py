"""Daemon process lifecycle: lost runs, restart re-adoption, the single-instance
lock, idle exit, clean shutdown, and refusing a database that is not ours or
is damaged."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson

from gpuprof import config
from gpuprofd.ingest.runservice import LOST_NOTE
from gpuprofd.storage import filecheck
from tests.daemon import helpers as h


def _socket_files(sock_dir: Path) -> list[Path]:
    return [sock_dir / config.INGEST_SOCKET_NAME, sock_dir / config.CONTROL_SOCKET_NAME]


def test_run_whose_process_dies_without_bye_is_marked_lost(
    daemons, sock_dir: Path, tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    run_id = client.request(h.hello("doomed", child.pid))["run_id"]
    base = time.monotonic_ns()
    for i in range(5):
        client.push(h.step("doomed", i, base))
    client.wait_for(lambda r: r["received"] == 5)
    assert client.ping()["live_runs"][0]["pid"] == child.pid
    child.kill()
    child.wait()
    h.poll_db(db, "SELECT status FROM runs WHERE id = ?", (run_id,), "lost")
    assert client.wait_for(lambda r: r["live_runs"] == [])["live_runs"] == []
    h.poll_db(db, "SELECT summary IS NOT NULL FROM runs WHERE id = ?", (run_id,), 1)
    (row,) = h.query(db, "SELECT summary, received_events FROM runs WHERE id = ?", (run_id,))
    summary = orjson.loads(row["summary"])
    assert (summary["status"], summary["steps"], row["received_events"]) == ("lost", 5, 5)
    assert LOST_NOTE in summary["notes"]
    # late events of a lost run are dropped under their own reason
    client.push(h.step("doomed", 5, base))
    assert client.wait_for(lambda r: "run_ended" in r["dropped"])["dropped"]["run_ended"] == 1


def test_restart_keeps_live_runs_and_loses_dead_ones(
    daemons, sock_dir: Path, tmp_path: Path, child: subprocess.Popen[bytes], my_pid: int
) -> None:
    db = tmp_path / "g.db"
    first, client = daemons.start_ready(sock_dir, db)
    alive_id = client.request(h.hello("alive", my_pid, run_name="alive"))["run_id"]
    dead_id = client.request(h.hello("dead", child.pid, run_name="dead"))["run_id"]
    base = time.monotonic_ns()
    for i in range(7):
        client.push(h.step("alive", i, base))
    client.wait_for(lambda r: r["received"] == 7)

    assert daemons.stop(first) == 0
    assert not any(p.exists() for p in _socket_files(sock_dir))
    statuses = {r[0]: r[1] for r in h.query(db, "SELECT id, status FROM runs")}
    assert statuses == {alive_id: "running", dead_id: "running"}  # shutdown loses nothing
    child.kill()
    child.wait()

    second, client = daemons.start_ready(sock_dir, db)
    ping = client.ping()
    assert ping["live_runs"] == [
        {"run_id": alive_id, "run_name": "alive", "pid": my_pid, "steps": 7}
    ]
    assert h.query(db, "SELECT status FROM runs WHERE id = ?", (dead_id,))[0][0] == "lost"
    for i in range(7, 10):
        client.push(h.step("alive", i, base))
    reply = client.request(h.bye("alive", sent=10))
    assert reply["summary"]["steps"] == 10
    assert not any("not received" in n for n in reply["summary"]["notes"])
    assert second.poll() is None


def test_first_event_of_a_stored_running_run_re_adopts_it(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    """A run marked lost by mistake (its process still runs) comes back on its next event."""
    db = tmp_path / "g.db"
    first, client = daemons.start_ready(sock_dir, db)
    run_id = client.request(h.hello("phoenix", my_pid))["run_id"]
    assert daemons.stop(first) == 0
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET status = 'lost' WHERE id = ?", (run_id,))
    conn.commit()
    conn.close()
    _, client = daemons.start_ready(sock_dir, db)
    assert client.ping()["live_runs"] == []
    client.push(h.step("phoenix", 0, time.monotonic_ns()))
    ping = client.wait_for(lambda r: r["received"] == 1)
    assert [r["run_id"] for r in ping["live_runs"]] == [run_id]
    assert h.query(db, "SELECT status FROM runs WHERE id = ?", (run_id,))[0][0] == "running"


def test_two_daemons_racing_on_one_socket_dir_leave_exactly_one(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "g.db"
    a = daemons.start(sock_dir, db)
    b = daemons.start(sock_dir, db)
    deadline = time.monotonic() + 30
    while a.poll() is None and b.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    exited = [p for p in (a, b) if p.poll() is not None]
    assert len(exited) == 1 and exited[0].returncode == 0
    survivor = b if exited[0] is a else a
    client = daemons.client(sock_dir)
    assert client.wait_for(lambda r: True)["pid"] == survivor.pid
    assert "already running" in daemons.log(exited[0])


def test_a_second_daemon_on_the_same_database_refuses_to_serve_it(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    """Another socket dir, the same file under another name: it would adopt and
    then "lose" the first daemon's live runs, so it exits 2 instead."""
    import tempfile

    db = tmp_path / "g.db"
    (tmp_path / "sub").mkdir()
    first, _ = daemons.start_ready(sock_dir, db)
    other_dir = Path(tempfile.mkdtemp(prefix="gp2", dir="/tmp"))
    second = daemons.start(other_dir, tmp_path / "sub" / ".." / "g.db")
    assert second.wait(timeout=30) == 2
    assert "is already served by another gpuprofd" in daemons.log(second)
    assert first.poll() is None
    assert daemons.client(sock_dir).wait_for(lambda r: True)["pid"] == first.pid


def test_idle_exit_shuts_down_cleanly(daemons, sock_dir: Path, tmp_path: Path) -> None:
    proc, _ = daemons.start_ready(sock_dir, tmp_path / "g.db", "--idle-exit", "1")
    assert proc.wait(timeout=20) == 0
    assert not any(p.exists() for p in _socket_files(sock_dir))
    assert "idle for" in daemons.log(proc)


def test_sigterm_removes_sockets_and_a_new_daemon_can_start(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "g.db"
    first, _ = daemons.start_ready(sock_dir, db)
    assert all(p.exists() for p in _socket_files(sock_dir))
    assert daemons.stop(first) == 0
    assert not any(p.exists() for p in _socket_files(sock_dir))
    second, client = daemons.start_ready(sock_dir, db)
    assert client.ping()["pid"] == second.pid


def _run_daemon_once(sock_dir: Path, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuprofd", "--socket-dir", str(sock_dir), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_corrupt_database_exits_2_with_one_line(sock_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "bad.db"
    db.write_bytes(b"this is not an SQLite file\n" * 200)
    result = _run_daemon_once(sock_dir, db)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuprofd: error: ") and "not a usable SQLite database" in lines[0]
    assert not (sock_dir / config.CONTROL_SOCKET_NAME).exists()


def test_someone_elses_sqlite_database_exits_2(sock_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    result = _run_daemon_once(sock_dir, db)
    assert result.returncode == 2
    expected = f"gpuprofd: error: {db} is an SQLite database but not a gpuprof one"
    assert result.stderr.strip() == expected


def _write_one_run(daemons: h.Daemons, sock_dir: Path, db: Path, pid: int) -> None:
    """A daemon on *db* stores one finished 5-step run and stops cleanly."""
    proc, client = daemons.start_ready(sock_dir, db)
    client.request(h.hello("r", pid, run_name="whole"))
    base = time.monotonic_ns()
    for i in range(5):
        client.push(h.step("r", i, base))
    assert client.request(h.bye("r", sent=5))["ok"]
    assert daemons.stop(proc) == 0


def test_a_database_damaged_after_a_clean_stop_is_refused_at_start(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _write_one_run(daemons, sock_dir, db, my_pid)
    assert (sock_dir / filecheck.CLEAN_STAMP).exists()
    with db.open("r+b") as f:  # as `dd` over bytes 8192-16383: two pages, the header whole
        f.seek(8192)
        f.write(bytes(range(256)) * 32)
    before = db.read_bytes()
    result = _run_daemon_once(sock_dir, db)
    assert result.returncode == 2  # the systemd unit does not restart on 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"gpuprofd: error: {db} is damaged (SQLite's quick_check: "), line
    assert ". gpuprofd will not write to it: move it aside with its -wal and -shm files " in line
    assert f"(mkdir {db}.damaged && mv {db} {db}-wal" in line  # its last writes go with it
    assert db.read_bytes() == before
    assert not (sock_dir / config.CONTROL_SOCKET_NAME).exists()


def test_a_clean_restart_skips_the_check_and_a_crash_does_not(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _write_one_run(daemons, sock_dir, db, my_pid)
    first = daemons.procs[-1]
    assert "quick_check" not in daemons.log(first)  # a new file: nothing to check
    second, _ = daemons.start_ready(sock_dir, db)
    assert daemons.log(second).count("as gpuprofd left it at its last clean stop") == 1
    assert "quick_check" not in daemons.log(second)
    second.kill()  # no clean stop: the next start checks
    second.wait(timeout=10)
    third, _ = daemons.start_ready(sock_dir, db)
    assert f"checked {db} whole (SQLite's quick_check)" in daemons.log(third)
    assert "last clean stop" not in daemons.log(third)
