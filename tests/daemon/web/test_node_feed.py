"""The live feed's node view (``{"node": true}``, what gpuprofctl top reads),
on each backend, in process: a team server's view of an ingested batch
(no node clock, no devices) and a node's (its devices, its clock), the
figures known from the batch (tests/daemon/commands/feeds.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import WSMsgType, test_utils

from gpuprofd.sampling.nvml import GpuDevice
from gpuprofd.storage.writes.batch import validate
from gpuprofd.storage.writes.ingest import apply_batch
from gpuprofd.storage.writes.store import Store
from gpuprofd.web.app import build_app
from gpuprofd.web.node import MAX_RUNS, top_insight, window_stats
from gpuprofd.web.state import WebState
from tests.daemon.batches import BOOT, GPU, batch, new_uuid, steps_event
from tests.daemon.commands.feeds import HOSTILE, node_batch
from tests.daemon.helpers import open_store
from tests.daemon.web.test_e2e import check_shape, documented_examples


@contextlib.asynccontextmanager
async def feed(store: Store, **state: Any) -> AsyncIterator[Any]:
    """A live socket of the app over *store*, subscribed to the node view."""
    web_state = WebState(reader=store, live_poll_s=0.05, insights_poll_s=0.05, **state)
    app = build_app(web_state)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        async with client.ws_connect("/api/v1/live") as ws:
            await ws.send_str(orjson.dumps({"node": True}).decode())
            yield ws


async def next_of(ws: Any, kind: str, until: Any = lambda m: True) -> dict[str, Any]:
    while True:
        msg = await ws.receive(timeout=30)
        assert msg.type == WSMsgType.TEXT, msg
        data = orjson.loads(msg.data)
        if data["type"] == kind and until(data):
            return data


async def test_a_team_servers_node_view_of_a_batch(storage_url: str) -> None:
    run, cpu_run = new_uuid(), new_uuid()
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(node_batch(run, name=HOSTILE, cpu_run=cpu_run)))
        async with feed(store, now_mono_ns=None) as ws:
            msg = await next_of(ws, "node")
            check_shape(documented_examples()["live_node"], msg, "live_node")
            # more steps come: counted from where the last look ended
            await apply_batch(store, validate(batch("n1", [steps_event(9, run, 150, 10)])))
            later = await next_of(ws, "node", lambda m: m["runs"][-1]["steps"] > 150)
    cpu, gpu_run = msg["runs"]  # newest first
    assert cpu["name"] == "cpu-only" and cpu["steps"] == 0 and cpu["gpu_uuid"] is None
    assert cpu["window"]["mean_ms"] is None and cpu["top_insight"] is None
    assert gpu_run["name"] == HOSTILE  # as stored: the terminal escapes it, not the feed
    assert (gpu_run["user"], gpu_run["rank"], gpu_run["world_size"]) == ("alice", 0, 1)
    assert gpu_run["steps"] == 150 and gpu_run["dropped_events"] == 2
    assert gpu_run["window"] == {
        "steps": 100,
        "mean_ms": 110.0,
        "median_ms": 110.0,
        "steps_per_s": 9.091,
        "pct": {
            "loader_wait": 9.1,
            "between_steps": None,  # the batch's waits were not timed
            "forward": 30.3,
            "backward": 45.5,
            "comm": None,
            "optimizer": 0.0,
            "other": 15.2,
        },
        "eval": 0,
        "skipped": 0,
        "traced": 0,
    }
    assert gpu_run["top_insight"]["severity"] == "HIGH" and gpu_run["insights"] == 2
    assert gpu_run["cpu_cores"] == 1.25
    (gpu,) = msg["gpus"]  # the device the run reported; a server has no index
    assert gpu["uuid"] == f"GPU-{GPU}" and gpu["index"] is None and gpu["name"] == "NVIDIA H200"
    assert (gpu["util_pct"], gpu["power_w"], gpu["temp_c"]) == (97.5, 612.0, 51.0)
    assert gpu["mem_used_bytes"] == 40_000_000_000 and gpu["runs"] == [{"id": 1, "rank": 0}]
    (host,) = msg["hosts"]
    assert host == {
        "host": "node-a",
        "t": host["t"],
        "cpu_count": 8,
        "busy_cores": 2.0,
        "run_cores": 1.25,
        "other_cores": 0.75,
    }
    assert later["runs"][-1]["steps"] == 160  # 150 counted once, then the 10 new
    assert later["runs"][-1]["last_step_s"] > gpu_run["last_step_s"]


async def test_a_nodes_view_lists_every_device_and_reads_its_own_clock(storage_url: str) -> None:
    run = new_uuid()
    devices = (
        GpuDevice(0, f"GPU-{GPU}", "NVIDIA H200", power_limit_mw=700_000),
        GpuDevice(1, "GPU-00000000-0000-0000-0000-0000000000ff", "NVIDIA H200"),
    )
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(node_batch(run)))
        state = {"devices": devices, "boot_id": BOOT, "now_mono_ns": lambda: 16_000_000_000}
        async with feed(store, **state) as ws:
            msg = await next_of(ws, "node")
        # 30 s on, nothing is fresh: readings are not shown as if they were now
        async with feed(store, **{**state, "now_mono_ns": lambda: 46_000_000_000}) as ws:
            stale = await next_of(ws, "node")
    used, idle = msg["gpus"]
    assert (used["index"], used["power_limit_w"], used["runs"]) == (
        0,
        700.0,
        [{"id": 1, "rank": 0}],
    )
    assert used["util_pct"] == 97.5
    assert (idle["index"], idle["runs"], idle["util_pct"]) == (1, [], None)
    assert msg["hosts"][0]["busy_cores"] == 2.0
    assert stale["gpus"][0]["util_pct"] is None and stale["hosts"][0]["cpu_count"] is None


async def test_a_socket_switches_between_the_node_and_a_run(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(node_batch(new_uuid())))
        async with feed(store, now_mono_ns=None) as ws:
            await next_of(ws, "node")
            await ws.send_str('{"node": 1}')
            error = await next_of(ws, "error")
            await ws.send_str(orjson.dumps({"run": 1, "cursors": {"step": 140, "t": 0}}).decode())
            steps = await next_of(ws, "steps")
            await ws.send_str('{"node": true}')
            again = await next_of(ws, "node")
    assert "node must be true" in error["error"]
    assert [r["step"] for r in steps["rows"]] == list(range(141, 150))
    assert all(r["traced"] is False for r in steps["rows"])
    assert again["runs"][0]["steps"] == 150


def test_window_stats_leave_traced_steps_out_and_say_ms() -> None:
    def r(step: int, iter_ns: int, **kw: Any) -> dict[str, Any]:
        return {"step": step, "iter": iter_ns, "loader_wait": iter_ns, "eval_ns": 0, **kw}

    rows = [r(0, 4_000_000), r(1, 2_000_000, eval_ns=5), r(2, 90_000_000, traced=1)]
    got = window_stats(rows)
    assert (got["steps"], got["mean_ms"], got["median_ms"], got["steps_per_s"]) == (
        2,
        3.0,
        3.0,
        333.333,
    )
    assert (got["eval"], got["traced"], got["pct"]["loader_wait"]) == (1, 1, 100.0)
    assert window_stats([])["mean_ms"] is None


def test_the_top_insight_is_the_most_severe_then_the_first_found() -> None:
    found = [
        {"severity": "LOW", "rule": "a"},
        {"severity": "MED", "rule": "b"},
        {"severity": "MED", "rule": "c"},
    ]
    assert top_insight(found)["rule"] == "b"
    assert top_insight([*found, {"severity": "HIGH", "rule": "d"}])["rule"] == "d"
    assert top_insight([]) is None
    assert MAX_RUNS >= 8  # a node of eight GPUs' ranks fits one message


async def test_viewers_share_one_message_while_it_is_fresh(
    storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuprofd.web import node

    async with open_store(storage_url) as store:
        await apply_batch(store, validate(node_batch(new_uuid())))
        shared = node.NodeFeed(WebState(reader=store, now_mono_ns=None))
        monkeypatch.setattr(node, "REUSE_S", 3600.0)
        first = await shared.message()
        assert await shared.message() is first  # a second viewer: nothing read again
        monkeypatch.setattr(node, "REUSE_S", 0.0)
        assert await shared.message() is not first  # stale: built again
