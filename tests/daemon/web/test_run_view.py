"""``/runs/{id}`` of a running run: the summary of the daemon's latest live
insights pass (a day-long run's context takes seconds to build), not one
built again per request; an ended run's stored summary; without a live pass
(a team server), one built now. Real store, run service and insights runner,
fed real frames."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import schema
from gpuprofd.storage.writes import Store
from gpuprofd.views.runs import LIVE_NOTE
from gpuprofd.web.app import build_app
from gpuprofd.web.state import WebState
from tests.daemon import helpers as h


async def _get(state: WebState, path: str) -> Any:
    async with TestClient(TestServer(build_app(state))) as client:
        resp = await client.get(path)
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_a_running_run_shows_its_latest_live_pass(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    schema.prepare(db)
    drops = DropCounter()
    store = Store(db, drops)
    await store.open()
    store.start()
    try:
        registry = RunRegistry()
        insights = InsightsRunner(store, str(db), None, drops=drops)
        runs = RunService(store, registry, insights, [], pid_alive=lambda p, w: True)
        ingest = Ingest(None, runs, store, drops)  # type: ignore[arg-type]
        live = await runs.hello(h.hello("k", os.getpid(), run_name="slow-loader"))
        base = 1_000_000_000

        async def steps(first: int, n: int) -> None:
            for i in range(first, first + n):  # a loader-bound loop: 8 ms waits, 10 ms steps
                await ingest.handle(orjson.dumps(h.step("k", i, base)))
            await store.flush()

        await steps(0, 30)
        assert insights.live_summary(live.run_id) is None  # no pass yet
        found = await insights.live(live.run_id)
        assert found
        await steps(30, 20)  # after the pass
        state = WebState(
            reader=store,
            live_run_ids=lambda: {live.run_id},
            now_mono_ns=None,
            live_summary=insights.live_summary,
        )
        got = await _get(state, f"/api/v1/runs/{live.run_id}")
        summary = got["summary"]
        assert got["run"]["steps"] == 50  # the headline's count is read now ...
        assert summary["steps"] == 30  # ... the summary is the pass's, not rebuilt
        assert summary["notes"][0] == LIVE_NOTE
        assert [i["rule"] for i in summary["insights"]] == [i.rule for i in found]
        assert "top_kernels" in summary  # completed as a stored summary is
        assert got["run"]["median_step_ms"] == summary["median_step_ms"]
        # a reader without live passes (a team server) builds it now, from all 50
        server = WebState(reader=store, now_mono_ns=None)
        assert (await _get(server, f"/api/v1/runs/{live.run_id}"))["summary"]["steps"] == 50

        await runs.bye(h.bye("k", sent=50))
        assert insights.live_summary(live.run_id) is None  # ended: the stored one from now on
        ended = await _get(state, f"/api/v1/runs/{live.run_id}")
        assert ended["summary"]["steps"] == 50 and LIVE_NOTE not in ended["summary"]["notes"]
        await runs.close_tails()
    finally:
        await store.close()
