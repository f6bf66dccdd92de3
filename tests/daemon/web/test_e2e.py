"""End to end: a real gpuprofd with the H200 trace replayed, real CPU torch
runs, the API over HTTP and the live WebSocket. Each documented example in
docs/dashboard.md is checked against the real response's shape."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
import pytest

from gpuprof.protocol import clean_run_name
from tests.daemon.web.conftest import HOSTILE_NAME, Node

#: The name as the shim sends it (unprintable characters made spaces): stored verbatim.
STORED_NAME = clean_run_name(HOSTILE_NAME)

pytestmark = pytest.mark.timeout(600)  # real torch subprocesses on a shared 2-core box

DOC = Path(__file__).resolve().parents[3] / "docs" / "dashboard.md"
#: Objects whose keys are free-form (a summary, a rule's evidence, counts by
#: status, a finding: each rule may add its own fields, such as its gain;
#: a finding's gain parts and the fix-all parts: the parts claimed).
FREE = (
    "summary",
    "evidence",
    "counts",
    "top_insight",
    "gain_a",
    "gain_b",
    "gain_parts_ms",
    "fix_all_parts_ms",
)
#: Objects the doc shows cut short: its keys must be there, others may be too.
SUBSET = ("compare.runs[].run",)


def documented_examples() -> dict[str, Any]:
    """``<!-- example: NAME -->`` then a ```json block, for each example."""
    text = DOC.read_text()
    found = re.findall(r"<!-- example: (\w+) -->\s*```json\n(.*?)```", text, re.S)
    return {name: orjson.loads(body) for name, body in found}


def check_shape(doc: Any, real: Any, path: str = "") -> None:
    """*real* has *doc*'s shape: the same keys (dicts), element shapes (the
    first element of non-empty lists), and JSON types; null in either is any."""
    if doc is None or real is None:
        return
    if isinstance(doc, dict):
        assert isinstance(real, dict), f"{path}: {type(real).__name__}, documented an object"
        name = path.rsplit(".", 1)[-1]
        if name in FREE:
            return
        if path in SUBSET:
            assert set(doc) <= set(real), f"{path}: lacks {set(doc) - set(real)}"
        else:
            assert set(doc) == set(real), (
                f"{path}: undocumented {set(real) - set(doc)}, missing {set(doc) - set(real)}"
            )
        for k, v in doc.items():
            check_shape(v, real[k], f"{path}.{k}")
    elif isinstance(doc, list):
        assert isinstance(real, list), f"{path}: {type(real).__name__}, documented a list"
        if doc and real:
            check_shape(doc[0], real[0], f"{path}[]")
    elif isinstance(doc, bool):
        assert isinstance(real, bool), f"{path}: {real!r}, documented a bool"
    elif isinstance(doc, (int, float)):
        assert isinstance(real, (int, float)) and not isinstance(real, bool), f"{path}: {real!r}"
    else:
        assert isinstance(real, type(doc)), f"{path}: {real!r}, documented {type(doc).__name__}"


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


@pytest.fixture(scope="module")
def finished(node: Node) -> tuple[int, int, str, str]:
    """Two finished runs: a hostile-named one and a plain one (ids), the
    hostile run's first line of output and its group."""
    out = node.train(HOSTILE_NAME, 40)
    first = out.stdout.splitlines()[0]
    node.train("plain-run", 30)
    runs = asyncio.run(_get(f"{node.url}/api/v1/runs"))["runs"]
    ids = {r["name"]: r["id"] for r in runs}
    group = next(r["group"] for r in runs if r["name"] == STORED_NAME)
    return ids[STORED_NAME], ids["plain-run"], first, group


def test_profile_prints_the_runs_dashboard_url_first(node: Node, finished: tuple) -> None:
    hostile_id, _, first, _ = finished
    assert first == f"gpuprof dashboard: {node.url}/#/run/{hostile_id}"


def test_the_daemon_serves_metrics_of_its_replayed_gpu(node: Node, finished: tuple) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async def scrape() -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(f"{node.url}/metrics") as resp:
            return resp.status, await resp.text()

    status, text = asyncio.run(scrape())
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (util,) = families["gpuprof_gpu_utilization_ratio"].samples  # the trace's one GPU
    assert util.labels["uuid"].startswith("GPU-") and 0.0 <= util.value <= 1.0
    (received,) = families["gpuprof_events_received"].samples
    assert received.value >= 70  # the two finished runs' steps at least (40 + 30)


def test_status_prints_the_url(node: Node) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuprofd.ctl", "status", "--socket-dir", str(node.sock_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert f"  dashboard:  {node.url}\n" in out.stdout
    js = subprocess.run(
        [sys.executable, "-m", "gpuprofd.ctl", "status", "--socket-dir", str(node.sock_dir)]
        + ["--format", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert orjson.loads(js.stdout)["dashboard_url"] == node.url


def test_documented_examples_have_the_real_shapes(node: Node, finished: tuple) -> None:
    hostile_id, plain_id, _, group_name = finished
    docs = documented_examples()
    api = f"{node.url}/api/v1"
    group = quote(group_name, safe="")
    paths = {
        "runs": "/runs",
        "nodes": "/nodes",
        "run": f"/runs/{hostile_id}",
        "insights": f"/runs/{hostile_id}/insights",
        "series": f"/runs/{hostile_id}/series?width=300",
        "kernels": f"/runs/{hostile_id}/kernels",
        "compare": f"/compare?ids={hostile_id},{plain_id}",
        "compare_pair": f"/compare?a={hostile_id}&b={plain_id}",
        "group": f"/groups/{group}",
    }
    assert set(paths) <= set(docs), f"undocumented: {set(paths) - set(docs)}"
    real = {name: asyncio.run(_get(api + p)) for name, p in paths.items()}
    for name, got in real.items():
        check_shape(docs[name], got, name)
    # the hostile name verbatim everywhere it shows
    assert "<img src=x onerror=alert(1)>" in STORED_NAME
    assert real["run"]["run"]["name"] == STORED_NAME
    assert real["compare"]["runs"][0]["run"]["name"] == STORED_NAME
    assert real["compare_pair"]["a"]["run_name"] == STORED_NAME
    assert real["compare_pair"]["verdict"].startswith("B is ")
    assert real["group"]["group"] == group_name and "<img" in group_name
    assert [r["run_id"] for r in real["group"]["ranks"]] == [hostile_id]
    # the replayed H200 is the run's GPU (the CPU run reported no CUDA device), with data
    (gpu,) = real["series"]["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["uuid"].startswith("GPU-")
    assert gpu["mem_total_bytes"] > 100 * 2**30 and len(gpu["t"]) > 0
    assert all(u is not None for u in gpu["util_pct"]["max"])
    assert real["run"]["run"]["gpus"][0]["uuid"] == gpu["uuid"]
    assert real["run"]["run"]["gpus"][0]["power_limit_w"] == 700.0  # the probe's limit
    steps = real["series"]["steps"]
    assert sum(steps["n"]) == 40 == real["run"]["run"]["steps"]
    assert real["compare"]["steps"][1]["step"][:3] == [0, 1, 2]


async def _live(url: str, sub: dict[str, Any], until: Any, timeout_s: float = 120) -> list[bytes]:
    """Messages of one live socket (subscribed with *sub*) until *until*(messages)."""
    got: list[bytes] = []
    async with aiohttp.ClientSession() as s, s.ws_connect(f"{url}/api/v1/live") as ws:
        await ws.send_str(orjson.dumps(sub).decode())
        while not until([orjson.loads(m) for m in got]):
            msg = await ws.receive(timeout=timeout_s)
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            assert b'"reset"' not in msg.data.encode()[:20], [m[:30] for m in got]
            got.append(msg.data.encode())
    return got


def _of(msgs: list[bytes], kind: str) -> list[dict[str, Any]]:
    return [m for m in map(orjson.loads, msgs) if m["type"] == kind]


def _steps_seen(msgs: list[dict[str, Any]]) -> int:
    return sum(len(m["rows"]) for m in msgs if m["type"] == "steps")


def test_live_socket_sends_only_new_rows_and_resumes(node: Node, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    proc = node.start_training("live-run", stop)
    try:
        run_id = node.live_run_id("live-run", 5)
        first = asyncio.run(
            _live(
                node.url,
                {"run": run_id, "cursors": {"step": -1, "t": 0}},
                lambda ms: _steps_seen(ms) >= 30 and any(m["type"] == "gpus" for m in ms),
            )
        )
        rows = [r for m in _of(first, "steps") for r in m["rows"]]
        indices = [r["step"] for r in rows]
        assert indices == sorted(set(indices)) and indices[0] == 0  # each step once, in order
        assert _of(first, "run")[0]["run"]["status"] == "running"
        last_step, last_t = indices[-1], _of(first, "gpus")[-1]["samples"][-1]["t"]

        # a reconnect with cursors gets only newer rows
        again = asyncio.run(
            _live(
                node.url,
                {"run": run_id, "cursors": {"step": last_step, "t": last_t}},
                lambda ms: _steps_seen(ms) >= 1 and any(m["type"] == "gpus" for m in ms),
            )
        )
        assert all(r["step"] > last_step for m in _of(again, "steps") for r in m["rows"])
        assert all(s["t"] > last_t for m in _of(again, "gpus") for s in m["samples"])

        # later in the run: a message holds the last second's rows, not the run
        early = [m for m in first if b'"steps"' in m[:20]]
        node.live_run_id("live-run", indices[-1] + 150)
        top = node.client.ping(1.0)["live_runs"]
        total = next(r["steps"] for r in top if r["run_id"] == run_id)
        late = asyncio.run(
            _live(
                node.url,
                {"run": run_id, "cursors": {"step": total - 1, "t": last_t}},
                # three rounds of steps, and the host's samples (2 Hz) among them
                lambda ms: (
                    sum(m["type"] == "steps" for m in ms) >= 3
                    and any(m["type"] == "host" for m in ms)
                ),
            )
        )
        late_steps = [m for m in late if b'"steps"' in m[:20]][1:]  # the first catches up
        per_row = [len(m) / len(orjson.loads(m)["rows"]) for m in (early[-1], late_steps[-1])]
        assert per_row[1] < 1.5 * per_row[0]  # a row costs the same early and late
        # each message starts where the one before ended: deltas, never the run again
        # (how many rows one holds depends on how busy the box is, so that is not asserted)
        late_rows = [[r["step"] for r in m["rows"]] for m in _of(late, "steps")]
        late_rows = [r for r in late_rows if r]
        assert late_rows[0][0] >= total  # the cursor said: after step total - 1
        for before, after in zip(late_rows, late_rows[1:], strict=False):
            assert after[0] == before[-1] + 1, (before[-3:], after[:3])
        assert max(map(len, late_steps)) < 64 * 1024

        docs = documented_examples()
        for kind in ("steps", "gpus", "host", "insights", "run"):
            seen = _of(first + again + late, kind)
            assert seen, f"no {kind} message on any of the three sockets"
            check_shape(docs[f"live_{kind}"], seen[-1], f"live_{kind}")
    finally:
        stop.touch()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
