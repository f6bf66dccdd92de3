"""What the team server's API shows of ingested runs, on each backend, in
process: a run's GPUs from what its node sent (the run's device and the
node's rollups; no device index, which a server never has), and the runs
list filtered by node (id or host name), name and time."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import test_utils

from gpuprofd.storage.writes import Store, apply_batch, validate
from gpuprofd.web.app import build_app
from gpuprofd.web.state import WebState
from tests.daemon.batches import BOOT, GPU, batch, new_uuid, run_event, steps_event
from tests.daemon.storage.test_backends import open_store

NS = 1_000_000_000
T = 1_700_000_000 * NS  # the first run's start, wall ns


def rollup_row(sec: int, uuid: str = GPU, boot: str = BOOT, util: float = 97.5) -> dict[str, Any]:
    return {
        "sec_ns": sec * NS,
        "uuid": uuid,
        "boot_id": boot,
        "n": 10,
        "util_min": util - 2,
        "util_mean": util,
        "util_max": util + 2,
        "idle_n": 0,
        "mem_used_mean": 40e9,
        "mem_total_bytes": 150_000_000_000,
        "power_mean_mw": 612_000.0,
    }


def rollups_event(seq: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"seq": seq, "kind": "gpu_rollups", "rows": rows}


def ended(seq: int, run: str, end_wall_ns: int) -> dict[str, Any]:
    fields = {"status": "finished", "end_wall_ns": end_wall_ns, "end_mono_ns": 61 * NS}
    return {"seq": seq, "kind": "end", "run": run, "fields": fields}


@contextlib.asynccontextmanager
async def served(store: Store) -> AsyncIterator[test_utils.TestClient]:
    """The server's views over *store* (no node clock, no devices), no login in front."""
    app = build_app(WebState(reader=store, now_mono_ns=None))
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        yield client


async def _get(client: test_utils.TestClient, path: str, status: int = 200) -> Any:
    resp = await client.get(path)
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_a_runs_gpu_comes_from_what_its_node_sent(storage_url: str) -> None:
    run = new_uuid()
    events = [
        run_event(1, run, cuda_uuid=f"GPU-{GPU}", gpu_model="NVIDIA H200", gpu_count=1),
        steps_event(2, run, n=5),  # 1.0 s to 1.5 s on the node's clock
        rollups_event(3, [rollup_row(1)]),
    ]
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(batch("n1", events)))
        async with served(store) as client:
            view = (await _get(client, "/api/v1/runs/1"))["run"]
            series = await _get(client, "/api/v1/runs/1/series?width=300")
    assert view["gpus"] == [
        {
            "index": None,  # a server never knows the node's device index
            "uuid": f"GPU-{GPU}",  # as the run reported its device
            "name": "NVIDIA H200",
            "mem_total_bytes": 150_000_000_000,
            "power_limit_w": None,
        }
    ]
    (gpu,) = series["gpus"]
    assert gpu["uuid"] == f"GPU-{GPU}" and gpu["name"] == "NVIDIA H200"
    assert 97.5 in gpu["util_pct"]["mean"] and series["tier"]["gpus"] == "rollup"


async def test_a_run_without_a_device_shows_its_nodes_gpus_only(storage_url: str) -> None:
    mine, theirs = new_uuid(), new_uuid()
    other_gpu = "c0ffee00-0000-0000-0000-000000000002"
    elsewhere = "c0ffee00-0000-0000-0000-00000000beef"
    async with open_store(storage_url) as store:
        await apply_batch(
            store,
            validate(
                batch(
                    "n1",
                    [
                        run_event(1, mine, cuda_uuid=None),
                        steps_event(2, mine, n=5),
                        rollups_event(3, [rollup_row(1), rollup_row(1, other_gpu, util=10.0)]),
                    ],
                )
            ),
        )
        other_node = [
            run_event(1, theirs, boot_id="another-boot", cuda_uuid=None),
            rollups_event(2, [rollup_row(1, elsewhere, boot="another-boot")]),
        ]
        await apply_batch(store, validate(batch("n2", other_node, host="node-b")))
        async with served(store) as client:
            view = (await _get(client, "/api/v1/runs/1"))["run"]
    assert [(g["index"], g["uuid"], g["name"]) for g in view["gpus"]] == [
        (None, GPU, None),
        (None, other_gpu, None),
    ]


