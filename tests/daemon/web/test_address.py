"""``--http``: parsed, refused off loopback, a taken port an error unless the
default's; ``--http off``; what a run is told when there is no dashboard."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprofd.core.errors import BadInputError
from gpuprofd.web import address
from gpuprofd.web.address import HttpAddress
from tests.daemon.helpers import Daemons


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, HttpAddress("127.0.0.1", address.DEFAULT_PORT, fallback=True)),
        ("off", None),
        ("OFF", None),
        ("127.0.0.1:8080", HttpAddress("127.0.0.1", 8080)),
        (":8080", HttpAddress("127.0.0.1", 8080)),
        ("8080", HttpAddress("127.0.0.1", 8080)),
        ("localhost:0", HttpAddress("localhost", 0)),
        ("[::1]:9000", HttpAddress("::1", 9000)),
        ("127.1.2.3:9000", HttpAddress("127.1.2.3", 9000)),
    ],
)
def test_http_values(value: str | None, want: HttpAddress | None) -> None:
    assert address.parse(value) == want


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0.0.0.0:7311", "add --viewer-password-file"),
        ("192.168.1.4:80", "listens on loopback only"),
        ("[::]:7311", "listens on loopback only"),
        ("example.com:80", "listens on loopback only"),
        ("127.0.0.1:http", "give HOST:PORT"),
        ("127.0.0.1:70000", "the port must be 0-65535"),
    ],
)
def test_bad_http_values_are_refused(value: str, says: str) -> None:
    with pytest.raises(BadInputError, match=says):
        address.parse(value)


def test_any_host_is_taken_with_a_login() -> None:
    assert address.parse("0.0.0.0:7311", login=True) == HttpAddress("0.0.0.0", 7311)
    assert address.parse("192.168.1.4:80", login=True) == HttpAddress("192.168.1.4", 80)
    with pytest.raises(BadInputError, match="the port must be 0-65535"):
        address.parse("0.0.0.0:70000", login=True)
    assert HttpAddress("0.0.0.0", 7311).url() == f"http://{socket.gethostname()}:7311"


def test_url_brackets_ipv6() -> None:
    assert HttpAddress("::1", 7311).url() == "http://[::1]:7311"
    assert HttpAddress("127.0.0.1", 7311).url(4000) == "http://127.0.0.1:4000"


def _gpuprofd(sock_dir: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpuprofd", "--socket-dir", str(sock_dir), "--db", str(db)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def test_non_loopback_is_refused_in_one_line(sock_dir: Path, tmp_path: Path) -> None:
    out = _gpuprofd(sock_dir, tmp_path / "g.db", "--http", "0.0.0.0:7311")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("gpuprofd: error: --http")
    assert "ssh -L 7311:127.0.0.1:7311" in out.stderr


def test_a_given_port_that_is_taken_is_an_error(sock_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = _gpuprofd(sock_dir, tmp_path / "g.db", "--http", f"127.0.0.1:{port}")
    assert out.returncode == 2, out.stderr
    line = f"cannot serve the dashboard on 127.0.0.1:{port}: the port is in use"
    assert [ln for ln in out.stderr.splitlines() if "error" in ln] == [
        f"gpuprofd: error: {line}; pick another with --http HOST:PORT, or --http off"
    ]


def test_the_default_port_taken_falls_back_to_a_free_one(
    daemons: Daemons, sock_dir: Path, tmp_path: Path
) -> None:
    held = socket.socket()
    try:
        # hold the port; while another program holds it, try again: a holder
        # that lets go before the daemon starts would hand the daemon the port
        deadline = time.monotonic() + 5
        while True:
            try:
                held.bind(("127.0.0.1", address.DEFAULT_PORT))
                held.listen()
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # held all along by another program: taken all the same
                time.sleep(0.05)
        proc, client = daemons.start_ready(sock_dir, tmp_path / "g.db")
        url = client.ping(2.0)["dashboard_url"]
    finally:
        held.close()
    assert url.startswith("http://127.0.0.1:") and not url.endswith(f":{address.DEFAULT_PORT}")
    deadline = time.monotonic() + 10
    while "port 7311 was taken" not in daemons.log(proc) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"dashboard on {url} (port 7311 was taken: picked a free one)" in daemons.log(proc)


PROFILE = (
    "import gpuprof\n"
    "with gpuprof.profile('x', auto=False, dashboard=True, autostart=False, "
    "socket_dir={sock!r}) as p:\n"
    "    with p.step(0):\n"
    "        pass\n"
    "print('trained')\n"
)


def _profile(sock_dir: Path) -> list[str]:
    code = PROFILE.format(sock=str(sock_dir))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_http_off_is_said_by_status_and_to_the_run(
    daemons: Daemons, sock_dir: Path, tmp_path: Path
) -> None:
    daemons.start_ready(sock_dir, tmp_path / "g.db", "--http", "off")
    lines = _profile(sock_dir)
    assert lines[0] == "gpuprof dashboard: none (gpuprofd was started with --http off)"
    assert "trained" in lines
    status = subprocess.run(
        [sys.executable, "-m", "gpuprofd.ctl", "status", "--socket-dir", str(sock_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "  dashboard:  none (gpuprofd was started with --http off)" in status.stdout


def test_without_a_daemon_the_run_says_why_and_trains(sock_dir: Path) -> None:
    lines = _profile(sock_dir)
    assert lines[0] == f"gpuprof dashboard: none (gpuprofd unreachable at {sock_dir})"
    assert "trained" in lines
