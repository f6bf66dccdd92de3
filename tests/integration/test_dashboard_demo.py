"""``examples/dashboard_demo.py`` in a short run: a CPU run stored with its
steps, on the replayed H200 (the GPU rollups are the trace's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuprofd.sampling.nvml import normalize_uuid
from tests.daemon import h200_replay
from tests.daemon.helpers import query
from tests.integration.conftest import REPO


def test_the_demo_stores_a_run_on_the_replayed_gpu(tmp_path: Path):
    trace = h200_replay.trace_path()
    db = tmp_path / "demo.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
    env = {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    demo = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "dashboard_demo.py"), "--seconds", "5"]
        + ["--db", str(db), "--trace", str(trace)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert demo.stdout is not None
        said = [demo.stdout.readline() for _ in range(2)]  # "in a terminal", the URL
        # while it trains, the command it printed finds its gpuprofd by the database
        watch = next(line for line in said if line.startswith("in a terminal: "))
        assert watch.split(": ", 1)[1].split() == ["gpuprofctl", "top", str(db)]
        top = subprocess.run(
            [sys.executable, "-m", "gpuprofd.ctl", "top", str(db), "--once"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        stdout, stderr = demo.communicate(timeout=180)
    finally:
        demo.kill()
    assert top.returncode == 0, top.stderr
    assert "1 live run" in top.stdout and "dashboard-d" in top.stdout, top.stdout
    assert demo.returncode == 0, stderr
    assert "gpuprof · dashboard-demo" in stdout
    (run,) = query(db, "SELECT id, run_name, status, cuda_uuid, gpu_model FROM runs")
    assert (run["run_name"], run["status"]) == ("dashboard-demo", "finished")
    probe = json.loads(trace.with_name("probe.json").read_text())["calls"]
    assert run["cuda_uuid"] == probe["uuid"]["value"]  # the CPU run is on the replayed GPU
    assert run["gpu_model"] == probe["name"]["value"]
    steps = query(
        db, "SELECT COUNT(*), MIN(t0_ns), MAX(t1_ns) FROM steps WHERE run_id = ?", (run["id"],)
    )[0]
    assert steps[0] >= 20, stdout  # 5 s of ~30 ms steps
    # its GPU is the trace's: the rollups over its steps carry the recorded memory size
    first = json.loads(trace.read_text().splitlines()[1])
    rollups = query(
        db,
        "SELECT COUNT(*), MIN(mem_total_bytes), MAX(mem_total_bytes), MAX(util_max) "
        "FROM gpu_rollups WHERE uuid = ? AND sec_ns >= ? AND sec_ns <= ?",
        (normalize_uuid(run["cuda_uuid"]), steps[1] - 10**9, steps[2]),
    )[0]
    assert rollups[0] >= 3, "a row per second of the run"
    assert rollups[1] == rollups[2] == first["mem_total"]
    assert 0 <= rollups[3] <= 100
