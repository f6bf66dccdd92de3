"""Real CPU training runs on two nodes (mock GPUs), each labelled with its
project by GPUPROF_PROJECT, forwarded to a real team server: the server's
GPU-hours by project, and its lost GPU-hours by finding, are the runs' own
(wall time x GPUs; the summary's fix-all figure, split over the findings
that claim it) in /api/v1/rollups and on /metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuprofd.sampling.nvml import MockNvml
from tests.daemon.forward.conftest import TRAIN, db_rows, ended_on_server, serve, wait_until
from tests.daemon.server.conftest import KEY_ONE, TeamServer

pytestmark = pytest.mark.timeout(420)

#: The run trains on the CPU but says it uses the node's mock GPU (the one
#: thing mocked): the run then has one GPU, and GPU-hours.
MOCK_GPU = f"""
import gpuprof_shim.identity as _identity
_identity.cuda_uuid = lambda: {MockNvml.DEVICE.uuid!r}
"""


def _train(node: Any, name: str, project: str) -> subprocess.Popen[str]:
    script = node.workdir / f"train_{name}.py"
    script.write_text(MOCK_GPU + TRAIN)
    env = {**node.env, "GPUPROF_PROJECT": project, "GPUPROF_TAGS": f"node={node.name}"}
    return subprocess.Popen(
        [sys.executable, str(script), name, "40", "0.03"],
        env=env, cwd=node.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_forwarded_runs_gpu_hours_are_their_own(
    tmp_path: Path, team_servers: list[TeamServer], nodes: Any
) -> None:
    storage = f"sqlite:///{tmp_path / 'team.db'}"
    server = serve(tmp_path, storage)
    team_servers.append(server)
    a, b = nodes("node-a"), nodes("node-b")
    a.start(server.url)
    b.start(server.url)
    procs = [_train(a, "pretrain", "llm"), _train(b, "resnet", "<b>vision</b>")]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
    uuids = [a.rows("SELECT run_uuid FROM runs")[0][0], b.rows("SELECT run_uuid FROM runs")[0][0]]
    for u in uuids:
        wait_until(lambda u=u: ended_on_server(storage, u), 120, "the runs' ends on the server")

    # what each run says of itself, on the server
    want_hours: dict[str, float] = {}
    want_lost: dict[str, float] = {}
    rules: set[str] = set()
    for u in uuids:
        ((project, tags, gpus, start, end, text),) = db_rows(
            storage,
            "SELECT project, tags, gpu_count, start_wall_ns, end_wall_ns, summary FROM runs "
            "WHERE run_uuid = ?",
            (u,),
        )
        assert gpus >= 1  # the node's mock GPU
        assert orjson.loads(tags)["node"] in ("node-a", "node-b")
        summary = orjson.loads(text)
        hours = (end - start) / 3.6e12 * gpus
        lost = min((summary["gains"]["fix_all_run_s"] or 0.0) * gpus / 3600, hours)
        want_hours[project] = hours
        want_lost[project] = lost
        rules |= {i["rule"] for i in summary["insights"] if i.get("gain_run_s")}
    # the collate sleeps: the loader stalls. Which loader finding claims it
    # depends on the mock GPU's utilization (a 31 s wave, 40-90 %), which
    # bounds the stall: dataloader_stall above 15 %, prefetch_queue_starved below
    assert rules & {"dataloader_stall", "prefetch_queue_starved"}
    assert all(v > 0 for v in want_lost.values())

    key = {"Authorization": f"Bearer {KEY_ONE}"}
    with httpx.Client(base_url=server.url, headers=key, timeout=30) as c:
        out = c.get("/api/v1/rollups?by=project&since=1d").json()
        by_finding = c.get("/api/v1/rollups?by=finding&since=1d").json()
        metrics = c.get("/metrics").text
    got = {g["key"]: g for g in out["groups"]}
    assert set(got) == {"llm", "<b>vision</b>"}
    for project, hours in want_hours.items():
        assert got[project]["gpu_hours"] == pytest.approx(hours, rel=1e-9)
        assert got[project]["lost_gpu_hours"] == pytest.approx(want_lost[project], rel=1e-6)
    findings = {f["rule"]: f["lost_gpu_hours"] for f in by_finding["groups"]}
    assert set(findings) == rules
    # each run's lost time once: the findings add up to the runs' loss
    assert sum(findings.values()) == pytest.approx(sum(want_lost.values()), rel=1e-6)
    counted = {
        s.labels["project"]: s.value
        for fam in text_string_to_metric_families(metrics)
        for s in fam.samples
        if s.name == "gpuprof_gpu_hours_total"
    }
    assert counted == {p: pytest.approx(h, rel=1e-9) for p, h in want_hours.items()}
