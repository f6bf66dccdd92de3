from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends import pg_url, storage_url  # noqa: F401 - fixtures for tests/daemon
from tests.daemon.helpers import Client, Daemons


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short socket directory (ipc paths must fit in 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemons]:
    monkeypatch.delenv("GPUPROF_NVML", raising=False)
    monkeypatch.delenv("GPUPROF_GPU_RATE", raising=False)
    d = Daemons(tmp_path)
    yield d
    d.kill_all()


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose pid a test run can claim (and then kill)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def my_pid() -> int:
    return os.getpid()
