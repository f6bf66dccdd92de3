"""An in-process daemon stops its parts by name in the documented order:
stop accepting → in-flight requests → samplers and periodic tasks → socket files."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path

import pytest

from gpuprof import config
from gpuprofd.daemon import Daemon, DaemonOptions
from gpuprofd.storage import filecheck, schema


async def test_shutdown_stops_tasks_by_name_in_the_documented_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))  # ipc paths are short
    try:
        db = tmp_path / "g.db"
        schema.prepare(db)
        caplog.set_level(logging.DEBUG, logger="gpuprofd")
        daemon = Daemon(DaemonOptions(socket_dir=sock_dir, db=db, nvml_backend="mock"))
        serving = asyncio.create_task(daemon.serve())
        control = sock_dir / config.CONTROL_SOCKET_NAME
        for _ in range(500):
            if control.exists() or serving.done():
                break
            await asyncio.sleep(0.01)
        assert control.exists()
        daemon.stop()
        assert await asyncio.wait_for(serving, timeout=30) == 0
        # socket files removed; the note of a clean stop left (the next start's check skipped)
        assert [p.name for p in sock_dir.iterdir()] == [filecheck.CLEAN_STAMP]
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    lines = [r.getMessage() for r in caplog.records]
    stopped = [
        m.removeprefix("task ").removesuffix(" stopped")
        for m in lines
        if m.startswith("task ") and m.endswith(" stopped")
    ]
    assert stopped == [
        "ingest",
        "control",
        "stop-when-drained",
        "watch-db",
        "pack-samples",
        "roll-host",
        "pack-steps",
        "roll-steps",
        "prune-comm",
        "compact-kernels",
        "prune-raw",
        "backfill-costs",
        "lifecycle",
        "host",
    ]
    down = lines.index("gpuprofd shutting down")
    gpu = next(i for i, m in enumerate(lines) if m.startswith("GPU fast loop"))
    assert down < lines.index("task ingest stopped") and lines.index("task host stopped") < gpu