async def _three_runs(store: Store) -> list[str]:
    """n1 (node-a): sft-a, T to T+60 s; n2 (node-b): sft-b from T+1 h, still
    running, and pretrain, T+2 h to T+2 h 100 s."""
    a, b, c = new_uuid(), new_uuid(), new_uuid()
    await apply_batch(
        store,
        validate(
            batch("n1", [run_event(1, a, name="sft-a", start_wall_ns=T), ended(2, a, T + 60 * NS)])
        ),
    )
    later = [
        run_event(1, b, name="sft-b", start_wall_ns=T + 3600 * NS, host="node-b"),
        run_event(2, c, name="pretrain", start_wall_ns=T + 7200 * NS, host="node-b"),
        ended(3, c, T + 7300 * NS),
    ]
    await apply_batch(store, validate(batch("n2", later, host="node-b")))
    return [a, b, c]


def _names(data: dict[str, Any]) -> list[str]:
    return [r["name"] for r in data["runs"]]


async def test_the_runs_list_filters_by_node_name_and_time(storage_url: str) -> None:
    def at(ns: int) -> str:
        return f"{ns / NS:.3f}"

    async with open_store(storage_url) as store:
        await _three_runs(store)
        async with served(store) as client:
            everything = await _get(client, "/api/v1/runs")
            got = {
                q: _names(await _get(client, f"/api/v1/runs?{q}"))
                for q in (
                    "node=n2",
                    "node=node-b",  # its host name: what the page shows
                    "node=node-a",
                    "node=node",  # a node is named exactly, not by a part
                    "name=sft",
                    "name=sft&node=node-b",
                    f"from={at(T + 100 * NS)}",  # sft-a ended before; sft-b still runs
                    f"to={at(T + 30 * NS)}",  # only sft-a had started
                    f"from={at(T + 3700 * NS)}&to={at(T + 3800 * NS)}",
                    f"from={at(T + 7400 * NS)}",
                    "status=running&node=node-b",
                )
            }
            nodes = await _get(client, "/api/v1/nodes")
            bad = [
                (await _get(client, f"/api/v1/runs?{q}", 400))["error"]
                for q in ("from=yesterday", f"from={at(T + NS)}&to={at(T)}", "to=-5")
            ]
    assert _names(everything) == ["pretrain", "sft-b", "sft-a"]
    assert [(r["node"], r["host"]) for r in everything["runs"]] == [
        ("n2", "node-b"),
        ("n2", "node-b"),
        ("n1", "node-a"),
    ]
    assert got == {
        "node=n2": ["pretrain", "sft-b"],
        "node=node-b": ["pretrain", "sft-b"],
        "node=node-a": ["sft-a"],
        "node=node": [],
        "name=sft": ["sft-b", "sft-a"],
        "name=sft&node=node-b": ["sft-b"],
        f"from={at(T + 100 * NS)}": ["pretrain", "sft-b"],
        f"to={at(T + 30 * NS)}": ["sft-a"],
        f"from={at(T + 3700 * NS)}&to={at(T + 3800 * NS)}": ["sft-b"],
        f"from={at(T + 7400 * NS)}": ["sft-b"],  # a running run runs until now
        "status=running&node=node-b": ["sft-b"],
    }
    assert nodes == {
        "nodes": [
            {"node": "n1", "host": "node-a", "runs": 1, "last_start_s": T / NS},
            {"node": "n2", "host": "node-b", "runs": 2, "last_start_s": (T + 7200 * NS) / NS},
        ]
    }
    assert "not a number" in bad[0] and "is after" in bad[1] and "not a time" in bad[2]
