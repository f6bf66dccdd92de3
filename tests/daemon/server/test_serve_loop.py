"""The team server process's event loop and collector settings
(gpuprofd.server.serve.run_loop, tune_gc), each in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_the_collector_is_tuned_and_startup_objects_frozen() -> None:
    out = _run(
        "import gc\n"
        "from gpuprofd.server.serve import GC_THRESHOLDS, tune_gc\n"
        "before = gc.get_threshold()\n"
        "tune_gc()\n"
        "print(before == GC_THRESHOLDS, gc.get_threshold() == GC_THRESHOLDS,"
        " gc.get_freeze_count() > 1000)"
    )
    assert out == "False True True"


def test_the_server_runs_on_uvloop_where_installed() -> None:
    pytest.importorskip("uvloop")
    out = _run(
        "import asyncio\n"
        "from gpuprofd.server.serve import run_loop\n"
        "async def main():\n"
        "    loop = asyncio.get_running_loop()\n"
        "    print(type(loop).__module__.split('.')[0])\n"
        "run_loop(main())"
    )
    assert out == "uvloop"
