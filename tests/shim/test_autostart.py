"""Auto-starting a daemon when hello finds none: the spawn command is
injected (a tiny script that binds a ROUTER and answers hello and bye), so
these tests never depend on the real gpuprofd."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gpuprof
from gpuprof_shim import autostart, control, messages
from gpuprof_shim.identity import Ranks

FAKE_DAEMON = textwrap.dedent(
    """
    import os, sys, time
    import orjson, zmq
    from gpuprof.config import control_endpoint
    from gpuprof.protocol import decode
    args = sys.argv[1:]
    socket_dir = args[args.index("--socket-dir") + 1]
    db = args[args.index("--db") + 1]
    print("fake daemon up", args, flush=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    time.sleep(float(os.environ.get("FAKE_DAEMON_DELAY", "0")))
    sock.bind(control_endpoint(socket_dir))
    # after the bye: serve on a while (the test's teardown kills it). Exiting at
    # once would drop the reply on a loaded host: close() lingers 2 s at most
    # for the reply to go out, and a starved I/O thread may not send it in time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        frames = sock.recv_multipart()
        msg = decode(frames[-1], channel="control")
        if msg["type"] == "hello":
            reply = {"ok": True, "run_id": 42, "db": db, "daemon_pid": os.getpid(),
                     "notes": []}
        else:
            reply = {"ok": True, "summary": {"run_id": 42, "run_name": "spawned",
                     "status": msg["status"], "steps": 0, "avg_step_ms": None,
                     "db": db, "insights": [], "notes": ["spawned fake"]}}
        sock.send_multipart([*frames[:-1], orjson.dumps(reply)])
        if msg["type"] == "bye":
            deadline = min(deadline, time.monotonic() + 10)
    sock.close(linger=2000)
    ctx.term()
    """
)


@pytest.fixture
def fake_daemon_argv(tmp_path: Path):
    script = tmp_path / "fake_gpuprofd.py"
    script.write_text(FAKE_DAEMON)

    def argv(socket_dir: Path, db: Path, server: str | None = None) -> list[str]:
        return [sys.executable, str(script), "--socket-dir", str(socket_dir), "--db", str(db)]

    yield argv
    for proc in autostart.spawned_processes():  # never leave a child behind
        proc.kill()
        proc.wait(5)


def hello_for(socket_dir: Path):
    msg = messages.hello(
        run_key="k1",
        run_name="r",
        pid=os.getpid(),
        host="h",
        ranks=Ranks(),
        wall_ns=time.time_ns(),
        mono_ns=time.monotonic_ns(),
        auto=False,
        options={},
        cuda_uuid=None,
        argv=None,
    )

    def hello():
        raw = control.request(None, f"ipc://{socket_dir}/control.sock", msg, 500)
        return control.parse_hello_reply(raw)

    return hello


def test_spawns_the_daemon_and_retries_hello_until_it_answers(
    socket_dir, fake_daemon_argv, monkeypatch
):
    monkeypatch.setenv("FAKE_DAEMON_DELAY", "0.4")  # binds only after a few retries
    target = socket_dir / "sub"  # not created yet: autostart creates it 0700
    argv = fake_daemon_argv(target, socket_dir / "x.db")
    reply = autostart.start_and_hello(hello_for(target), target, argv, wait_s=30.0)
    assert reply is not None and reply["ok"] and reply["run_id"] == 42
    (proc,) = autostart.spawned_processes()
    assert reply["daemon_pid"] == proc.pid
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert os.getsid(proc.pid) == proc.pid  # detached: its own session
    log_text = (target / "gpuprofd.log").read_text()
    assert "fake daemon up" in log_text


def test_gives_up_soon_after_the_spawned_process_dies(socket_dir):
    argv = [sys.executable, "-c", "raise SystemExit(3)"]
    t = time.monotonic()
    reply = autostart.start_and_hello(
        hello_for(socket_dir), socket_dir, argv, wait_s=10.0, exit_grace_s=0.3
    )
    elapsed = time.monotonic() - t
    assert reply is None
    assert elapsed < 3.0  # not the full 10 s wait
    assert autostart.spawned_processes() == []  # exited child reaped


def test_gives_up_after_the_wait_budget(socket_dir, fake_daemon_argv, monkeypatch):
    monkeypatch.setenv("FAKE_DAEMON_DELAY", "20")  # alive but never binds in time
    argv = fake_daemon_argv(socket_dir, socket_dir / "x.db")
    t = time.monotonic()
    reply = autostart.start_and_hello(hello_for(socket_dir), socket_dir, argv, wait_s=0.6)
    assert reply is None
    assert 0.5 < time.monotonic() - t < 3.0


def test_unstartable_command_returns_none(socket_dir):
    reply = autostart.start_and_hello(
        hello_for(socket_dir), socket_dir, [str(socket_dir / "no-such-binary")]
    )
    assert reply is None


def test_default_command_runs_gpuprofd_module_with_socket_db_and_idle_exit(tmp_path):
    argv = autostart.daemon_argv(tmp_path / "s", tmp_path / "d.db")
    assert argv == [
        sys.executable,
        "-m",
        "gpuprofd",
        "--socket-dir",
        str(tmp_path / "s"),
        "--db",
        str(tmp_path / "d.db"),
        "--idle-exit",
        "300",
    ]


def test_a_run_that_asks_for_a_team_server_starts_a_daemon_that_forwards_there(tmp_path):
    plain = autostart.daemon_argv(tmp_path / "s", tmp_path / "d.db")
    argv = autostart.daemon_argv(tmp_path / "s", tmp_path / "d.db", "https://team:8000")
    assert argv == [*plain, "--server", "https://team:8000"] and "--server" not in plain


def test_profile_autostarts_a_daemon_when_none_answers(
    socket_dir, fake_daemon_argv, monkeypatch, capsys
):
    monkeypatch.setattr(autostart, "daemon_argv", fake_daemon_argv)
    monkeypatch.setattr(autostart, "WAIT_S", 30.0)  # a loaded CI machine starts Python slowly
    monkeypatch.chdir(socket_dir)
    with gpuprof.profile("auto-started", auto=False, socket_dir=socket_dir, db="r.db") as prof:
        assert prof.run_id == 42
        assert prof.db == str(socket_dir / "r.db")  # resolved against the cwd
    out = capsys.readouterr().out
    assert "Note: spawned fake" in out, (socket_dir / "gpuprofd.log").read_text()
    assert f"gpuprofctl insights {socket_dir / 'r.db'} 42" in out


def test_a_daemon_that_exits_at_start_says_why_in_the_summary(socket_dir, monkeypatch, capsys):
    error = "gpuprofd: error: /x/gpuprof.db is already served by another gpuprofd; point ..."
    script = f"import sys; print('starting'); print({error!r}); sys.exit(2)"
    monkeypatch.setattr(
        autostart, "daemon_argv", lambda sock, db, server=None: [sys.executable, "-c", script]
    )
    monkeypatch.setattr(autostart, "EXIT_GRACE_S", 0.2)
    with gpuprof.profile("why", auto=False, socket_dir=socket_dir) as prof:
        pass
    assert prof.summary is not None
    assert f"auto-start failed: {error}" in " ".join(prof.summary["notes"])
    assert f"auto-start failed: {error}" in capsys.readouterr().out


def test_log_tail_reads_the_last_line_and_copes_with_no_log(socket_dir):
    assert autostart.log_tail(socket_dir) is None
    (socket_dir / "gpuprofd.log").write_bytes(b"one\ntwo \xff\n\n")
    assert autostart.log_tail(socket_dir) == "two \ufffd"
