"""The dashboard API on a SQLite file whose text cells something outside
gpuprof changed: bytes that are not UTF-8 (as TEXT or as a BLOB) come back
with U+FFFD, every run is still listed and filtered, never a 500."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from aiohttp import test_utils

from gpuprofd.storage.writes import runsdb
from gpuprofd.web.app import build_app
from gpuprofd.web.state import WebState
from tests.daemon.helpers import open_store

START_WALL = 1_796_000_000_000_000_000


async def _write_runs(db: Path) -> None:
    async with open_store(str(db)) as store:
        for i, name in enumerate(("alpha", "beta", "gamma"), 1):
            row = {"run_key": f"k{i}", "run_name": name, "status": "finished", "options": {}}
            row.update(start_wall_ns=START_WALL + i, start_mono_ns=i, host="h", project="p")
            await runsdb.insert_run(store, row)
        await store.flush()


def _damage(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET run_name = CAST(x'fffe41' AS TEXT) WHERE id = 2")
    # BLOBs in text columns: bytes that are not UTF-8, and JSON that is
    conn.execute(
        "UPDATE runs SET host = x'68ff', tags = CAST('{\"k\": \"v\"}' AS BLOB) WHERE id = 3"
    )
    conn.commit()
    conn.close()


async def _get(client: test_utils.TestClient, path: str) -> Any:
    resp = await client.get(path)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_the_runs_list_and_a_run_read_despite_cells_not_utf8(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    await _write_runs(db)
    _damage(db)
    async with open_store(str(db)) as store:
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            listed = await _get(client, "/api/v1/runs")
            filtered = await _get(client, "/api/v1/runs?name=gam")
            two = await _get(client, "/api/v1/runs/2")
            three = await _get(client, "/api/v1/runs/3")
    runs = listed["runs"]
    assert [(r["id"], r["run_name"]) for r in runs] == [
        (3, "gamma"),
        (2, "\ufffd\ufffdA"),
        (1, "alpha"),
    ]
    assert (runs[0]["host"], runs[0]["tags"]) == ("h\ufffd", {"k": "v"})
    assert [r["id"] for r in filtered["runs"]] == [3]
    assert two["run"]["name"] == "\ufffd\ufffdA"
    assert three["run"]["host"] == "h\ufffd"
