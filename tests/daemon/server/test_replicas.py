"""Two ``gpuprofd serve`` replicas on one Postgres: what one ingests the
other serves and pushes live; sessions and the login limit are shared; a
lost listener connection comes back and says so."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson

from tests.backends import PG_URL
from tests.daemon.batches import batch, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import TeamServer, csrf, login


def _wait_for(pred, what: str, timeout_s: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


async def _live_steps(b: TeamServer, cookies: dict[str, str], run_id: int, post) -> list[int]:  # noqa: ANN001
    """Open a live socket on *b*, subscribe to *run_id*, call *post* (which
    ingests through the other replica), return the step indices pushed."""
    got: list[int] = []
    async with aiohttp.ClientSession(cookies=cookies) as http:
        async with http.ws_connect(f"{b.url}/api/v1/live") as ws:
            await ws.send_str(
                orjson.dumps({"run": run_id, "cursors": {"step": 4, "t": 0}}).decode()
            )
            await asyncio.to_thread(post)
            deadline = time.monotonic() + 30
            while len(got) < 5 and time.monotonic() < deadline:
                msg = await ws.receive(timeout=30)
                data = orjson.loads(msg.data)
                if data["type"] == "steps":
                    got += [r["step"] for r in data["rows"]]
    return got


def test_two_replicas_share_one_database(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer]
) -> None:
    a = TeamServer(tmp_path, pg_url).start()
    b = TeamServer(tmp_path, pg_url).start()
    team_servers += [a, b]
    run = new_uuid()
    assert a.ingest(batch("n1", [run_event(1, run, name="via-a"), steps_event(2, run)])).is_success
    with a.client() as ca:
        assert login(ca).status_code == 200
        cookies = dict(ca.cookies)
    with b.client(cookies=cookies) as on_b:  # A's session, on B
        rows = on_b.get("/api/v1/runs").json()["runs"]
        assert [r["run_name"] for r in rows] == ["via-a"]
        run_id = rows[0]["id"]
        _wait_for(lambda: f"notify: runs [{run_id}] changed" in b.log(), "B heard of A's batch")
        pushed = asyncio.run(
            _live_steps(b, cookies, run_id, lambda: a.ingest(batch("n1", [steps_event(3, run, 5)])))
        )
        assert pushed == [5, 6, 7, 8, 9]
        # the same batch sent to both replicas stores once
        again = batch("n1", [steps_event(4, run, 10)])
        answers = [a.ingest(again).json(), b.ingest(again).json()]
        assert sorted(x["applied"] for x in answers) == [0, 1]
        assert on_b.get(f"/api/v1/runs/{run_id}").json()["run"]["steps"] == 15
    # the login limit is counted in the database: 1 + 5 on A and 4 on B, then neither
    with a.client() as ca, b.client() as cb:
        for c in (ca,) * 5 + (cb,) * 4:
            assert login(c, "wrong").status_code == 401
        r = cb.post("/api/v1/login", json={"password": "x"}, headers=csrf(cb))
        assert r.status_code == 429


async def _closed_with(b: TeamServer, cookies: dict[str, str], logout) -> int | None:  # noqa: ANN001
    """Open a live socket on *b*, call *logout* (on the other replica); the
    close code *b* sends (None: not closed within 30 s)."""
    async with aiohttp.ClientSession(cookies=cookies) as http:
        async with http.ws_connect(f"{b.url}/api/v1/live") as ws:
            await asyncio.to_thread(logout)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = await ws.receive(timeout=30)
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                    return ws.close_code
    return None


def test_a_logout_on_one_replica_ends_the_session_on_the_other(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer]
) -> None:
    a = TeamServer(tmp_path, pg_url).start()
    b = TeamServer(tmp_path, pg_url).start()
    team_servers += [a, b]
    with a.client() as ca:
        assert login(ca).status_code == 200
        cookies = dict(ca.cookies)
        with b.client(cookies=cookies) as on_b:
            assert on_b.get("/api/v1/runs").status_code == 200

            def logout() -> None:
                assert ca.post("/api/v1/logout", headers=csrf(ca)).status_code == 200

            code = asyncio.run(_closed_with(b, cookies, logout))
            assert code == 1008  # the live socket on B, closed: its session ended
            assert on_b.get("/api/v1/runs").status_code == 401
    assert "live socket closed: its session ended" in b.log()


def test_a_lost_listener_comes_back(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer]
) -> None:
    a = TeamServer(tmp_path, pg_url).start()
    team_servers.append(a)
    _wait_for(lambda: _listeners(pg_url) >= 1, "the listener connected")
    asyncio.run(_admin(f"SELECT pg_terminate_backend(pid) FROM {_ACTIVITY}"))
    _wait_for(lambda: "listening again" in a.log(), "the listener reconnected")
    run = new_uuid()
    assert a.ingest(batch("n1", [run_event(1, run)])).is_success
    _wait_for(lambda: "notify: runs [1] changed" in a.log(), "heard after the reconnect")


_ACTIVITY = (
    "pg_stat_activity WHERE application_name = 'gpuprof-serve-listener' "
    "AND pid <> pg_backend_pid() AND query NOT LIKE '%pg_stat_activity%' AND {schema}"
)


def _schema_of(url: str) -> str:
    return url.split("search_path=")[1]


async def _admin(sql: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        return len(await conn.fetch(sql.replace("{schema}", "TRUE")))
    finally:
        await conn.close()


def _listeners(pg_url: str) -> int:
    return asyncio.run(_admin(f"SELECT pid FROM {_ACTIVITY}"))
