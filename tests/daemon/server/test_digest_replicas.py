"""Two real ``gpuprofd serve`` replicas on one Postgres with a digest every
2 s: each period's digest reaches the webhook once, whichever replica sends it."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.daemon.server.conftest import TeamServer


class _Hook(http.server.BaseHTTPRequestHandler):
    got: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        n = int(self.headers.get("Content-Length", 0))
        type(self).got.append(orjson.loads(self.rfile.read(n)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict]]]:
    _Hook.got = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", _Hook.got
    finally:
        server.shutdown()
        server.server_close()


def test_two_replicas_send_each_periods_digest_once(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], hook: tuple[str, list[dict]]
) -> None:
    url, got = hook
    args = ("--digest-webhook", url, "--digest-every", "2s", "--digest-format", "json")
    team_servers += [TeamServer(tmp_path, pg_url, *args).start() for _ in range(2)]
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    ends = [g["period_end_s"] for g in got]
    assert len(ends) >= 4, ends
    assert len(set(ends)) == len(ends), ends  # never one period twice
    assert all(b - a == 2.0 for a, b in zip(ends, ends[1:], strict=False)), ends
    senders = ["digest for the period ending" in s.log() for s in team_servers]
    assert any(senders)
