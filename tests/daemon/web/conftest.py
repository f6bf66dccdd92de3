"""A real gpuprofd (subprocess) serving the dashboard on a free loopback
port, the recorded H200 trace replayed as its GPU, and real CPU torch
training runs against it (subprocesses), for the end-to-end API tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemon.h200_replay import trace_path
from tests.daemon.helpers import Client, Daemons

#: A CPU training loop under gpuprof.profile(dashboard=True): argv NAME STEPS
#: SOCKET_DIR DB [STOP_FILE]; with a STOP_FILE it trains until that file exists.
TRAIN = r"""
import sys, time, pathlib
import torch, gpuprof
name, steps, sock, db = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
stop = pathlib.Path(sys.argv[5]) if len(sys.argv) > 5 else None
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
with gpuprof.profile(name, socket_dir=sock, db=db, dashboard=True, autostart=False,
                     group=name + "-group", print_summary=True):
    i = 0
    while (stop is None and i < steps) or (stop is not None and not stop.exists()):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.01)
        i += 1
"""

HOSTILE_NAME = "<img src=x onerror=alert(1)> \"'\u202eeman\u202c"


@dataclass
class Node:
    """The daemon, its dashboard URL, and how to run training against it."""

    daemons: Daemons
    proc: subprocess.Popen[bytes]
    client: Client
    sock_dir: Path
    db: Path
    url: str
    script: Path

    def train(self, name: str, steps: int) -> subprocess.CompletedProcess[str]:
        """Train *steps* steps as run *name*, to the end."""
        return subprocess.run(
            [sys.executable, str(self.script), name, str(steps), str(self.sock_dir), str(self.db)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )

    def start_training(self, name: str, stop: Path) -> subprocess.Popen[str]:
        """Train as run *name* until *stop* exists."""
        return subprocess.Popen(
            [
                sys.executable,
                str(self.script),
                name,
                "0",
                str(self.sock_dir),
                str(self.db),
                str(stop),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def live_run_id(self, name: str, min_steps: int, timeout_s: float = 300) -> int:
        """The id of live run *name* once it has *min_steps* steps (by ping)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in (self.client.ping(1.0) or {}).get("live_runs") or []:
                if r["run_name"] == name and r["steps"] >= min_steps:
                    return int(r["run_id"])
            time.sleep(0.1)
        raise AssertionError(f"run {name!r} not live with {min_steps} steps: {self.log()}")

    def log(self) -> str:
        return self.daemons.log(self.proc)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("web")
    sock_dir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    script = tmp / "train.py"
    script.write_text(TRAIN)
    daemons = Daemons(tmp)
    env = {"GPUPROF_NVML": f"replay:{trace_path()}", "GPUPROF_GPU_RATE": ""}
    env = {**{k: v for k, v in os.environ.items() if k != "GPUPROF_GPU_RATE"}, **env}
    try:
        proc, client = daemons.start_ready(
            sock_dir, tmp / "gpuprof.db", "--http", "127.0.0.1:0", env=env
        )
        url = client.ping(2.0)["dashboard_url"]
        assert url.startswith("http://127.0.0.1:"), url
        yield Node(daemons, proc, client, sock_dir, tmp / "gpuprof.db", url, script)
    finally:
        daemons.kill_all()
        shutil.rmtree(sock_dir, ignore_errors=True)
