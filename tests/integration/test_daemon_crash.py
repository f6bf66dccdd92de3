"""gpuprofd killed (``kill -9``) under a real CPU loop: the shim keeps what the
daemon had not acknowledged, starts a new daemon (it auto-started the
first), says hello again for the same run and sends again; the daemon
stores each message once. Every step index ends up stored exactly once and
the run ``finished``."""

from __future__ import annotations

import os
import signal

from .conftest import Node, ping, wait_for
from .scripts import SURVIVE

STEPS = 600


def _kill_daemon_at_pause(
    node: Node, pause_at: int, restart: bool = False
) -> tuple[int, str, str, int]:
    """Run SURVIVE, ``kill -9`` its gpuprofd while the loop waits at step
    *pause_at* (after the steps before it reached the database) and let the
    loop go on; with *restart*, start a daemon (as systemd would) once the
    loop is done, the process exiting. (returncode, stdout, stderr, killed pid)."""
    ready, go, done = (node.workdir / n for n in ("ready", "go", "done"))
    proc = node.spawn_script(SURVIVE, str(STEPS), str(pause_at), str(ready), str(go), str(done))
    try:
        wait_for(ready.exists, 90, "the loop to reach the pause")
        # some of the run is stored: the kill is mid-run, not before it started
        wait_for(
            lambda: node.query("SELECT COUNT(*) FROM steps")[0][0] >= pause_at // 2,
            60,
            "steps in the database",
        )
        pid = ping(node.socket_dir)["pid"]
        os.kill(pid, signal.SIGKILL)
        go.touch()
        if restart:
            wait_for(done.exists, 60, "the loop to end")
            node.daemons[0].wait(10)  # the killed one, reaped
            node.start_daemon()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr, pid


def _assert_every_step_once(node: Node) -> None:
    (run,) = node.query("SELECT id, status, received_events FROM runs")
    rows = node.query("SELECT step, COUNT(*) AS n FROM steps GROUP BY step ORDER BY step")
    steps = [r["step"] for r in rows]
    assert [r["n"] for r in rows if r["n"] != 1] == [], "a step stored twice"
    assert len(steps) == STEPS, (len(steps), steps[:3], steps[-3:])
    assert steps == list(range(steps[0], steps[0] + STEPS))
    assert run["status"] == "finished"


def test_daemon_killed_mid_run_loses_nothing(node: Node):
    assert ping(node.socket_dir) is None  # the run auto-starts its daemon
    rc, stdout, stderr, killed = _kill_daemon_at_pause(node, pause_at=300)
    assert rc == 0, stderr
    assert "TRAINED 600" in stdout
    assert "a new gpuprofd took the run over" in stderr, stderr
    info = ping(node.socket_dir)
    assert info is not None and info["pid"] != killed  # the shim started a new one
    _assert_every_step_once(node)
    assert "gpuprof · survive  (600 steps" in stdout, stdout


def test_daemon_killed_near_the_end_and_process_exits_while_it_is_down(node: Node):
    # the loop ends a few steps after the kill: the shim exits with the daemon
    # still down, so its exit starts the next one and ends the run there
    assert ping(node.socket_dir) is None
    rc, stdout, stderr, killed = _kill_daemon_at_pause(node, pause_at=STEPS - 5)
    assert rc == 0, stderr
    assert "TRAINED 600" in stdout
    _assert_every_step_once(node)
    assert "did not answer at exit" not in stdout, stdout


def test_an_auto_started_daemon_an_earlier_run_started_is_replaced_too(node: Node):
    # a second run within the idle minutes joins the daemon the first run
    # auto-started (it exits when idle): killed, this run starts the next
    node.start_daemon(idle_exit_s=300)  # as autostart starts it
    rc, stdout, stderr, killed = _kill_daemon_at_pause(node, pause_at=300)
    assert rc == 0, stderr
    assert "a new gpuprofd took the run over" in stderr, stderr
    info = ping(node.socket_dir)
    assert info is not None and info["pid"] != killed
    _assert_every_step_once(node)
    assert "did not answer at exit" not in stdout, stdout


def test_a_daemon_it_did_not_start_is_awaited_at_exit_and_the_run_ends_finished(node: Node):
    # a node-wide daemon (systemd's): the shim does not start one, it waits
    # at exit for the restart, which comes once the loop is done
    node.start_daemon()
    rc, stdout, stderr, killed = _kill_daemon_at_pause(node, pause_at=STEPS - 5, restart=True)
    assert rc == 0, stderr
    assert "gpuprofd is gone; starting a new one" not in stderr
    assert ping(node.socket_dir)["pid"] == node.daemons[-1].pid != killed
    _assert_every_step_once(node)


def test_a_daemon_stopped_on_purpose_is_not_replaced(node: Node):
    # `gpuprofctl stop --now` removes its sockets: meant, so the run's process
    # (which auto-started it) starts none in its place and exits soon
    assert ping(node.socket_dir) is None
    ready, go, done = (node.workdir / n for n in ("ready", "go", "done"))
    proc = node.spawn_script(SURVIVE, str(STEPS), "300", str(ready), str(go), str(done))
    try:
        wait_for(ready.exists, 90, "the loop to reach the pause")
        pid = ping(node.socket_dir)["pid"]
        assert node.ctl("stop", "--now").returncode == 0
        wait_for(lambda: not (node.socket_dir / "control.sock").exists(), 30, "the stop")
        go.touch()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "TRAINED 600" in stdout
    assert "starting a new one" not in stderr and "took the run over" not in stderr, stderr
    info = ping(node.socket_dir)
    assert info is None or info["pid"] == pid  # nothing new answers
