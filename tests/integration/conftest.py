"""Real processes: training scripts in subprocesses, a real gpuprofd, real sockets."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuprofd.commands import client
from gpuprofd.core.errors import NoDaemonError
from gpuprofd.ingest.procs import pid_alive
from tests.backends import pg_url, storage_url  # noqa: F401 - fixtures
from tests.daemon.helpers import query

REPO = Path(__file__).resolve().parents[2]


def ping(socket_dir: Path, timeout_s: float = 0.5) -> dict | None:
    """The daemon's ping reply, or None if none answers in *socket_dir*."""
    try:
        return client.ping(socket_dir, timeout_s)
    except NoDaemonError:
        return None


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class Node:
    """One isolated gpuprof node: its socket dir, its database, its env."""

    socket_dir: Path
    db: Path
    workdir: Path
    daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            GPUPROF_SOCKET=str(self.socket_dir),
            GPUPROF_DB=str(self.db),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
        )
        env.pop("GPUPROF_NVML", None)
        return env

    def run_script(self, code: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        script = self.workdir / f"train_{time.monotonic_ns()}.py"
        script.write_text(code)
        return subprocess.run(
            [sys.executable, str(script), *args],
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def spawn_script(self, code: str, *args: str) -> subprocess.Popen:
        script = self.workdir / f"train_{time.monotonic_ns()}.py"
        script.write_text(code)
        return subprocess.Popen(
            [sys.executable, str(script), *args],
            env=self.env,
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def torchrun(
        self, code: str, nproc: int, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """Run *code* under ``torchrun --standalone`` with *nproc* ranks (gloo, CPU)."""
        script = self.workdir / f"ddp_{time.monotonic_ns()}.py"
        script.write_text(code)
        torchrun = Path(sys.executable).with_name("torchrun")
        return subprocess.run(
            [
                str(torchrun),
                "--standalone",
                f"--nproc-per-node={nproc}",
                "--monitor-interval=0.2",
                str(script),
            ],
            env={**self.env, **(env or {})},
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        """``gpuprofctl ARGS`` against this node."""
        return subprocess.run(
            [sys.executable, "-m", "gpuprofd.ctl", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def group_json(self, group: str) -> dict | None:
        """``gpuprofctl insights --group GROUP --format json`` once the group
        has ended, else None."""
        out = self.ctl("insights", str(self.db), "--group", group, "--format", "json")
        if out.returncode != 0:
            return None
        data = json.loads(out.stdout)
        return data if data["ended"] else None

    def only_group(self) -> str:
        """The one group id in the database (asserts there is exactly one)."""
        rows = self.query("SELECT DISTINCT group_id FROM runs")
        assert len(rows) == 1 and rows[0][0], [tuple(r) for r in rows]
        return rows[0][0]

    def start_daemon(self, idle_exit_s: float = 0) -> subprocess.Popen:
        with (self.workdir / "gpuprofd.stderr").open("ab") as log:
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
                    str(idle_exit_s),
                ],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.daemons.append(proc)
        wait_for(lambda: ping(self.socket_dir), 20, "gpuprofd to answer ping")
        return proc

    def query(self, sql: str, *params) -> list[sqlite3.Row]:
        return query(self.db, sql, params)

    def stop_daemon(self) -> None:
        self._stop_answering()
        for proc in self.daemons:  # the ones this test started: reap them
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)

    def _stop_answering(self) -> None:
        info = ping(self.socket_dir)
        if info and info.get("pid"):
            pid = info["pid"]
            try:
                os.kill(pid, signal.SIGTERM)
                wait_for(lambda: not _alive(pid), 10, f"gpuprofd {pid} to exit")
            except (ProcessLookupError, AssertionError):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _alive(pid: int) -> bool:
    return pid_alive(pid)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    # ipc paths must fit in 107 bytes: keep the socket dir short, under /tmp
    socket_dir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    n = Node(socket_dir=socket_dir, db=tmp_path / "gpuprof.db", workdir=tmp_path)
    try:
        yield n
    finally:
        n.stop_daemon()
        shutil.rmtree(socket_dir, ignore_errors=True)
