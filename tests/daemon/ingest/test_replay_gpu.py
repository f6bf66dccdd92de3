"""Under a replayed GPU a run that names no CUDA device is taken to run on
the replayed one; a run that names its own keeps it; without one, no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.sampling.nvml import GpuDevice
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import schema
from gpuprofd.storage.writes import Store
from tests.daemon import helpers as h
from tests.daemon.helpers import query

REPLAYED = GpuDevice(0, "GPU-69cfecb8-dd0f-d46a-a967-785474cc5ca4", "NVIDIA H200")
OTHER = GpuDevice(1, "GPU-11111111-2222-3333-4444-555555555555", "NVIDIA H100")


@pytest.mark.parametrize(
    ("default", "cuda_uuid", "want"),
    [
        (REPLAYED, None, (REPLAYED.uuid, "NVIDIA H200", 1)),  # a CPU run: the replayed GPU
        (REPLAYED, OTHER.uuid, (OTHER.uuid, "NVIDIA H100", 1)),  # its own device wins
        (None, None, (None, None, 0)),  # real or mock GPUs: a CPU run has none
    ],
)
async def test_a_run_without_a_cuda_device_gets_the_default_gpu(
    tmp_path: Path, default: GpuDevice | None, cuda_uuid: str | None, want: tuple
):
    db = tmp_path / "r.db"
    schema.prepare(db)
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    runs = RunService(
        store,
        RunRegistry(),
        InsightsRunner(store, str(db), None),
        [REPLAYED, OTHER],
        pid_alive=lambda pid, _wall: True,
        default_gpu=default,
    )
    try:
        extra = {"cuda_uuid": cuda_uuid} if cuda_uuid else {}
        live = await runs.hello(h.hello("k", os.getpid(), **extra))
        await store.flush()
        assert live.cuda_uuid == want[0]
    finally:
        await store.close()
    (row,) = query(db, "SELECT cuda_uuid, gpu_model, gpu_count FROM runs")
    assert tuple(row) == want
