"""Host sampler (fake psutil) and the NVML wrapper (real, mock, fake pynvml)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprof import config
from gpuprofd.gpu_sampler import GpuSampler
from gpuprofd.host_sampler import HostSampler
from gpuprofd.nvml import NO_GPU_NOTE, MockNvml, RealNvml, match_uuid, open_backend


class FakePsutil:
    """Scripted cumulative counters: one entry consumed per sample."""

    def __init__(self, cpu: list[list[float]], read_bytes: list[int | None]) -> None:
        self.cpu, self.read_bytes = list(cpu), list(read_bytes)

    def cpu_percent(self, percpu: bool = False) -> list[float]:
        assert percpu is True
        return self.cpu.pop(0)

    def disk_io_counters(self) -> Any:
        rb = self.read_bytes.pop(0)
        return None if rb is None else SimpleNamespace(read_bytes=rb)

    def cpu_count(self) -> int:
        return 4


def test_host_sampler_primes_then_averages_cores_and_rates_disk_reads() -> None:
    ticks = iter([0, 500_000_000, 1_000_000_000, 1_500_000_000])
    ps = FakePsutil(
        cpu=[[0.0, 0.0, 0.0, 0.0], [50.0, 100.0, 0.0, 50.0], [100.0] * 4, [10.0] * 4],
        read_bytes=[1_000, 6_000, 6_000, None],
    )
    sampler = HostSampler(psutil=ps, clock=lambda: next(ticks))
    assert sampler.sample() is None  # priming call: psutil's first cpu_percent is meaningless
    s1 = sampler.sample()
    assert (s1.mono_ns, s1.cpu_pct, s1.cpu_count, s1.disk_read_bps) == (
        500_000_000, 50.0, 4, 10_000.0,
    )  # fmt: skip  # 5000 bytes in 0.5 s
    s2 = sampler.sample()
    assert (s2.cpu_pct, s2.disk_read_bps) == (100.0, 0.0)
    s3 = sampler.sample()
    assert (s3.cpu_pct, s3.disk_read_bps) == (10.0, None)  # no disk counters: unknown


async def test_host_sampler_run_feeds_the_sink() -> None:
    ps = FakePsutil(cpu=[[0.0]] + [[25.0]] * 50, read_bytes=[0] * 51)
    got: list[Any] = []
    sampler = HostSampler(psutil=ps)
    import asyncio

    task = asyncio.create_task(sampler.run(got.append, interval_s=0.01))
    while len(got) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [s.cpu_pct for s in got[:3]] == [25.0, 25.0, 25.0]


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA GPU")
def test_real_backend_without_gpu_is_off_with_the_note(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="gpuprofd.nvml")
    backend, note = open_backend(config.nvml_backend({}))
    assert (backend, note) == (None, NO_GPU_NOTE)
    lines = [r for r in caplog.records if r.name == "gpuprofd.nvml"]
    assert len(lines) == 1 and NO_GPU_NOTE in lines[0].getMessage()
    assert lines[0].exc_info is None


def test_missing_library_is_off_with_the_note() -> None:
    def importer() -> Any:
        raise ImportError("No module named 'pynvml'")

    assert open_backend("real", importer) == (None, NO_GPU_NOTE)


def test_mock_only_when_asked() -> None:
    assert config.nvml_backend({}) == "real"
    backend, note = open_backend(config.nvml_backend({"GPUPROF_NVML": "mock"}))
    assert isinstance(backend, MockNvml) and note is None
    (dev,) = backend.devices()
    assert dev.name == "Mock GPU"
    sample = backend.sample(dev)
    assert 0 <= sample.util_pct <= 100 and sample.mem_total_bytes == 80 * 2**30


class FakeNvmlError(Exception):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


class FakePynvml:
    """A pynvml stand-in with one GPU that does not report power."""

    NVMLError = FakeNvmlError
    NVMLError_NotSupported = FakeNotSupported
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        return b"GPU-1234abcd"

    def nvmlDeviceGetName(self, h: str) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=10 * 2**30, total=141 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        raise FakeNotSupported()

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 61

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        raise FakeNvmlError("GPU is lost")


def test_unsupported_or_failing_query_is_none_not_a_failed_sample() -> None:
    backend, note = open_backend("real", lambda: FakePynvml())  # type: ignore[arg-type,return-value]
    assert isinstance(backend, RealNvml) and note is None
    (dev,) = backend.devices()
    s = backend.sample(dev)
    assert (s.uuid, s.util_pct, s.mem_used_bytes, s.power_mw, s.temp_c, s.sm_clock_mhz) == (
        "GPU-1234abcd", 87.0, 10 * 2**30, None, 61, None,
    )  # fmt: skip
    assert match_uuid([dev], "1234ABCD") == dev and match_uuid([dev], "ffff") is None


def test_gpu_sampler_thread_ticks_at_its_rate_and_stops() -> None:
    got: list[tuple[int, list[Any]]] = []
    enough = threading.Event()

    def sink(mono_ns: int, samples: list[Any]) -> None:
        got.append((mono_ns, samples))
        if len(got) >= 5:
            enough.set()

    sampler = GpuSampler(MockNvml(), hz=100, sink=sink)
    sampler.start()
    assert enough.wait(timeout=10)
    sampler.stop()
    n = len(got)
    assert all(len(samples) == 1 and samples[0].index == 0 for _, samples in got)
    assert [t for t, _ in got] == sorted(t for t, _ in got)
    threading.Event().wait(0.05)
    assert len(got) == n  # stopped means stopped


def test_process_tree_cpu_counts_busy_workers_not_sleeping_ones() -> None:
    import subprocess
    import sys
    import time

    from gpuprofd.host_sampler import ProcessTreeCpu

    # a "training process" with one busy child (a CPU-bound loader worker)
    busy = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "time.sleep(60)\n"
    )
    idle = "import time; time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (busy, idle)]
    try:
        tree = ProcessTreeCpu()
        pids = {1: procs[0].pid, 2: procs[1].pid}
        deadline = time.monotonic() + 20
        while True:  # until the busy child exists and has been primed once
            first = tree.sample(pids)
            if len(tree._procs) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(1.0)
        cores = tree.sample(pids)
        assert first.keys() == {1, 2}
        assert cores[1] > 0.5  # the spinning child counts toward its parent's run
        assert cores[2] < 0.2
    finally:
        import psutil

        for p in procs:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait(10)
    assert tree.sample(pids) == {}  # gone processes are left out, and forgotten
    assert tree._procs == {}
