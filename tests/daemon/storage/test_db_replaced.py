"""The database file deleted or replaced under a running daemon, and
``gpuprofctl stop``: real daemon processes, real sockets, real SQLite."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import orjson

from gpuprof import config
from gpuprofd.ctl import main
from tests.daemon import helpers as h


def _rm_db(db: Path) -> None:
    """``rm gpuprof.db*``."""
    for p in db.parent.glob(db.name + "*"):
        p.unlink()


def _run(client: h.Client, key: str, name: str, pid: int, steps: int) -> dict:
    run_id = client.request(h.hello(key, pid, run_name=name))["run_id"]
    base = time.monotonic_ns()
    for i in range(steps):
        client.push(h.step(key, i, base))
    reply = client.request(h.bye(key, sent=steps))
    assert reply["ok"], reply
    return {"run_id": run_id, **reply["summary"]}


def _runs_json(db: Path, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["runs", str(db), "--format", "json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_db_deleted_between_runs_next_run_lands_in_a_fresh_db(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int, capsys
) -> None:
    db = tmp_path / "gpuprof.db"
    proc, client = daemons.start_ready(sock_dir, db)
    _run(client, "k1", "first", my_pid, 5)
    _rm_db(db)
    # no run open: the daemon notes it but makes no file (an rm must stick)
    client.wait_for(lambda r: r["db_file"] == "deleted")
    time.sleep(1.5)
    assert not db.exists()
    summary = _run(client, "k2", "second", my_pid, 7)
    assert summary["steps"] == 7
    assert db.exists()
    rows = _runs_json(db, capsys)
    assert [(r["run_name"], r["status"], r["steps"]) for r in rows] == [("second", "finished", 7)]
    assert rows[0]["id"] == summary["run_id"]
    ping = client.ping()
    assert ping["db_file"] == "ok"
    assert [e["was"] for e in ping["db_reopened"]] == ["deleted"]
    log = daemons.log(proc)
    assert "was deleted under gpuprofd" in log and "made a fresh database there" in log
    # the deleted run is not a history to compare against: no regression on 'second'
    assert not any(i["rule"] == "regression" for i in summary.get("insights", []))


def test_run_open_while_db_deleted_is_copied_into_the_fresh_db(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "gpuprof.db"
    proc, client = daemons.start_ready(sock_dir, db)
    _run(client, "old", "old", my_pid, 3)  # finished before the rm: stays deleted
    run_id = client.request(h.hello("live", my_pid, run_name="live"))["run_id"]
    base = time.monotonic_ns()
    for i in range(5):
        client.push(h.step("live", i, base))
    h.poll_db(db, "SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,), 5)
    _rm_db(db)
    # the periodic check makes the fresh file and copies the open run at once
    ping = client.wait_for(lambda r: r["db_reopened"], timeout_s=10)
    assert ping["db_reopened"][0]["runs_copied"] == [run_id]
    assert db.exists()
    for i in range(5, 9):
        client.push(h.step("live", i, base))
    reply = client.request(h.bye("live", sent=9))
    summary = reply["summary"]
    assert summary["steps"] == 9
    assert any("database file was deleted during this run" in n for n in summary["notes"])
    assert not any("not received" in n for n in summary["notes"])
    runs = h.query(db, "SELECT id, run_name, status FROM runs")
    assert [tuple(r) for r in runs] == [(run_id, "live", "finished")]
    steps = h.query(db, "SELECT step FROM steps WHERE run_id = ? ORDER BY step", (run_id,))
    assert [s[0] for s in steps] == list(range(9))
    assert h.query(db, "SELECT COUNT(*) FROM host_samples")[0][0] > 0
    assert "open runs copied into it: " + f"{run_id} 'live'" in daemons.log(proc)


def test_db_replaced_by_a_populated_one_gives_the_open_run_a_new_id(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "gpuprof.db"
    other = tmp_path / "other.db"
    _, client = daemons.start_ready(sock_dir, db)
    run_id = client.request(h.hello("live", my_pid, run_name="live"))["run_id"]
    base = time.monotonic_ns()
    for i in range(3):
        client.push(h.step("live", i, base))
    h.poll_db(db, "SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,), 3)
    # a copy of this database from before the run, with another run under the same id
    conn = sqlite3.connect(db)
    conn.execute("VACUUM INTO ?", (str(other),))
    conn.close()
    conn = sqlite3.connect(other)
    conn.execute("DELETE FROM steps")
    conn.execute("UPDATE runs SET run_key = 'theirs', run_name = 'theirs', status = 'finished'")
    conn.commit()
    conn.close()
    other.replace(db)
    ping = client.wait_for(lambda r: r["db_reopened"], timeout_s=10)
    assert ping["db_reopened"][0]["was"] == "replaced"
    client.push(h.step("live", 3, base))
    summary = client.request(h.bye("live", sent=4))["summary"]
    runs = {r[1]: r[0] for r in h.query(db, "SELECT id, run_name FROM runs")}
    assert runs["theirs"] == run_id and runs["live"] != run_id
    assert any(f"now run {runs['live']}" in n for n in summary["notes"])
    steps = h.query(db, "SELECT COUNT(*) FROM steps WHERE run_id = ?", (runs["live"],))
    assert steps[0][0] == 4


def test_gpuprofctl_stop_with_no_open_run_exits_now(
    daemons, sock_dir: Path, tmp_path: Path, capsys
) -> None:
    proc, _ = daemons.start_ready(sock_dir, tmp_path / "g.db")
    assert main(["stop", "--socket-dir", str(sock_dir)]) == 0
    assert f"gpuprofd pid {proc.pid} stopped" in capsys.readouterr().out
    assert proc.wait(timeout=20) == 0
    assert not (sock_dir / config.CONTROL_SOCKET_NAME).exists()
    # nothing there now: exit 3 with what to do
    assert main(["stop", "--socket-dir", str(sock_dir)]) == 3
    assert "no gpuprofd answering" in capsys.readouterr().err


def test_gpuprofctl_stop_waits_for_open_runs_or_exits_now(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int, capsys
) -> None:
    db = tmp_path / "g.db"
    proc, client = daemons.start_ready(sock_dir, db)
    client.request(h.hello("open", my_pid, run_name="open"))
    assert main(["stop", "--socket-dir", str(sock_dir)]) == 0
    assert "takes no new runs and exits once its 1 open run end" in capsys.readouterr().out
    refused = client.request(h.hello("new", my_pid, run_name="new"))
    assert refused["ok"] is False and "stopping" in refused["error"]
    assert client.ping()["stopping"] is True
    client.push(h.step("open", 0, time.monotonic_ns()))
    assert client.request(h.bye("open", sent=1))["summary"]["steps"] == 1
    assert proc.wait(timeout=20) == 0
    assert [tuple(r) for r in h.query(db, "SELECT run_name, status FROM runs")] == [
        ("open", "finished")
    ]

    proc, client = daemons.start_ready(sock_dir, db)
    client.request(h.hello("open2", my_pid, run_name="open2"))
    assert main(["stop", "--now", "--socket-dir", str(sock_dir), "--format", "json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert (out["exiting"], out["exited"], out["open_runs"]) == (True, True, 1)
    assert proc.wait(timeout=20) == 0
    status = h.query(db, "SELECT status FROM runs WHERE run_name = 'open2'")[0][0]
    assert status == "running"  # left for the next daemon to re-adopt


def test_a_forwarding_nodes_outbox_survives_its_database_being_deleted(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    """What the team server has not acknowledged goes into the fresh file
    with the node's id and sequence: nothing is lost, no number is reused."""
    db = tmp_path / "gpuprof.db"
    # a server that never answers (nothing listens on port 9): the outbox only grows
    env = {"GPUPROF_API_KEY": "k"}
    proc, client = daemons.start_ready(sock_dir, db, "--server", "http://127.0.0.1:9", env=env)
    _run(client, "old", "old", my_pid, 3)  # finished before the rm: its run row goes
    run_id = client.request(h.hello("live", my_pid, run_name="live"))["run_id"]
    base = time.monotonic_ns()
    for i in range(5):
        client.push(h.step("live", i, base))
    h.poll_db(db, "SELECT COUNT(*) FROM outbox WHERE kind = 'steps' AND run_id = ?", (run_id,), 5)
    (node_id,) = h.query(db, "SELECT value FROM meta WHERE key = 'node_id'")[0]
    waiting = [tuple(r) for r in h.query(db, "SELECT seq, kind, run_id FROM outbox ORDER BY seq")]
    _rm_db(db)
    client.wait_for(lambda r: r["db_reopened"], timeout_s=10)
    client.push(h.step("live", 5, base))
    h.poll_db(db, "SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,), 6)
    assert h.query(db, "SELECT value FROM meta WHERE key = 'node_id'")[0][0] == node_id
    now = [tuple(r) for r in h.query(db, "SELECT seq, kind, run_id FROM outbox ORDER BY seq")]
    assert now[: len(waiting)] == waiting  # every event still waiting, same numbers
    later = now[len(waiting) :]
    assert later and all(seq > waiting[-1][0] for seq, _, _ in later)
    assert ("steps", run_id) in {(k, r) for _, k, r in later}
    assert client.ping()["forward"]["outbox"]["events"] >= len(now)
