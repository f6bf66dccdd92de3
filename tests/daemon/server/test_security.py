"""Attacks on a real ``gpuprofd serve`` on the real Postgres (each test its
own schema): each asserts the answer and that nothing was stored or leaked."""

from __future__ import annotations

import gzip
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import itsdangerous
import orjson
import pytest

try:  # Python 3.14+: the standard library's; before, its backport
    from compression import zstd
except ImportError:  # pragma: no cover - by Python version
    from backports import zstd

from tests.daemon.batches import batch, end_event, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import (
    KEY_ONE,
    PASSWORD,
    TeamServer,
    csrf,
    db_rows,
    key_file_text,
    login,
)

HOSTILE = (
    "x'); DROP TABLE runs;-- <script>alert(1)</script><img src=x onerror=alert(2)> "
    "\u202egpj.exe\u2066"
)


@pytest.fixture
def server(tmp_path: Path, pg_url: str, team_servers: list[TeamServer]) -> TeamServer:
    s = TeamServer(tmp_path, pg_url).start()
    team_servers.append(s)
    return s


def stored(s: TeamServer) -> dict[str, int]:
    """Row counts of every table an ingest or a login could write."""
    tables = ("runs", "steps", "gpu_rollups", "host_samples", "insights", "ingest_nodes")
    return {t: db_rows(s.storage_url, f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables}


NOTHING = {
    "runs": 0,
    "steps": 0,
    "gpu_rollups": 0,
    "host_samples": 0,
    "insights": 0,
    "ingest_nodes": 0,
}


def one_run(node: str = "n1", name: str = "exp") -> dict[str, Any]:
    run = new_uuid()
    return batch(node, [run_event(1, run, name=name), steps_event(2, run)])


def test_ingest_without_a_key_or_with_a_wrong_one(server: TeamServer) -> None:
    for key, headers in ((None, {}), ("not-a-key", {}), (None, {"X-API-Key": "nope"})):
        r = server.ingest(one_run(), key=key, headers=headers)
        assert r.status_code == 401, r.text
        assert "API key" in r.json()["error"] and r.headers["WWW-Authenticate"].startswith("Bearer")
    r = server.ingest(one_run(), key=None, headers={"Authorization": f"Basic {KEY_ONE}"})
    assert r.status_code == 401
    assert stored(server) == NOTHING


def test_a_revoked_key_is_refused(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer]
) -> None:
    old, new = "old-key-0000", "new-key-1111"
    (tmp_path / "api-keys").write_text(key_file_text(old, new))
    server = TeamServer(tmp_path, pg_url).start()
    team_servers.append(server)
    run = new_uuid()
    first = batch("n1", [run_event(1, run)])
    assert server.ingest(first, key=old).status_code == 200
    (tmp_path / "api-keys").write_text(key_file_text(new))  # the old key revoked
    deadline = time.monotonic() + 20
    while server.ingest(first, key=old).status_code != 401:  # resent: stores nothing either way
        assert time.monotonic() < deadline, "the revoked key is still accepted"
        time.sleep(0.2)
    refused = server.ingest(batch("n1", [steps_event(2, run)]), key=old)
    assert refused.status_code == 401
    assert db_rows(pg_url, "SELECT COUNT(*) FROM steps") == [(0,)]
    assert db_rows(pg_url, "SELECT last_seq FROM ingest_nodes") == [(1,)]
    assert server.ingest(batch("n1", [steps_event(2, run)]), key=new).status_code == 200
    assert "API keys read again" in server.log()


