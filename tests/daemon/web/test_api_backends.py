"""The API over each storage backend (a SQLite file, the real Postgres), in
process: one long run written through the store (steps, per-second GPU
rollups, host samples), read back by aiohttp's test client. A single-step
and a single-second spike survive the whole-run zoom; a hostile run name
comes back verbatim; bad ids and parameters are JSON 400/404."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import test_utils

from gpuprofd.sampling import rollup
from gpuprofd.sampling.nvml import GpuDevice
from gpuprofd.server.notify import RunChanges
from gpuprofd.storage.upkeep import hostrollup, steprollup
from gpuprofd.storage.writes import Op, Store, runsdb
from gpuprofd.web.app import build_app
from gpuprofd.web.state import WebState
from tests.daemon.storage.test_backends import open_store

HOSTILE = "<script>alert('x')</script> \"q\" \u202eevil\u202c " + "é" * 5000
START_MONO = 5_000_000_000_000
START_WALL = 1_796_000_000_000_000_000
STEP_NS, WAIT_NS = 20_000_000, 10_000_000  # 30 ms an iteration
STEPS = 10_000  # 300 s
SPIKE_STEP, SPIKE_STEP_NS = 6_345, 900_000_000
SECONDS = 300
SPIKE_SECOND, SPIKE_POWER_MW = 221, 700_000
HOST_SPIKE_SAMPLE, HOST_SPIKE_BPS = 333, 9e8  # one 2 Hz sample's disk reads
UUID = "GPU-11111111-2222-3333-4444-555555555555"
BOOT = "boot-a"


def _step(i: int) -> dict[str, Any]:
    t0 = START_MONO + i * (STEP_NS + WAIT_NS) + WAIT_NS
    dur = SPIKE_STEP_NS if i == SPIKE_STEP else STEP_NS
    phases = {"forward": dur // 4, "backward": dur // 2, "optimizer": dur // 8}
    return {
        "i": i,
        "t0": t0,
        "t1": t0 + dur,
        "wait": WAIT_NS,
        "explicit": False,
        "micro": 1,
        "phases": phases,
    }


def _rollup(sec: int) -> tuple[Any, ...]:
    row = dict.fromkeys(rollup.ROLLUP_COLUMNS)
    power = SPIKE_POWER_MW if sec == SPIKE_SECOND else 300_000
    row.update(
        sec_ns=START_MONO + sec * rollup.NS_PER_S,
        uuid="11111111-2222-3333-4444-555555555555",
        n=100,
        util_min=90.0,
        util_mean=95.0,
        util_max=99.0,
        idle_n=0,
        mem_used_min=10**9,
        mem_used_mean=1.1e9,
        mem_used_max=1.2 * 10**9,
        mem_total_bytes=150 * 10**9,
        power_min_mw=power,
        power_mean_mw=power,
        power_max_mw=power,
        temp_min_c=40.0,
        temp_mean_c=41.0,
        temp_max_c=42.0,
        sm_min_mhz=1900.0,
        sm_mean_mhz=1950.0,
        sm_max_mhz=1980.0,
        reasons_n=0,
        reasons_any=0,
        capped_n=0,
        thermal_n=0,
        slow_n=1,
        pcie_rx_max_bps=1e9,
        pcie_tx_max_bps=2e8,
        gpm_sm_occupancy_mean=40.0,
        boot_id=BOOT,
    )
    row["mem_used_max"] = int(row["mem_used_max"])
    return tuple(row[c] for c in rollup.ROLLUP_COLUMNS)


async def _write_run(store: Store) -> int:
    run_id = await runsdb.insert_run(
        store,
        {
            "run_key": "k-long",
            "run_name": HOSTILE,
            "status": "running",
            "host": "h",
            "pid": 1,
            "rank": 0,
            "local_rank": 0,
            "world_size": 1,
            "auto": 1,
            "start_wall_ns": START_WALL,
            "start_mono_ns": START_MONO,
            "options": {},
            "cpu_count": 4,
            "cuda_uuid": UUID,
            "boot_id": BOOT,
            "gpu_model": "NVIDIA H200",
        },
    )
    for i in range(STEPS):
        await store.submit(runsdb.step_op(run_id, _step(i)))
    for sec in range(SECONDS):
        await store.submit(runsdb.rollup_op(_rollup(sec)))
    for k in range(2 * SECONDS):
        mono = START_MONO + k * 500_000_000
        disk = HOST_SPIKE_BPS if k == HOST_SPIKE_SAMPLE else 1e6
        await store.submit(
            runsdb.host_sample_op(mono, 50.0, 4, disk, None, 8 * 10**9, None, None, BOOT)
        )
        await store.submit(runsdb.run_cpu_op(run_id, mono, 1.0 if k % 2 else 2.0))
    end = START_MONO + SECONDS * rollup.NS_PER_S
    await runsdb.update_run(
        store,
        run_id,
        status="finished",
        end_mono_ns=end,
        end_wall_ns=START_WALL + SECONDS * rollup.NS_PER_S,
    )
    await store.flush()
    return run_id


@contextlib.asynccontextmanager
async def api(storage_url: str) -> AsyncIterator[tuple[test_utils.TestClient, int]]:
    async with open_store(storage_url) as store:
        run_id = await _write_run(store)
        device = GpuDevice(index=3, uuid=UUID, name="NVIDIA H200")
        state = WebState(reader=store, devices=(device,), now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            yield client, run_id


async def _json(client: test_utils.TestClient, path: str, status: int = 200) -> Any:
    resp = await client.get(path)
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    return await resp.json()


async def test_whole_run_series_keeps_one_step_and_one_second_spikes(storage_url: str) -> None:
    async with api(storage_url) as (client, run_id):
        got = await _json(client, f"/api/v1/runs/{run_id}/series?width=50")
    assert got["buckets"] == 100
    steps = got["steps"]
    assert sum(steps["n"]) == STEPS and len(steps["t"]) <= 100
    spike_ms = (SPIKE_STEP_NS + WAIT_NS) / 1e6
    maxes = steps["step_ms"]["max"]
    assert max(maxes) == pytest.approx(spike_ms)
    assert sorted(maxes)[-2] == pytest.approx((STEP_NS + WAIT_NS) / 1e6)  # only one bucket has it
    at = maxes.index(max(maxes))
    assert steps["first_step"][at] <= SPIKE_STEP < steps["first_step"][at] + steps["n"][at]
    # the bucket's mean is diluted by its ~100 steps, its min untouched
    assert steps["step_ms"]["min"][at] == pytest.approx((STEP_NS + WAIT_NS) / 1e6)
    assert steps["step_ms"]["mean"][at] < spike_ms / 10
    # phases stack to the mean
    stacked = sum(steps["phases_ms"][p][0] for p in steps["phases_ms"])
    assert stacked == pytest.approx(steps["step_ms"]["mean"][0], rel=1e-3)

    (gpu,) = got["gpus"]
    assert (gpu["index"], gpu["uuid"], gpu["name"]) == (3, UUID, "NVIDIA H200")
    assert got["tier"]["gpus"] == "rollup"
    assert sum(1 for w in gpu["power_w"]["max"] if w == 700.0) == 1
    assert max(gpu["power_w"]["mean"]) < 700.0  # the mean of its bucket is diluted
    assert set(gpu["power_w"]["min"]) == {300.0}
    assert gpu["pcie_rx_bps"][0] == 1e9 and gpu["gpm_tensor_util_pct"] is None
    host = got["host"]
    assert host["cpu_count"] == 4
    assert host["run_cores"]["mean"][0] == pytest.approx(1.5)
    assert host["other_cores"]["mean"][0] == pytest.approx(0.5)  # 50 % of 4 cores, less 1.5


async def test_a_zoomed_window_has_every_step(storage_url: str) -> None:
    async with api(storage_url) as (client, run_id):
        t_spike = (START_WALL + SPIKE_STEP * (STEP_NS + WAIT_NS)) / 1e9
        got = await _json(
            client, f"/api/v1/runs/{run_id}/series?from={t_spike - 3}&to={t_spike + 3}&width=1000"
        )
    steps = got["steps"]
    assert set(steps["n"]) == {1}  # 200 steps in 2,000 buckets: one each
    assert len(steps["t"]) == 200
    i = steps["first_step"].index(SPIKE_STEP)
    assert steps["step_ms"]["max"][i] == pytest.approx((SPIKE_STEP_NS + WAIT_NS) / 1e6)
    assert steps["t"][i] == pytest.approx(t_spike + WAIT_NS / 1e9, abs=1e-3)


async def test_a_hostile_name_comes_back_verbatim(storage_url: str) -> None:
    async with api(storage_url) as (client, run_id):
        listed = await _json(client, "/api/v1/runs?name=%3Cscript%3E")
        none = await _json(client, "/api/v1/runs?name=absent&status=finished")
        one = await _json(client, f"/api/v1/runs/{run_id}")
    assert [r["name"] for r in listed["runs"]] == [HOSTILE]
    assert listed["runs"][0]["run_name"] == HOSTILE
    assert none == {"runs": []}
    assert one["run"]["name"] == HOSTILE and one["summary"]["run_name"] == HOSTILE
    assert one["run"]["steps"] == STEPS
    assert one["run"]["start_s"] == pytest.approx(START_WALL / 1e9)


BAD = [
    ("/api/v1/runs/abc", 400, "run id 'abc' is not a positive integer"),
    ("/api/v1/runs/0", 400, "not a positive integer"),
    ("/api/v1/runs/-3/series", 400, "not a positive integer"),
    ("/api/v1/runs/99", 404, "no run 99 in"),
    ("/api/v1/runs/99/series", 404, "no run 99 in"),
    ("/api/v1/runs/1/series?width=5", 400, "width=5 is out of range (10-4000)"),
    ("/api/v1/runs/1/series?from=yesterday", 400, "from='yesterday' is not a number"),
    ("/api/v1/runs/1/series?from=nan", 400, "not a finite number"),
    ("/api/v1/runs/1/series?from=2000000000&to=1000000000", 400, "is not before"),
    ("/api/v1/runs/1/series?from=0&to=1e12", 400, "to=1e+12 is not a time in unix seconds"),
    ("/api/v1/runs/1/series?to=1e300", 400, "is not a time in unix seconds"),
    ("/api/v1/runs/1/series?from=3000000000&to=3000000100", 400, "holds none of the run"),
    ("/api/v1/runs/1/kernels?top=0", 400, "top=0 is out of range"),
    ("/api/v1/runs?status=done", 400, "give one of running, finished, failed, lost"),
    ("/api/v1/runs?limit=many", 400, "limit='many' is not an integer"),
    ("/api/v1/compare?ids=1", 400, "give 2 to 8 run ids"),
    ("/api/v1/compare?ids=1,x", 400, "run id 'x' is not a positive integer"),
    ("/api/v1/compare?ids=1,77", 404, "no run 77 in"),
    ("/api/v1/compare?a=1", 400, "give a= and b=: two runs"),
    ("/api/v1/compare?a=1&b=77", 404, "no run 77 in"),
    ("/api/v1/compare?a=nope&b=1", 404, "no run named 'nope' in"),
    ("/api/v1/compare?a=1&b=1", 400, "both name run 1: give two different runs"),
    ("/api/v1/compare?a=0&b=1", 400, "'0' is not a run id"),
    ("/api/v1/compare?ids=1,2&a=1&b=2", 400, "not both"),
    ("/api/v1/groups/nope", 404, "no runs in group 'nope'"),
    ("/api/v1/nothing", 404, "no such API path"),
]


async def test_bad_requests_get_a_json_error(storage_url: str) -> None:
    async with api(storage_url) as (client, _):
        for path, status, says in BAD:
            got = await _json(client, path, status)
            assert set(got) == {"error"} and says in got["error"], (path, got)


async def test_compare_two_runs_by_id_and_by_name(storage_url: str) -> None:
    """The long run (30 ms iterations, one 910 ms) against a 15 ms one: the
    compare of ``gpuprofctl compare``, by id and by name."""
    async with open_store(storage_url) as store:
        long_id = await _write_run(store)
        fast_id = await runsdb.insert_run(
            store,
            {"run_key": "k-fast", "run_name": "fast", "status": "running", "host": "h",
             "pid": 2, "rank": 0, "local_rank": 0, "world_size": 1, "auto": 1,
             "start_wall_ns": START_WALL, "start_mono_ns": 0, "options": {}},
        )  # fmt: skip
        for i in range(100):  # 5 ms wait + 10 ms step
            t0 = i * 15 * 10**6 + 5 * 10**6
            phases = {"forward": 4 * 10**6, "backward": 6 * 10**6}
            step = {"i": i, "t0": t0, "t1": t0 + 10**7, "wait": 5 * 10**6, "explicit": True,
                    "micro": 1, "phases": phases}  # fmt: skip
            await store.submit(runsdb.step_op(fast_id, step))
        await runsdb.update_run(store, fast_id, status="finished", end_mono_ns=1_500 * 10**6)
        await store.flush()
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            by_id = await _json(client, f"/api/v1/compare?a={long_id}&b={fast_id}")
            by_name = await _json(client, f"/api/v1/compare?a={long_id}&b=fast")
    assert by_name == by_id
    assert (by_id["a"]["run_id"], by_id["b"]["run_id"]) == (long_id, fast_id)
    assert by_id["a"]["run_name"] == HOSTILE
    steady = STEPS - 3  # the warm-up steps are not compared
    mean_long = (steady * 30 + (SPIKE_STEP_NS - STEP_NS) / 1e6) / steady
    assert by_id["a"]["mean_iteration_ms"] == pytest.approx(mean_long, abs=1e-3)
    assert by_id["b"]["mean_iteration_ms"] == 15.0
    assert by_id["speedup"] == pytest.approx(mean_long / 15, abs=1e-4)
    assert by_id["ci_low"] < by_id["speedup"] < by_id["ci_high"]
    # backward's time fell by 4 ms, 13 % of A's iteration, as its share rose
    # (33 to 40 %): named by its time, first (the largest change); no
    # optimizer (nor other) time in the fast run: named by share, up to two;
    # forward's share rose (17 to 27 %) as its time fell by 1 ms only: not
    assert re.fullmatch(
        r"B is 2\.0× faster \(95 % CI 2\.0\d–2\.0\d\): backward time per iteration fell "
        r"1\.67×; optimizer fell from 8 % to 0 %\.",
        by_id["verdict"],
    ), by_id["verdict"]
    wait = by_id["phases"][0]
    assert (wait["phase"], wait["b_ms"], wait["b_pct"]) == ("loader_wait", 5.0, 33.3)


async def _subscribe(ws: Any, msg: Any, until: str = "steps") -> list[dict[str, Any]]:
    """Send *msg*; the messages that follow, up to the first of type *until*
    (or a reset or an error)."""
    await ws.send_str(msg if isinstance(msg, str) else orjson.dumps(msg).decode())
    got = []
    while True:
        m = await ws.receive(timeout=30)
        assert m.type == aiohttp.WSMsgType.TEXT, m
        got.append(orjson.loads(m.data))
        if got[-1]["type"] in (until, "reset", "error"):
            return got


async def test_live_socket_bounds_what_it_sends(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run_id = await _write_run(store)
        state = WebState(reader=store, now_mono_ns=None, live_poll_s=0.05)
        server = test_utils.TestServer(build_app(state))
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(server.make_url("/api/v1/live"))
                # 10,000 steps behind: told to re-fetch, nothing else of the rows
                got = await _subscribe(ws, {"run": run_id, "cursors": {"step": -1, "t": 0}})
                assert [m["type"] for m in got][-1] == "reset"
                assert {m["type"] for m in got} <= {"run", "insights", "reset"}
                # near the end: only the newer rows, the run's state first
                t_end = (START_WALL + SECONDS * rollup.NS_PER_S) / 1e9
                sub = {"run": run_id, "cursors": {"step": STEPS - 5, "t": t_end - 2}}
                got = await _subscribe(ws, sub)
                kinds = [m["type"] for m in got]
                assert kinds[:2] == ["run", "insights"] and kinds[-1] == "steps"
                assert got[0]["run"]["status"] == "finished" and got[0]["run"]["name"] == HOSTILE
                assert [r["step"] for r in got[-1]["rows"]] == list(range(STEPS - 4, STEPS))
                for bad, says in (
                    ("not json", "not a subscribe message"),
                    ({"run": "1"}, "run must be a positive integer"),
                    ({"run": 1, "cursors": {"step": "x"}}, "cursors.step must be an integer"),
                    ({"run": 424242}, "no run 424242 in"),
                ):
                    *before, err = await _subscribe(ws, bad, "error")
                    assert err["type"] == "error" and says in err["error"]
                    assert {m["type"] for m in before} <= {"gpus", "host"}  # the last round's
                await server.close()  # the daemon shutting down
                closed = await ws.receive(timeout=30)
                assert closed.type == aiohttp.WSMsgType.CLOSE
                assert closed.data == aiohttp.WSCloseCode.GOING_AWAY
        finally:
            await server.close()


async def test_the_step_rollup_tier_keeps_the_spike_and_every_step(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run_id = await _write_run(store)
        # a run rolled up to step 15,000 (a live one's tier lags); the rest raw
        await runsdb.update_run(store, run_id, status="running")
        await store.submit(Op("DELETE FROM steps WHERE run_id = ? AND step > 7050", (run_id,)))
        await store.flush()
        assert await steprollup.roll_pass(store) == 70  # complete blocks only
        assert await steprollup.roll_pass(store) == 0
        for i in range(7051, STEPS):
            await store.submit(runsdb.step_op(run_id, _step(i)))
        await runsdb.update_run(store, run_id, status="finished")
        await store.flush()
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            whole = await _json(client, f"/api/v1/runs/{run_id}/series?width=50")
            t = (START_WALL + SPIKE_STEP * (STEP_NS + WAIT_NS)) / 1e9
            zoom = await _json(client, f"/api/v1/runs/{run_id}/series?from={t - 3}&to={t + 3}")
        assert await steprollup.roll_pass(store) == 30  # the ended run's blocks after it
        n = await store.fetchone("SELECT COUNT(*) AS n, SUM(n) AS s FROM step_rollups")
        assert (n["n"], n["s"]) == (100, STEPS)
    assert whole["tier"]["steps"] == "rollup" and zoom["tier"]["steps"] == "raw"
    steps = whole["steps"]
    assert sum(steps["n"]) == STEPS  # 70 blocks and the raw steps after them
    spike_ms = (SPIKE_STEP_NS + WAIT_NS) / 1e6
    assert max(steps["step_ms"]["max"]) == pytest.approx(spike_ms)
    assert sorted(steps["step_ms"]["max"])[-2] == pytest.approx((STEP_NS + WAIT_NS) / 1e6)
    mean_all = sum(m * k for m, k in zip(steps["step_ms"]["mean"], steps["n"], strict=True)) / STEPS
    assert mean_all == pytest.approx(
        (STEP_NS + WAIT_NS) / 1e6 + (SPIKE_STEP_NS - STEP_NS) / 1e6 / STEPS
    )
    stacked = sum(steps["phases_ms"][p][-1] for p in steps["phases_ms"])
    assert stacked == pytest.approx(steps["step_ms"]["mean"][-1], rel=1e-3)
    assert max(zoom["steps"]["step_ms"]["max"]) == pytest.approx(spike_ms)


async def test_a_live_socket_looks_when_its_run_changes_not_only_when_it_polls(
    storage_url: str,
) -> None:
    """A team server's live page: the poll is an hour here, so only the
    change notice can bring the new step; a notice about another run does not."""
    changes = RunChanges()
    async with open_store(storage_url) as store:
        run_id = await _write_run(store)
        state = WebState(
            reader=store, now_mono_ns=None, live_poll_s=3600.0, watch_runs=changes.watch
        )
        server = test_utils.TestServer(build_app(state))
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(server.make_url("/api/v1/live"))
                t_end = (START_WALL + SECONDS * rollup.NS_PER_S) / 1e9
                sub = {"run": run_id, "cursors": {"step": STEPS - 1, "t": t_end}}
                await ws.send_str(orjson.dumps(sub).decode())
                first = await ws.receive(timeout=30)  # the subscribe's own round: the run
                assert orjson.loads(first.data)["type"] == "run"
                while (m := await ws.receive(timeout=30)) and orjson.loads(m.data)["type"] != (
                    "insights"
                ):
                    pass
                # the round goes on after its insights (steps, GPU and host reads, each
                # saying nothing here): a step written meanwhile would be its news
                await asyncio.sleep(1.0)
                await store.submit(runsdb.step_op(run_id, _step(STEPS)))
                await store.flush()
                changes.tell({run_id + 1})  # another run: nothing to look for
                with contextlib.suppress(TimeoutError):
                    quiet = await ws.receive(timeout=1.0)
                    raise AssertionError(f"pushed without a change of its run: {quiet.data}")
                changes.tell({run_id})
                got = orjson.loads((await ws.receive(timeout=30)).data)
                assert got["type"] == "steps" and [r["step"] for r in got["rows"]] == [STEPS]
                await ws.close()
            for _ in range(300):  # the server's side of the socket ends after the close
                if not changes._watchers:
                    break
                await asyncio.sleep(0.1)
            assert not changes._watchers  # the closed socket stopped watching
        finally:
            await server.close()


async def test_the_host_rollup_tier_keeps_the_spike_and_the_means(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run_id = await _write_run(store)
        # 300 s of samples: blocks 500-528 are whole and complete (529 has no later sample)
        assert await hostrollup.roll_pass(store) == 29
        assert await hostrollup.roll_pass(store) == 0
        n = await store.fetchone("SELECT COUNT(*) AS k, SUM(n) AS n FROM host_rollups")
        assert (n["k"], n["n"]) == (29, 29 * 20)
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            whole = await _json(client, f"/api/v1/runs/{run_id}/series?width=10")
            t0 = START_WALL / 1e9
            inner = await _json(
                client, f"/api/v1/runs/{run_id}/series?width=10&from={t0 + 5}&to={t0 + 295}"
            )
            zoom = await _json(client, f"/api/v1/runs/{run_id}/series?width=1000")
    assert whole["tier"]["host"] == "rollup" and inner["tier"]["host"] == "rollup"
    assert zoom["tier"]["host"] == "raw"  # 0.15 s buckets: the samples themselves
    for got, first in ((whole, t0), (inner, t0 + 5)):
        host = got["host"]
        assert len(host["t"]) == 20 and host["t"][0] == pytest.approx(first)
        assert set(host["run_cores"]["min"]) == {1.0} and set(host["run_cores"]["max"]) == {2.0}
        assert host["run_cores"]["mean"] == pytest.approx([1.5] * 20)  # sums / counts, exact
        assert host["other_cores"]["mean"] == pytest.approx([0.5] * 20)
        disk = host["disk_read_bps"]["max"]
        assert disk.count(HOST_SPIKE_BPS) == 1 and set(disk) == {1e6, HOST_SPIKE_BPS}
        assert 1e6 < max(host["disk_read_bps"]["mean"]) < HOST_SPIKE_BPS / 10
        assert host["cpu_count"] == 4 and set(host["page_cache_bytes"]["mean"]) == {8e9}
    assert zoom["host"]["disk_read_bps"]["max"].count(HOST_SPIKE_BPS) == 1
    assert len(zoom["host"]["t"]) == 2 * SECONDS  # one sample per bucket


async def test_series_parts_reads_only_those_asked(storage_url: str) -> None:
    async with api(storage_url) as (client, run_id):
        steps = await _json(client, f"/api/v1/runs/{run_id}/series?width=50&parts=steps")
        rest = await _json(client, f"/api/v1/runs/{run_id}/series?width=50&parts=host,gpus")
        whole = await _json(client, f"/api/v1/runs/{run_id}/series?width=50")
        bad = await _json(client, f"/api/v1/runs/{run_id}/series?parts=steps,kernels", 400)
    assert set(steps) == {"window", "buckets", "tier", "steps"} and set(steps["tier"]) == {"steps"}
    assert set(rest) == {"window", "buckets", "tier", "gpus", "host"}
    assert list(rest["tier"]) == ["gpus", "host"]
    assert steps["steps"] == whole["steps"] and rest["host"] == whole["host"]
    assert rest["gpus"] == whole["gpus"] and steps["window"] == rest["window"]
    assert bad == {"error": "parts='steps,kernels' names 'kernels': give some of steps, gpus, host"}


async def test_a_run_without_a_device_shows_the_gpus_sampled_while_it_ran(
    storage_url: str,
) -> None:
    async with open_store(storage_url) as store:
        run_id = await _write_run(store)
        await runsdb.update_run(store, run_id, cuda_uuid=None)
        outside = "22222222-0000-0000-0000-000000000000"  # sampled before and after it only
        during = "33333333-0000-0000-0000-000000000000"
        other_boot = "44444444-0000-0000-0000-000000000000"
        for sec, uuid, boot in (
            (-5, outside, BOOT),
            (SECONDS + 5, outside, BOOT),
            (10, during, BOOT),
            (20, other_boot, "boot-b"),  # the same clock values, another boot's
        ):
            row = dict(zip(rollup.ROLLUP_COLUMNS, _rollup(0), strict=True))
            row.update(sec_ns=START_MONO + sec * rollup.NS_PER_S, uuid=uuid, boot_id=boot)
            await store.submit(runsdb.rollup_op(tuple(row.values())))
        await store.flush()
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            run = (await _json(client, f"/api/v1/runs/{run_id}"))["run"]
            got = await _json(client, f"/api/v1/runs/{run_id}/series?width=10&parts=gpus")
    want = ["11111111-2222-3333-4444-555555555555", during]
    assert [g["uuid"] for g in run["gpus"]] == want
    assert [g["mem_total_bytes"] for g in run["gpus"]] == [150 * 10**9] * 2
    assert [g["uuid"] for g in got["gpus"]] == want


async def _bare_run(store: Store, name: str, **extra: Any) -> int:
    """A running run named *name* with nothing but its start."""
    row = {"run_key": f"k-{name}", "run_name": name, "status": "running", "options": {}}
    row.update(start_wall_ns=START_WALL, start_mono_ns=START_MONO, **extra)
    return await runsdb.insert_run(store, row)


async def test_a_run_with_no_steps_yet_has_a_window_the_page_can_ask_again(
    storage_url: str,
) -> None:
    # a team server's run that has said hello but sent no step: no end, no last step
    async with open_store(storage_url) as store:
        run_id = await _bare_run(store, "empty", boot_id="another-node")
        await store.flush()
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            first = await _json(client, f"/api/v1/runs/{run_id}/series?width=100&parts=steps")
            w = first["window"]
            # the page's second request: the same window in unix seconds, as JSON gave it
            again = await _json(
                client,
                f"/api/v1/runs/{run_id}/series?from={w['from']}&to={w['to']}&width=100&parts=gpus,host",
            )
    assert w["to"] > w["from"] == START_WALL / 1e9
    assert again["window"] == w
    assert first["steps"]["t"] == [] and again["gpus"] == []


async def test_the_run_headline_is_the_summary_s_steady_state(storage_url: str) -> None:
    # a slow first step (warm-up): the page's mean and steps/s are the summary
    # block's steady-state figures, not a mean over every step
    async with open_store(storage_url) as store:
        run_id = await _bare_run(store, "warm")
        for i in range(40):
            step = _step(i)
            if i == 0:
                step["t1"] = step["t0"] + 2_000_000_000
            await store.submit(runsdb.step_op(run_id, step))
        await runsdb.update_run(store, run_id, status="finished", end_mono_ns=START_MONO + 10**10)
        await store.flush()
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            got = await _json(client, f"/api/v1/runs/{run_id}")
    run, summary = got["run"], got["summary"]
    assert run["mean_step_ms"] == summary["mean_iteration_ms"] == pytest.approx(30.0)
    assert run["steps_per_s"] == summary["steps_per_s"] == pytest.approx(33.333, abs=1e-3)
    assert summary["avg_step_ms"] > 70  # the warm-up step in the all-steps mean
