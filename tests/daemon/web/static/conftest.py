"""Fixtures for the page's tests: a real headless Chromium (Debian's, driven by
Playwright) against a real gpuprofd serving HTTP, with real CPU torch runs in
it (the page is ``gpuprofd/web/static/``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.h200_replay import trace_path

CHROMIUM = Path("/usr/bin/chromium")
#: No sandbox (tests may run as root in a container), no GPU, and nothing that
#: reaches the network or updates itself while a test runs.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]

#: One CPU training loop under the shim: argv steps, loader sleep (s), name,
#: group ("" for none), then a time (s) still inside the run after its last
#: step (0 for none); RANK/WORLD_SIZE from the environment for a group.
TRAIN = r"""
import sys, time
import torch
from torch import nn
import gpuprof

STEPS = int(sys.argv[1]); SLEEP = float(sys.argv[2]); NAME = sys.argv[3]
GROUP = sys.argv[4] or None
TAIL = float(sys.argv[5])
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()

def batches():
    while True:
        time.sleep(SLEEP)  # the input pipeline
        yield torch.randn(16, 32), torch.randint(0, 4, (16,))

with gpuprof.profile(NAME, group=GROUP):
    it = batches()
    for step in range(STEPS):
        x, y = next(it)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    time.sleep(TAIL)  # an end of training with no steps (a final save, say)
print("TRAINED", STEPS)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Dash:
    """One node: a gpuprofd serving the dashboard, its database, its runs."""

    socket_dir: Path
    db: Path
    workdir: Path
    port: int
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            GPUPROF_SOCKET=str(self.socket_dir),
            GPUPROF_DB=str(self.db),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
        )
        for k in ("GPUPROF_NVML", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
            env.pop(k, None)
        return env

    def get(self, path: str) -> Any:
        """GET *path* (``/api/v1/...``) as JSON."""
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return json.loads(resp.read())

    def start_daemon(self) -> None:
        env = {**self.env, "GPUPROF_NVML": f"replay:{trace_path()}"}
        log = (self.workdir / "gpuprofd.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuprofd",
                "--socket-dir",
                str(self.socket_dir),
                "--db",
                str(self.db),
                "--idle-exit",
                "0",
                "--http",
                f"127.0.0.1:{self.port}",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        deadline = time.monotonic() + 90  # generous: the test machine is shared
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"gpuprofd exited {proc.returncode}: {self.log()}")
            try:
                self.get("/api/v1/runs")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.1)
        raise AssertionError(f"gpuprofd never served http: {self.log()}")

    def log(self) -> str:
        return (self.workdir / "gpuprofd.log").read_text(errors="replace")

    def train(
        self,
        steps: int,
        sleep_s: float,
        name: str,
        group: str = "",
        env: dict | None = None,
        tail_s: float = 0.0,
    ) -> subprocess.Popen:
        """Start the training loop (*sleep_s*: its loader's wait before each
        step, s; *tail_s*: how long the run goes on after its last step, s);
        returns its process (see :meth:`finish`)."""
        script = self.workdir / "train.py"
        if not script.exists():  # once: a rank still starting may be reading it
            script.write_text(TRAIN)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(steps), str(sleep_s), name, group, str(tail_s)],
            env={**self.env, **(env or {})},
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen, name: str) -> dict[str, Any]:
        """Wait for *proc* to train and its run to end; its /runs row."""
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0 and "TRAINED" in out, (out, err)
        return self.wait_run(name, lambda r: r["status"] != "running", "its run to end")

    def wait_run(self, name: str, ok, what: str, timeout_s: float = 180) -> dict[str, Any]:
        """The /runs row named exactly *name* once ``ok(row)``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for row in self.get("/api/v1/runs")["runs"]:
                if row["run_name"] == name and ok(row):
                    return row
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what} ({name[:40]!r}): {self.log()[-3000:]}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    """A gpuprofd with the recorded H200 trace as its GPU, serving HTTP."""
    socket_dir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))  # ipc paths < 107 bytes
    work = tmp_path_factory.mktemp("dash")
    d = Dash(socket_dir=socket_dir, db=work / "gpuprof.db", workdir=work, port=free_port())
    d.start_daemon()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture(scope="module")  # not the session: Playwright's sync API holds an event
def browser() -> Iterator[Any]:  # loop open, and later asyncio tests could not run their own
    if not CHROMIUM.exists():
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/test.sh does)"
        print(f"\ngpuprof: browser tests skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "the playwright package is not installed (pip install -r requirements-dev.txt)"
        print(f"\ngpuprof: browser tests skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page with its console errors and uncaught exceptions collected."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            self.errors.append(f"console: {msg.text}")

    def open(self, url: str) -> Any:
        """Go to *url* and wait for its view to have drawn (body[data-ready=1])."""
        self.page.goto(url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        return self.page


@pytest.fixture
def pages(browser: Any) -> Iterator[Any]:
    """new(color_scheme="light", width=1440) -> Watched; contexts closed after."""
    contexts = []

    def new(color_scheme: str = "light", width: int = 1440, height: int = 900) -> Watched:
        ctx = browser.new_context(
            viewport={"width": width, "height": height}, color_scheme=color_scheme
        )
        contexts.append(ctx)
        return Watched(ctx.new_page())

    yield new
    for ctx in contexts:
        ctx.close()
