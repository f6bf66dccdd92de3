"""gpuprofctl top and watch against a real team server (gpuprofd serve on
SQLite): what an API key may read (the API and the live feed, never a page
or a change), a run name holding escape sequences shown as text in a real
pseudo-terminal, a viewer's login, and the one-line errors."""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon.batches import end_event, new_uuid
from tests.daemon.commands.feeds import HOSTILE, node_batch
from tests.daemon.commands.terminal import Terminal
from tests.daemon.server.conftest import KEY_ONE, PASSWORD, TeamServer

pytestmark = pytest.mark.timeout(300)

#: The hostile name as a terminal shows it: every control character escaped.
SHOWN = "sft-\\x1b[2J\\x1b]0;pwned\\x07"


@pytest.fixture
def server(tmp_path: Path, team_servers: list[TeamServer]) -> TeamServer:
    """A server holding one running run with a hostile name (id 1) and one
    that ended (id 2)."""
    s = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(s)
    done = new_uuid()
    assert s.ingest(node_batch(new_uuid(), name=HOSTILE)).status_code == 200
    second = node_batch(done, name="finished-run")
    second["node"] = "n2"
    second["events"] = [*second["events"][:3], end_event(8, done)]
    assert s.ingest(second).status_code == 200
    return s


def ctl(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``gpuprofctl ARGS`` with stdout a pipe (not a terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_API_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "gpuprofd.ctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_an_api_key_reads_the_api_and_the_feed_and_nothing_else(server: TeamServer) -> None:
    key = {"Authorization": f"Bearer {KEY_ONE}"}
    with server.client(headers=key) as c:
        runs = c.get("/api/v1/runs")
        assert runs.status_code == 200 and runs.json()["runs"][-1]["name"] == HOSTILE
        assert c.get("/api/v1/runs/1/series?width=10").status_code == 200
        page = c.get("/", follow_redirects=False)  # a page needs a login
        assert page.status_code == 303 and page.headers["Location"] == "/login"
        assert c.post("/api/v1/logout").status_code == 401  # a change needs a session
    with server.client(headers={"Authorization": "Bearer not-a-key"}) as c:
        assert c.get("/api/v1/runs").status_code == 401


def test_top_in_a_terminal_shows_a_hostile_name_as_text(server: TeamServer) -> None:
    term = Terminal("top", "--server", server.url, "--api-key-file", str(server.keys))
    try:
        # the run's row and its GPU's (a frame may hold the row before the GPUs)
        screen = term.wait_for(
            lambda s: SHOWN[:10] in s and "  - NVIDIA H200" in s, 60, "the run's row and GPU"
        )
        row = next(ln for ln in screen.splitlines() if "sft-" in ln)
        assert row.startswith("  1 sft-\\x1b[2J\\… alice   0/1      150    9.1  110.0  110.0")
        assert screen.splitlines()[0].startswith(f"gpuprof top · {server.url} · 1 live run")
        # nothing of the name reached the terminal as a control sequence
        assert term.screen.title != "pwned" and b"\x1b]0;pwned" not in term.raw
        assert b"sft-\x1b" not in term.raw
        assert "  - NVIDIA H200" in screen and "#1 r0" in screen  # the device the run reported
        term.send("q")
        assert term.wait_exit(20) == 0
    finally:
        term.close()


def test_watch_once_as_plain_text_with_a_viewer_login(server: TeamServer, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    got = ctl(
        "watch", "1", "--server", server.url, "--viewer-password-file", str(password), "--once"
    )
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0].startswith(f"gpuprof watch · #1 {SHOWN} · alice · running")
    assert lines[1].startswith("150 steps · 9.1 steps/s · 110.0 ms/it mean, 110.0 median")
    assert "  [HIGH] Data loading is 9% of each step" in lines
    assert "\x1b" not in got.stdout  # plain text: no colour, no control character


def test_watch_of_an_ended_run_prints_its_summary_and_exits_0(server: TeamServer) -> None:
    got = ctl("watch", "2", "--server", server.url, "--api-key-file", str(server.keys))
    assert got.returncode == 0, got.stderr
    assert "gpuprof · finished-run  (150 steps" in got.stdout


def test_top_once_plain_and_the_errors_said_in_one_line(server: TeamServer) -> None:
    got = ctl("top", "--server", server.url, "--api-key-file", str(server.keys), "--once")
    assert got.returncode == 0, got.stderr
    assert SHOWN[:12] in got.stdout and "\x1b" not in got.stdout
    refused = ctl("top", "--server", server.url, "--once")  # no key, no login
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"gpuprofctl: error: {server.url} wants a login")
    unknown = ctl("watch", "99", "--server", server.url, "--api-key-file", str(server.keys))
    assert unknown.returncode == 2 and "no run 99" in unknown.stderr
    gone = ctl("top", "--server", "http://127.0.0.1:9", "--once")
    assert gone.returncode == 3 and "no answer from http://127.0.0.1:9" in gone.stderr
    assert "Traceback" not in refused.stderr + unknown.stderr + gone.stderr


def lines_until(
    proc: subprocess.Popen[bytes], done: Callable[[str], bool], timeout_s: float
) -> str:
    """What *proc* printed, read until *done* holds of it; killed on a timeout."""
    out = b""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not done(out.decode(errors="replace")):
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError(f"not within {timeout_s} s: {out.decode(errors='replace')}")
            if sel.select(timeout=0.2):
                out += os.read(proc.stdout.fileno(), 65536)
    return out.decode()


def test_as_plain_text_watch_logs_lines_and_top_prints_frames(server: TeamServer) -> None:
    auth = ["--server", server.url, "--api-key-file", str(server.keys), "--interval", "0.5"]
    runs = []
    try:
        for args in (["watch", "1", *auth], ["top", *auth]):
            runs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gpuprofd.ctl", *args],
                    stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                )
            )
        watch = lines_until(runs[0], lambda s: " step 149 · " in s, 60)
        top = lines_until(runs[1], lambda s: s.count("gpuprof top · ") >= 2, 60)
    finally:
        for p in runs:
            p.kill()
            p.wait(10)
            if p.stdout is not None:
                p.stdout.close()
    assert watch.splitlines()[0] == f"watching run 1 {SHOWN} (running)"
    assert "[HIGH] Data loading is 9% of each step" in watch.splitlines()
    assert re.search(
        r"^\d\d:\d\d:\d\d step 149 · 150 steps · 9\.1 steps/s · 110\.0 ms mean, 110\.0 ms "
        r"median · W 9% F 30% B 45% O 0% \. 15%$",
        watch,
        re.M,
    ), watch
    frames = top.split("gpuprof top · ")[1:]  # a frame every 0.5 s, a blank line between
    assert frames[0].splitlines()[2].startswith("  1 sft-\\x1b[2J\\…")
    # each frame ends with its legend: no keys line, none works in plain text
    assert frames[0].endswith(". other\n\n") and "q quit" not in top
    assert "\x1b" not in watch + top
