"""The team's GPU-hours from a real ``gpuprofd serve`` fed by forwarded runs
of two users and two projects: /api/v1/rollups as JSON and as CSV (parsed by
the csv module, asked for both ways), ``gpuprofctl rollup`` over the same
database, each matching the runs' own findings (tests/daemon/server/rollup_fixture.py)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuprofd.web.teammetrics import MAX_PROJECTS, project_labels
from tests.daemon.server.conftest import KEY_ONE, TeamServer
from tests.daemon.server.rollup_fixture import FIX, HOSTILE, IDLE, STALL, feed
from tests.daemon.server.test_live_views import ctl


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TeamServer]:
    tmp = tmp_path_factory.mktemp("rollups")
    s = TeamServer(tmp, f"sqlite:///{tmp / 'team.db'}").start()
    try:
        feed(s)
        yield s
    finally:
        s.stop()


def _get(server: TeamServer, path: str, **headers: str) -> httpx.Response:
    with server.client(headers={"Authorization": f"Bearer {KEY_ONE}", **headers}) as c:
        return c.get(path)


def test_the_api_sums_the_forwarded_runs_by_project(server: TeamServer) -> None:
    resp = _get(server, "/api/v1/rollups?by=project&since=7d")
    assert resp.status_code == 200, resp.text
    out = resp.json()
    t = out["totals"]
    assert (t["runs"], t["gpu_hours"], t["usd"]) == (2, pytest.approx(88.0), pytest.approx(352.0))
    assert t["lost_gpu_hours"] == pytest.approx(9.0)
    by = {g["key"]: g for g in out["groups"]}
    assert set(by) == {"llm", HOSTILE}  # stored and sent as sent: the page shows it as text
    assert by["llm"]["gpu_hours"] == pytest.approx(80.0)
    assert by["llm"]["share"] == pytest.approx(80 / 88)
    assert by[HOSTILE]["lost_gpu_hours"] == pytest.approx(1.0)
    assert [r["run_name"] for r in by["llm"]["worst_runs"]] == ["pretrain"]
    stall, idle = out["findings"]
    assert (stall["rule"], idle["rule"]) == ("dataloader_stall", "gpu_idle_between_steps")
    assert stall["lost_gpu_hours"] == pytest.approx(STALL)
    assert idle["lost_gpu_hours"] == pytest.approx(IDLE)
    assert stall["fix"] == FIX
    assert sum(out["weeks"][-1]["lost"].values()) == pytest.approx(9.0)  # counted once


def test_the_csv_parses_both_ways(server: TeamServer) -> None:
    by_query = _get(server, "/api/v1/rollups?by=user&since=30d&format=csv")
    by_accept = _get(server, "/api/v1/rollups?by=user&since=30d", Accept="text/csv")
    for resp in (by_query, by_accept):
        assert resp.status_code == 200
        assert resp.headers["Content-Type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(resp.text)))
        got = {
            r["key"]: (int(r["runs"]), float(r["gpu_hours"]), float(r["lost_gpu_hours"]))
            for r in rows
        }
        assert got == {
            "alice": (1, pytest.approx(80.0), pytest.approx(8.0)),
            "bob": (1, pytest.approx(8.0), pytest.approx(1.0)),
        }


def test_bad_parameters_are_a_400(server: TeamServer) -> None:
    assert _get(server, "/api/v1/rollups?by=gpu").status_code == 400
    resp = _get(server, "/api/v1/rollups?since=yesterday")
    assert resp.status_code == 400 and "24h, 7d" in resp.json()["error"]


def test_gpuprofctl_rollup_reads_the_same(server: TeamServer) -> None:
    url = server.storage_url
    got = ctl(
        "rollup", "--storage-url", url, "--by", "project", "--since", "7d", "--format", "json"
    )
    assert got.returncode == 0, got.stderr
    out = orjson.loads(got.stdout)
    assert {g["key"]: round(g["gpu_hours"], 6) for g in out["groups"]} == {
        "llm": 80.0,
        HOSTILE: 8.0,
    }
    text = ctl("rollup", "--storage-url", url, "--by", "finding", "--since", "7d")
    assert text.returncode == 0, text.stderr
    assert "2 runs, 88.0 GPU-hours ($352.00), 9.0 lost (10%)" in text.stdout
    assert f"dataloader_stall: {STALL:.1f} GPU-hours lost in 2 runs — {FIX}" in text.stdout


def test_metrics_count_the_gpu_hours_by_project_and_finding(server: TeamServer) -> None:
    with server.client() as c:
        anon = c.get("/metrics", follow_redirects=False)  # a key or a session first
        assert (anon.status_code, anon.headers["Location"]) == (303, "/login")
    resp = _get(server, "/metrics")
    assert resp.status_code == 200, resp.text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(resp.text)
        for s in fam.samples
        if s.name.startswith("gpuprof_") and s.name.endswith("_total")
    }
    assert samples == {
        ("gpuprof_gpu_hours_total", (("project", "llm"),)): pytest.approx(80.0),
        ("gpuprof_gpu_hours_total", (("project", HOSTILE),)): pytest.approx(8.0),
        ("gpuprof_lost_gpu_hours_total", (("finding", "dataloader_stall"), ("project", "llm"))): (
            pytest.approx(8 * 8 / 14)
        ),
        (
            "gpuprof_lost_gpu_hours_total",
            (("finding", "gpu_idle_between_steps"), ("project", "llm")),
        ): (pytest.approx(IDLE)),
        ("gpuprof_lost_gpu_hours_total", (("finding", "dataloader_stall"), ("project", HOSTILE))): (
            pytest.approx(1.0)
        ),
    }


def test_projects_past_the_bound_are_other() -> None:
    names = [f"p{i}" for i in range(MAX_PROJECTS + 5)]
    labels = project_labels([None, *names])
    assert labels[None] == "none"
    assert [labels[n] for n in names[: MAX_PROJECTS - 1]] == names[: MAX_PROJECTS - 1]
    assert {labels[n] for n in names[MAX_PROJECTS - 1 :]} == {"other"}
    assert project_labels(["other", "x"]) == {"other": "other", "x": "x"}
