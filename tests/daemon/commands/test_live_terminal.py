"""gpuprofctl top and watch in a real pseudo-terminal (80 x 24, pexpect +
pyte), against a real gpuprofd (the recorded H200 replayed as its GPU)
while a real torch loop trains on the CPU: the run's name, its step count
and a finding show, q quits top, and watch ends with the run's summary."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemon.commands.terminal import Terminal
from tests.daemon.h200_replay import trace_path
from tests.daemon.helpers import Client, Daemons

pytestmark = pytest.mark.timeout(600)  # real torch and a daemon on a shared 2-core box

NAME = "live-demo"
#: A CPU loop whose DataLoader is slow (2 ms a sample, batches of 8), so the
#: loader wait is most of each step: argv NAME SOCKET_DIR DB STOP_FILE; it
#: trains until STOP_FILE exists.
TRAIN = r"""
import pathlib, sys, time
import torch, gpuprof
name, sock, db, stop = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
torch.manual_seed(0)
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 10**9
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(64), i % 10
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with gpuprof.profile(name, socket_dir=sock, db=db, autostart=False, print_summary=True):
    for x, y in torch.utils.data.DataLoader(Slow(), batch_size=8):
        if stop.exists():
            break
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""


@dataclass
class Training:
    sock_dir: Path
    client: Client
    proc: subprocess.Popen[str]
    stop: Path
    run_id: int

    def steps(self) -> int:
        """The run's steps as the daemon counts them now."""
        live = (self.client.ping(2.0) or {}).get("live_runs") or []
        return next((r["steps"] for r in live if r["run_id"] == self.run_id), -1)


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Training]:
    tmp = tmp_path_factory.mktemp("top")
    sock_dir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    script = tmp / "train.py"
    script.write_text(TRAIN)
    daemons = Daemons(tmp)
    env = {k: v for k, v in os.environ.items() if k != "GPUPROF_GPU_RATE"}
    env["GPUPROF_NVML"] = f"replay:{trace_path()}"
    stop = tmp / "stop"
    proc = None
    try:
        _, client = daemons.start_ready(
            sock_dir, tmp / "gpuprof.db", "--http", "127.0.0.1:0", env=env
        )
        proc = subprocess.Popen(
            [sys.executable, str(script), NAME, str(sock_dir), str(tmp / "gpuprof.db"), str(stop)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        reply = client.wait_for(
            lambda r: any(x["run_name"] == NAME for x in r.get("live_runs") or []), 120
        )
        run_id = next(x["run_id"] for x in reply["live_runs"] if x["run_name"] == NAME)
        yield Training(sock_dir, client, proc, stop, run_id)
    finally:
        stop.touch()
        if proc is not None:
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=10)
        daemons.kill_all()
        shutil.rmtree(sock_dir, ignore_errors=True)


def shown_steps(screen: str) -> int | None:
    """The STEPS column of the run's row in top's frame."""
    m = re.search(rf"^\s*\d+ {NAME}\s+\S+\s+\S+\s+(\d+)\s", screen, re.M)
    return int(m.group(1)) if m else None


#: A finding line: the run's id, its severity, its title.
FINDING = re.compile(r"^\s*\d+ \[(HIGH|MED|LOW)\]\s+\S", re.M)


def test_top_shows_the_run_its_steps_and_a_finding_and_q_quits(training: Training) -> None:
    term = Terminal("top", "--socket-dir", str(training.sock_dir))
    try:
        first = term.wait_for(lambda s: (shown_steps(s) or 0) > 0, 120, "the run's row")
        before = shown_steps(first)
        # refreshed: the count moves on, a finding shows (the live pass: ~10 s)
        screen = term.wait_for(
            lambda s: (shown_steps(s) or 0) > (before or 0) and FINDING.search(s) is not None,
            120,
            "a later step count and a finding",
        )
        lines = screen.splitlines()
        assert lines[0].startswith("gpuprof top · 127.0.0.1:") and "1 live run" in lines[0]
        assert shown_steps(screen) <= training.steps()  # never ahead of the daemon
        assert any(ln.startswith("  0 NVIDIA H200") for ln in lines)  # the replayed GPU
        assert any(ln.startswith("CPU ") and "cores busy" in ln for ln in lines)
        assert all(len(ln) <= 80 for ln in lines)
        term.send("s")  # the next sort key
        term.wait_for(lambda s: "sort: name ▼" in s.splitlines()[0], 30, "the name sort")
        term.send("\r")  # watch the picked run, on the same socket
        head = f"gpuprof watch · #{training.run_id} {NAME}"
        term.wait_for(lambda s: s.startswith(head) and "b back  q quit" in s, 60, "its watch")
        term.send("b")
        term.wait_for(lambda s: s.startswith("gpuprof top · "), 30, "top again")
        term.send("q")
        assert term.wait_exit(20) == 0
        assert b"\x1b[?1049l" in term.raw  # the alternate screen left: the shell's is back
    finally:
        term.close()


def test_sigterm_restores_the_terminal(training: Training) -> None:
    term = Terminal("top", "--socket-dir", str(training.sock_dir))
    try:
        term.wait_for(lambda s: (shown_steps(s) or 0) > 0, 120, "the run's row")
        term.child.kill(signal.SIGTERM)
        assert term.wait_exit(20) == 0
        assert b"\x1b[?1049l" in term.raw and b"\x1b[?25h" in term.raw  # screen and cursor back
    finally:
        term.close()


def test_watch_follows_the_run_and_ends_with_its_summary(training: Training) -> None:
    term = Terminal("watch", "--socket-dir", str(training.sock_dir))
    try:
        head = f"gpuprof watch · #{training.run_id} {NAME}"
        screen = term.wait_for(
            lambda s: (
                s.startswith(head)
                and re.search(r"^\d+ steps · ", s, re.M) is not None
                and re.search(r"^  \[(HIGH|MED|LOW)\] ", s, re.M) is not None
            ),
            120,
            "the run's header, its steps and a finding",
        )
        count = int(re.search(r"^(\d+) steps · ", screen, re.M).group(1))
        assert 0 < count <= training.steps()
        assert re.search(r"^Findings \(\d+, whole run, as of \d\d:\d\d:\d\d\):$", screen, re.M)
        assert any(ln.startswith("GPU 0 NVIDIA H200") for ln in screen.splitlines())
        training.stop.touch()  # the loop ends: watch prints the summary and exits 0
        assert term.wait_exit(120) == 0
        out = term.raw.decode(errors="replace")
        assert f"gpuprof · {NAME}  (" in out and "Insights (" in out
    finally:
        term.close()