def test_truncated_bodies_store_nothing(server: TeamServer) -> None:
    body = orjson.dumps(one_run())
    cut_gzip = gzip.compress(body)[:-12]
    r = server.ingest(cut_gzip, compress=False, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "ends early" in r.json()["error"]
    r = server.ingest(body[: len(body) // 2], compress=False)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    r = server.ingest(b"\x1f\x8b garbage", compress=False, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "not valid gzip" in r.json()["error"]
    # a client that says 5,000 bytes, sends 100 and hangs up
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = (
            "POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY_ONE}\r\nContent-Length: 5000\r\n\r\n"
        )
        sock.sendall(head.encode() + body[:100])
    r = server.ingest(b"{}", compress=False)  # still serving
    assert r.status_code == 400 and r.json()["field"] == "v"
    assert stored(server) == NOTHING


def _stream(total: int, chunk: bytes) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield chunk
        sent += len(chunk)


def test_a_100_mb_body_is_refused_unread(server: TeamServer) -> None:
    mb = 1024 * 1024
    head = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY_ONE}"}
    with server.client() as c:
        # streamed (chunked: no length said up front)
        r = c.post("/api/v1/ingest", content=_stream(100 * mb, b"[" * mb), headers=head)
        assert r.status_code == 413, r.text
        assert "16 MiB as sent" in r.json()["error"]
        # said up front: refused before a byte is read
        r = c.post(
            "/api/v1/ingest",
            content=_stream(100 * mb, b" " * mb),
            headers={**head, "Content-Length": str(100 * mb)},
        )
        assert r.status_code == 413 and "16 MiB" in r.json()["error"]
    assert stored(server) == NOTHING


def test_a_zip_bomb_is_refused_without_inflating_it(server: TeamServer) -> None:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b" " * (1024 * 1024)
    bomb = b"".join(deflate.compress(zeros) for _ in range(256)) + deflate.flush()  # 256 MiB
    assert len(bomb) < 1024 * 1024  # well inside the 16 MiB taken as sent
    r = server.ingest(bomb, compress=False, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 413 and "64 MiB decompressed" in r.json()["error"]
    r = server.ingest(b"{}", compress=False, headers={"Content-Encoding": "br"})
    assert r.status_code == 415
    assert stored(server) == NOTHING


def test_zstd_bodies_are_taken_bounded_like_gzip(server: TeamServer) -> None:
    body = orjson.dumps(one_run())
    r = server.ingest(zstd.compress(body), compress=False, headers={"Content-Encoding": "zstd"})
    assert r.status_code == 200 and r.json()["applied"] == len(one_run()["events"]), r.text
    bomb = zstd.compress(b" " * (256 * 1024 * 1024))  # 256 MiB of spaces
    assert len(bomb) < 1024 * 1024
    r = server.ingest(bomb, compress=False, headers={"Content-Encoding": "zstd"})
    assert r.status_code == 413 and "64 MiB decompressed" in r.json()["error"]
    cut = zstd.compress(orjson.dumps(batch("n2", [run_event(1, new_uuid())])))[:-6]
    r = server.ingest(cut, compress=False, headers={"Content-Encoding": "zstd"})
    assert r.status_code == 400 and "ends early" in r.json()["error"], r.text
    r = server.ingest(b"\x28\xb5 garbage", compress=False, headers={"Content-Encoding": "zstd"})
    assert r.status_code == 400 and "not valid zstd" in r.json()["error"]
    assert db_rows(
        server.storage_url, "SELECT COUNT(*) FROM ingest_nodes WHERE node_id = 'n2'"
    ) == [(0,)]


def test_sequences_going_backwards(server: TeamServer) -> None:
    run = new_uuid()
    r = server.ingest(batch("n1", [run_event(5, run), steps_event(4, run)]))
    assert r.status_code == 400 and r.json()["field"] == "events[1].seq"
    assert stored(server) == NOTHING
    assert server.ingest(batch("n1", [run_event(5, run), steps_event(6, run)])).status_code == 200
    # a later batch wholly below what was applied: sent before, skipped, nothing stored twice
    late = server.ingest(batch("n1", [run_event(2, run), steps_event(3, run, 100)]))
    assert late.json() == {"node": "n1", "acked_seq": 6, "applied": 0, "skipped": 2}
    assert db_rows(server.storage_url, "SELECT COUNT(*) FROM steps") == [(5,)]


def test_hostile_strings_are_stored_and_returned_as_text(server: TeamServer) -> None:
    run = new_uuid()
    events = [
        run_event(1, run, name=HOSTILE, host=HOSTILE, group_id=HOSTILE),
        steps_event(2, run),
        {
            "seq": 3,
            "kind": "insights",
            "run": run,
            "insights": [{"rule": HOSTILE, "severity": "HIGH", "title": HOSTILE, "fix": HOSTILE}],
        },
    ]
    end = end_event(4, run, status="failed")
    end["fields"]["error"] = HOSTILE
    events.append(end)
    assert server.ingest(batch("n1", events)).status_code == 200
    assert db_rows(server.storage_url, "SELECT run_name, host, group_id, error FROM runs") == [
        (HOSTILE,) * 4
    ]
    with server.client() as c:
        login(c)
        r = c.get("/api/v1/runs")
        assert r.headers["Content-Type"].startswith("application/json")
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        row = r.json()["runs"][0]
        assert row["run_name"] == HOSTILE and row["host"] == HOSTILE
        detail = c.get(f"/api/v1/runs/{row['id']}").json()["run"]
        assert detail["error"] == HOSTILE
        found = c.get(f"/api/v1/runs?name={HOSTILE[:20]}").json()["runs"]
        assert [f["id"] for f in found] == [row["id"]]  # a parameter, not SQL
    assert db_rows(server.storage_url, "SELECT COUNT(*) FROM runs") == [(1,)]  # no table dropped


VIEWER_PATHS = (
    "/api/v1/runs",
    "/api/v1/nodes",
    "/api/v1/runs/1",
    "/api/v1/runs/1/insights",
    "/api/v1/runs/1/series",
    "/api/v1/runs/1/kernels",
    "/api/v1/compare?ids=1,2",
    "/api/v1/groups/g",
)


def test_the_viewer_api_needs_a_session(server: TeamServer) -> None:
    assert server.ingest(one_run(name="secret-run")).status_code == 200
    with server.client() as c:
        for path in VIEWER_PATHS:
            r = c.get(path)
            assert r.status_code == 401, path
            assert "secret-run" not in r.text and "log in" in r.json()["error"]
        ws = c.get(
            "/api/v1/live",
            headers={
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
        )
        assert ws.status_code == 401
        page = c.get("/", follow_redirects=False)
        assert page.status_code == 303 and page.headers["Location"] == "/login"
        static = c.get("/static/app.js", follow_redirects=False)
        assert static.status_code == 303
        form = c.get("/login")
        assert form.status_code == 200 and 'name="password"' in form.text
        assert "secret-run" not in form.text
        assert c.get("/api/v1/session").json() == {"logged_in": False}
        assert login(c, "wrong password").status_code == 401
        assert c.get("/api/v1/runs").status_code == 401


def test_state_changing_requests_need_the_csrf_token(server: TeamServer) -> None:
    with server.client() as c:
        c.get("/api/v1/session")
        r = c.post("/api/v1/login", json={"password": PASSWORD})  # no token
        assert r.status_code == 403
        assert c.get("/api/v1/runs").status_code == 401
        r = c.post("/api/v1/login", json={"password": PASSWORD}, headers={"X-CSRF-Token": "x.y"})
        assert r.status_code == 403
        assert login(c).status_code == 200
        assert c.post("/api/v1/logout").status_code == 403  # logged in, no token
        assert c.get("/api/v1/runs").status_code == 200  # still logged in
        # the token of another browser (valid, but not this session's)
        with server.client() as other:
            other.get("/api/v1/session")
            foreign = other.cookies["gpuprof_csrf"]
        r = c.post("/api/v1/logout", headers={"X-CSRF-Token": foreign})
        assert r.status_code == 403
        assert c.post("/api/v1/logout", headers=csrf(c)).status_code == 200
        assert c.get("/api/v1/runs").status_code == 401
    assert db_rows(server.storage_url, "SELECT COUNT(*) FROM runs") == [(0,)]


def test_the_eleventh_login_in_a_minute(server: TeamServer) -> None:
    with server.client() as c:
        for i in range(10):
            r = login(c, PASSWORD if i % 2 else "wrong")
            assert r.status_code in (200, 401), r.text
        # a spoofed X-Forwarded-For does not help: this server trusts no proxy
        c.get("/api/v1/session")
        r = c.post(
            "/api/v1/login",
            json={"password": PASSWORD},
            headers={**csrf(c), "X-Forwarded-For": "10.9.9.9"},
        )
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert "at most 10 a minute" in r.json()["error"]
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    with server.client(transport=other) as c2:
        assert login(c2).status_code == 200
        assert c2.get("/api/v1/runs").status_code == 200
    clients = db_rows(server.storage_url, "SELECT client FROM login_limits ORDER BY client")
    assert clients == [("127.0.0.1",), ("127.0.0.2",)]


def test_a_trusted_proxy_names_the_client(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, pg_url, "--trust-proxy", "127.0.0.1").start()
    team_servers.append(server)
    with server.client() as c:
        for _ in range(10):
            login(c, "wrong")
        c.get("/api/v1/session")
        blocked = c.post("/api/v1/login", json={"password": PASSWORD}, headers=csrf(c))
        assert blocked.status_code == 429
        r = c.post(
            "/api/v1/login",
            json={"password": PASSWORD},
            headers={**csrf(c), "X-Forwarded-For": "203.0.113.5", "X-Forwarded-Proto": "https"},
        )
        assert r.status_code == 200
        assert "Secure" in r.headers["Set-Cookie"]  # the proxy said https


def _session_cookie(secret: str, age_s: float = 0.0, payload: Any = None) -> str:
    class Then(itsdangerous.TimestampSigner):
        def get_timestamp(self) -> int:
            return int(time.time() - age_s)

    signed = itsdangerous.URLSafeTimedSerializer(secret, salt="gpuprof-session", signer=Then)
    return signed.dumps(payload or {"v": 1, "csrf": "t"})


def _sid_of(server: TeamServer, cookie: str) -> str:
    secret = db_rows(server.storage_url, "SELECT value FROM server_secrets")[0][0]
    data = itsdangerous.URLSafeTimedSerializer(secret, salt="gpuprof-session").loads(cookie)
    return str(data["sid"])


def test_forged_and_expired_cookies(server: TeamServer) -> None:
    assert server.ingest(one_run(name="secret-run")).status_code == 200
    with server.client() as viewer:  # a real login: its session id is recorded
        assert login(viewer).status_code == 200
        sid = _sid_of(server, viewer.cookies["gpuprof_session"])
    secret = db_rows(server.storage_url, "SELECT value FROM server_secrets")[0][0]
    real = {"v": 2, "sid": sid, "csrf": "t"}
    cookies = {
        "forged": _session_cookie("not-the-secret", payload=real),
        "expired": _session_cookie(secret, age_s=13 * 3600, payload=real),
        "tampered": _session_cookie(secret, payload=real)[:-3] + "abc",
        "garbage": "eyJ2IjoxfQ",
        "signed, but a session never made": _session_cookie(
            secret, payload={"v": 2, "sid": "made-up", "csrf": "t"}
        ),
        "signed, of the format before sessions were recorded": _session_cookie(
            secret, payload={"v": 1, "csrf": "t"}
        ),
    }
    for what, cookie in cookies.items():
        with server.client(cookies={"gpuprof_session": cookie}) as c:
            r = c.get("/api/v1/runs")
            assert r.status_code == 401, what
            assert "secret-run" not in r.text
    with server.client(cookies={"gpuprof_session": _session_cookie(secret, payload=real)}) as c:
        assert c.get("/api/v1/runs").status_code == 200  # fresh, signed, recorded: in


def test_a_logout_ends_a_copied_cookie_too(server: TeamServer) -> None:
    with server.client() as viewer:
        assert login(viewer).status_code == 200
        copied = dict(viewer.cookies)
        with server.client(cookies=copied) as thief:
            assert thief.get("/api/v1/runs").status_code == 200
            assert viewer.post("/api/v1/logout", headers=csrf(viewer)).status_code == 200
            r = thief.get("/api/v1/runs")
            assert r.status_code == 401 and "log in" in r.json()["error"]
            assert thief.get("/api/v1/session").json() == {"logged_in": False}
            assert thief.get("/", follow_redirects=False).status_code == 303
    assert db_rows(server.storage_url, "SELECT COUNT(*) FROM viewer_sessions") == [(0,)]


def test_a_new_login_ends_the_browsers_session_before(server: TeamServer) -> None:
    with server.client() as viewer:
        assert login(viewer).status_code == 200
        old = dict(viewer.cookies)
        assert login(viewer).status_code == 200  # again, in the same browser
        assert viewer.get("/api/v1/runs").status_code == 200
        with server.client(cookies=old) as copy:
            assert copy.get("/api/v1/runs").status_code == 401
        with server.client() as other:  # another browser's login is its own
            assert login(other).status_code == 200
            assert viewer.get("/api/v1/runs").status_code == 200
    assert db_rows(server.storage_url, "SELECT COUNT(*) FROM viewer_sessions") == [(2,)]


TRAVERSALS = (
    "/static/../../../../etc/passwd",
    "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/static/..%2f..%2f..%2fetc%2fpasswd",
    "/static//etc/passwd",
    "/api/v1/runs/..%2f..%2f..%2fetc%2fpasswd",
    "/api/v1/runs/1%2f..%2f..%2fetc%2fpasswd/series",
    "/api/v1/groups/..%2f..%2f..%2fetc%2fpasswd",
    "/api/v1/groups/%2e%2e",
    "/api/v1/compare?ids=../../etc/passwd",
    "/api/v1/runs?name=../../../etc/passwd",
    "/api/v1/runs?node=../../../etc/passwd",
    "/api/v1/runs/1/series?from=../../etc/passwd",
    "/..%2f..%2fetc/passwd",
)


def test_path_traversal_reaches_nothing(server: TeamServer) -> None:
    with server.client() as c:
        login(c)
        for path in TRAVERSALS:
            r = c.get(path, follow_redirects=False)
            assert "root:" not in r.text, path
            assert r.status_code in (200, 400, 403, 404), (path, r.status_code)
            if r.status_code == 200:  # a search that found nothing
                assert r.json() == {"runs": []}, path


UNPARSABLE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",  # a 9 kB header
    b"GET / HTTP/1.1\r\nHost: x\r\nBad\x01Header: 1\r\n\r\n",
    b"GET /" + b"p" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
)


def test_an_unparsable_request_is_one_line_in_the_log(server: TeamServer) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    for raw in UNPARSABLE:
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(raw)
            assert conn.recv(64).startswith(b"HTTP/1.0 400 Bad Request")
    with server.client() as c:  # the server goes on
        assert c.get("/api/v1/session").status_code == 200
    deadline = time.monotonic() + 30
    while server.log().count("bad HTTP request from 127.0.0.1: 400") < 3:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    log = server.log()
    assert "Traceback" not in log and "a" * 200 not in log
    lines = [line for line in log.splitlines() if "bad HTTP request" in line]
    assert len(lines) == 3 and all(len(line) < 400 for line in lines)
    assert "Invalid header token: b'Bad\\x01Header: 1'" in lines[1]
