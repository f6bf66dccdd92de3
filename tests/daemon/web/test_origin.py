"""The node dashboard answers only loopback host names and its own pages: a
DNS-rebinding page or another site's WebSocket gets 403 and no data."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import WSServerHandshakeError, test_utils

from gpuprofd.core.counters import DropCounter
from gpuprofd.storage import schema
from gpuprofd.storage.writes import Store, runsdb
from gpuprofd.web.app import build_app
from gpuprofd.web.origin import host_name
from gpuprofd.web.state import WebState


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("127.0.0.1:7311", "127.0.0.1"),
        ("LOCALHOST.:7311", "localhost"),
        ("[::1]:7311", "::1"),
        ("evil.example", "evil.example"),
        ("evil.example.:80", "evil.example"),
    ],
)
def test_host_name(host: str, name: str) -> None:
    assert host_name(host) == name


async def _client(tmp_path: Path, loopback_only: bool) -> tuple[test_utils.TestClient, Store]:
    schema.prepare(tmp_path / "g.db")
    store = Store(tmp_path / "g.db", DropCounter())
    await store.open()
    store.start()
    await runsdb.insert_run(store, {"run_key": "k", "run_name": "secret-run", "status": "running"})
    await store.flush()
    app = build_app(WebState(reader=store), loopback_only=loopback_only)
    client = test_utils.TestClient(test_utils.TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client, store


async def test_a_rebound_host_name_gets_403_and_no_runs(tmp_path: Path) -> None:
    client, store = await _client(tmp_path, loopback_only=True)
    try:
        ok = await client.get("/api/v1/runs")
        assert ok.status == 200 and "secret-run" in await ok.text()
        for host in ("attacker.example:7311", "localhost.attacker.example"):
            resp = await client.get("/api/v1/runs", headers={"Host": host})
            body = await resp.text()
            assert resp.status == 403 and "secret-run" not in body and "loopback" in body
        assert (await client.get("/", headers={"Host": "localhost:1"})).status == 200
    finally:
        await client.close()
        await store.close()


async def test_another_sites_page_cannot_open_the_live_socket(tmp_path: Path) -> None:
    client, store = await _client(tmp_path, loopback_only=True)
    try:
        with pytest.raises(WSServerHandshakeError) as err:
            await client.ws_connect("/api/v1/live", headers={"Origin": "http://127.0.0.2:8765"})
        assert err.value.status == 403
        own = f"http://{client.host}:{client.port}"
        ws = await client.ws_connect("/api/v1/live", headers={"Origin": own})
        await ws.close()
        ws = await client.ws_connect("/api/v1/live")  # a script, not a page: no Origin
        await ws.close()
    finally:
        await client.close()
        await store.close()


async def test_the_team_servers_app_has_no_such_guard(tmp_path: Path) -> None:
    client, store = await _client(tmp_path, loopback_only=False)  # it has a login instead
    try:
        resp = await client.get("/api/v1/runs", headers={"Host": "gpuprof.example.com"})
        assert resp.status == 200
    finally:
        await client.close()
        await store.close()
