"""Daemon wiring that needs no running loop: rollup rows wait out a full store
queue instead of being dropped; numeric options refuse NaN and infinity."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprofd import daemon as daemon_mod
from gpuprofd.daemon import Daemon, DaemonOptions


@pytest.fixture
def make_daemon(tmp_path: Path):
    made: list[Daemon] = []

    def make() -> Daemon:
        made.append(Daemon(DaemonOptions(socket_dir=tmp_path, db=tmp_path / "g.db")))
        return made[-1]

    yield make
    for d in made:
        d._zmq.term()  # noqa: SLF001 - never bound: nothing else to release


def test_rollup_rows_wait_in_a_backlog_while_the_store_queue_is_full(make_daemon):
    d = make_daemon()
    d.store.queue = asyncio.Queue(maxsize=2)
    d._store_rollups([("a",), ("b",), ("c",)])  # noqa: SLF001
    assert d.store.queue.qsize() == 2 and list(d._rollup_backlog) == [("c",)]  # noqa: SLF001
    assert d.drops.snapshot() == {}  # waiting, not dropped
    d.store.queue.get_nowait()
    d._store_rollups([("d",)])  # noqa: SLF001 - room for one: the oldest goes first
    assert [d.store.queue.get_nowait().params for _ in range(2)] == [("b",), ("c",)]
    assert list(d._rollup_backlog) == [("d",)]  # noqa: SLF001


def test_a_full_backlog_counts_what_it_loses(make_daemon, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(daemon_mod, "ROLLUP_BACKLOG_ROWS", 2)
    d = make_daemon()
    d.store.queue = asyncio.Queue(maxsize=1)
    d._store_rollups([(1,), (2,), (3,), (4,)])  # noqa: SLF001
    assert list(d._rollup_backlog) == [(3,), (4,)]  # noqa: SLF001
    assert d.store.queue.get_nowait().params == (1,)
    assert d.drops.snapshot() == {"rollup_backlog_full": 1}


@pytest.mark.parametrize("option", ["--sample-hz", "--raw-window", "--idle-exit"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_numeric_options_refuse_nan_and_infinity(tmp_path: Path, option: str, value: str):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprofd", "--db", str(tmp_path / "g.db"), option, value],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert proc.returncode == 2
    assert f"Invalid value for '{option}'" in proc.stderr
    assert "not a finite number" in proc.stderr or "not in the range" in proc.stderr


def test_an_unknown_gpu_backend_is_one_clear_line(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprofd", "--db", str(tmp_path / "g.db")],
        capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "GPUPROF_NVML": "bogus"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpuprofd: error: GPUPROF_NVML='bogus' is not a GPU backend: use real (the default), "
        "mock, or replay:PATH (a recorded nvml_trace.jsonl)"
    ]
