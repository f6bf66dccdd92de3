"""Host sampler (fake psutil) and the NVML wrapper (real, mock, fake pynvml)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprof import config
from gpuprofd.sampling.backend import open_backend
from gpuprofd.sampling.gpu_sampler import GpuSampler
from gpuprofd.sampling.host_sampler import HostSampler
from gpuprofd.sampling.nvml import NO_GPU_NOTE, MockNvml, RealNvml, match_uuid


class FakePsutil:
    """Scripted cumulative counters: one entry consumed per sample. Without
    *read_count*, *swap_in* or *memory* the fake offers no such reading (its
    objects lack the field), as a platform that does not report it."""

    def __init__(
        self,
        cpu: list[list[float]],
        read_bytes: list[int | None],
        read_count: list[int] | None = None,
        swap_in: list[int] | None = None,
        memory: list[dict[str, int]] | None = None,
    ) -> None:
        self.cpu, self.read_bytes = list(cpu), list(read_bytes)
        self.read_count = None if read_count is None else list(read_count)
        self.swap_in = None if swap_in is None else list(swap_in)
        self.memory = None if memory is None else list(memory)

    def cpu_percent(self, percpu: bool = False) -> list[float]:
        assert percpu is True
        return self.cpu.pop(0)

    def disk_io_counters(self) -> Any:
        rb = self.read_bytes.pop(0)
        count = self.read_count.pop(0) if self.read_count is not None else None
        if rb is None:
            return None
        return SimpleNamespace(read_bytes=rb, **({} if count is None else {"read_count": count}))

    def swap_memory(self) -> Any:
        if self.swap_in is None:
            return SimpleNamespace(total=0)
        return SimpleNamespace(sin=self.swap_in.pop(0))

    def virtual_memory(self) -> Any:
        return SimpleNamespace(**(self.memory.pop(0) if self.memory else {}))

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
        500_000_000,
        50.0,
        4,
        10_000.0,
    )  #   # 5000 bytes in 0.5 s
    s2 = sampler.sample()
    assert (s2.cpu_pct, s2.disk_read_bps) == (100.0, 0.0)
    s3 = sampler.sample()
    assert (s3.cpu_pct, s3.disk_read_bps) == (10.0, None)  # no disk counters: unknown


def test_host_sampler_reports_iops_page_cache_ram_swap_in_and_per_core() -> None:
    ticks = iter([0, 250_000_000, 750_000_000])
    gib = 2**30
    ps = FakePsutil(
        cpu=[[0.0, 0.0], [20.0, 80.0], [100.0, 0.0]],
        read_bytes=[0, 1_000, 2_000],
        read_count=[100, 600, 600],
        swap_in=[4096, 4096 + 2**20, 4096 + 2**20],
        memory=[
            {"cached": 10 * gib, "total": 64 * gib},
            {"cached": 12 * gib, "total": 64 * gib},
        ],
    )
    sampler = HostSampler(psutil=ps, clock=lambda: next(ticks))
    assert sampler.sample() is None
    s1 = sampler.sample()
    assert s1.per_core_pct == (20.0, 80.0) and s1.cpu_pct == 50.0
    assert s1.disk_read_iops == 2_000.0  # 500 reads in 0.25 s
    assert s1.swap_in_bps == 4 * 2**20  # 1 MiB in 0.25 s
    assert (s1.page_cache_bytes, s1.mem_total_bytes) == (10 * gib, 64 * gib)
    s2 = sampler.sample()
    assert (s2.disk_read_iops, s2.swap_in_bps, s2.page_cache_bytes) == (0.0, 0.0, 12 * gib)


def test_host_readings_a_platform_lacks_are_none_not_zero() -> None:
    # no read_count, no swap sin, no cached/total: as a platform that lacks them
    ps = FakePsutil(cpu=[[5.0]] * 3, read_bytes=[0, 100, 200])
    sampler = HostSampler(psutil=ps, clock=iter([0, 10**9, 2 * 10**9]).__next__)
    sampler.sample()
    s = sampler.sample()
    assert s.disk_read_bps == 100.0
    assert (s.disk_read_iops, s.swap_in_bps, s.page_cache_bytes, s.mem_total_bytes) == (
        None,
        None,
        None,
        None,
    )

    class Windows(FakePsutil):
        WINDOWS = True  # psutil's swap sin is always 0 there: not a reading

    win = Windows(cpu=[[5.0]] * 2, read_bytes=[0, 0], swap_in=[0, 0])
    sampler = HostSampler(psutil=win, clock=iter([0, 10**9]).__next__)
    sampler.sample()
    assert sampler.sample().swap_in_bps is None


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
    caplog.set_level("INFO", logger="gpuprofd.sampling.nvml")
    backend, note = open_backend(config.nvml_backend({}))
    assert (backend, note) == (None, NO_GPU_NOTE)
    lines = [r for r in caplog.records if r.name == "gpuprofd.sampling.nvml"]
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
        "GPU-1234abcd",
        87.0,
        10 * 2**30,
        None,
        61,
        None,
    )
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

    from gpuprofd.sampling.host_sampler import ProcessTreeCpu

    # a "training process" with one busy child (a CPU-bound loader worker)
    busy = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "time.sleep(60)\n"
    )
    idle = "import time; time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (busy, idle)]
    import psutil

    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(procs[0].pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = psutil.Process(procs[0].pid).children()
        tree = ProcessTreeCpu()
        pids = {1: procs[0].pid, 2: procs[1].pid}
        before = sum(child.cpu_times()[:2])
        assert tree.sample(pids) == {}  # the first look only records each run's total
        time.sleep(1.5)
        cores = tree.sample(pids)
        spun = sum(child.cpu_times()[:2]) - before
        # the spinning child counts toward its parent's run: however much CPU the
        # host let it have (a core on a free box, a sliver on a busy one), all of it
        assert spun > 0
        assert cores[1] >= 0.9 * spun / 1.6
        assert cores[1] > cores[2]
    finally:
        for p in procs:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait(10)
    assert tree.sample(pids) == {}  # gone processes are left out, and forgotten
    assert tree._roots == {} and tree._last == {}


def test_process_tree_cpu_counts_workers_that_live_and_die_between_samples() -> None:
    """DataLoader workers respawn each epoch; a short epoch's workers can start,
    burn CPU and be reaped between two samples. Their time is still the run's
    (the kernel adds a reaped child's time to its parent's children_* times)."""
    import subprocess
    import sys
    import time

    from gpuprofd.sampling.host_sampler import ProcessTreeCpu

    # three "epochs" of a worker spinning ~0.3 s of CPU, each joined (reaped)
    burst = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    trainer = (
        "import subprocess, sys, time\n"
        "time.sleep(0.5)\n"
        f"for _ in range(3): subprocess.run([sys.executable, '-c', {burst!r}])\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", trainer])
    try:
        tree = ProcessTreeCpu()
        tree.sample({1: proc.pid})
        t0 = time.monotonic()
        deadline = t0 + 30
        import psutil

        while time.monotonic() < deadline:  # until all three workers came and went
            time.sleep(0.5)
            if (
                psutil.Process(proc.pid).cpu_times().children_user
                + psutil.Process(proc.pid).cpu_times().children_system
            ) >= 0.85:
                break
        time.sleep(0.3)
        cores = tree.sample({1: proc.pid})[1]
        cpu_s = cores * (time.monotonic() - t0)
        # never sampled alive, yet ~0.9 CPU-s of them counted (+ interpreter start-ups)
        assert cpu_s >= 0.85, cpu_s
    finally:
        proc.kill()
        proc.wait(10)


# --- deadline scheduling, on a fake clock ------------------------------------------


class FakeClock:
    """Monotonic ns that only moves when a query "costs" time or the loop sleeps.

    ``wait`` is the loop's sleep: it advances the clock and asks to stop after
    *max_waits* sleeps, so a loop runs a known number of ticks in the test thread."""

    def __init__(self, max_waits: int) -> None:
        self.ns = 0
        self.max_waits = max_waits
        self.waits: list[float] = []

    def __call__(self) -> int:
        return self.ns

    def cost(self, ms: float) -> None:
        self.ns += round(ms * 1e6)

    def wait(self, seconds: float) -> bool:
        assert seconds >= 0
        self.waits.append(seconds)
        self.ns += round(seconds * 1e9)
        return len(self.waits) >= self.max_waits


class CostlyBackend(MockNvml):
    """A mock GPU whose n-th fast sample costs ``costs_ms(n)`` on the fake clock."""

    def __init__(self, clock: FakeClock, costs_ms: Any) -> None:
        super().__init__(clock=lambda: clock.ns / 1e9)
        self.fake_clock, self.costs_ms, self.n = clock, costs_ms, 0

    def sample(self, device: Any) -> Any:
        self.fake_clock.cost(self.costs_ms(self.n))
        self.n += 1
        return super().sample(device)


def run_fast_loop(costs_ms: Any, ticks: int, hz: float = 100) -> tuple[list[int], Any]:
    """Run the sampler's fast loop for *ticks* ticks; (tick start times in ns, stats)."""
    clock = FakeClock(max_waits=ticks)
    starts: list[int] = []
    sampler = GpuSampler(
        CostlyBackend(clock, costs_ms),
        hz=hz,
        sink=lambda t, s: starts.append(t),
        clock=clock,
        wait=clock.wait,
    )
    sampler.fast.run()
    return starts, sampler.stats()["fast"]


def test_deadline_ticks_are_due_at_start_plus_k_periods_without_drift() -> None:
    # every sample costs 3 ms: a loop that slept one period after each tick would
    # drift 3 ms a tick (3 s over these 1000 ticks); deadlines keep it exact
    starts, stats = run_fast_loop(lambda n: 3.0, ticks=1000)
    assert starts == [k * 10_000_000 for k in range(1000)]
    assert (stats.ticks, stats.missed_ticks) == (1000, 0)
    assert stats.achieved_hz == pytest.approx(100.0)
    assert stats.tick_s_max == pytest.approx(0.003)


def test_a_slow_query_skips_the_slots_it_overran_and_never_bursts() -> None:
    # tick 4 (due at 40 ms) costs 25 ms: it ends at 65 ms, inside slot 6's window
    starts, stats = run_fast_loop(lambda n: 25.0 if n == 4 else 1.0, ticks=10)
    ms = [t / 1e6 for t in starts]
    assert ms == [0, 10, 20, 30, 40, 65, 70, 80, 90, 100]
    assert stats.missed_ticks == 1  # slot 5 (50 ms) was dropped, not run late
    gaps = [b - a for a, b in zip(ms, ms[1:], strict=False)]
    assert min(gaps) >= 5  # no catch-up burst: never two ticks back to back
    assert ms[6:] == [70, 80, 90, 100]  # and back on the original schedule


def test_a_loop_slower_than_its_period_reports_the_rate_it_achieved() -> None:
    # every sample costs 15 ms at 100 Hz: one slot in three is lost
    starts, stats = run_fast_loop(lambda n: 15.0, ticks=301)
    assert [t / 1e6 for t in starts[:5]] == [0, 15, 30, 45, 60]
    assert stats.ticks == 301
    assert stats.achieved_hz == pytest.approx(1000 / 15, rel=1e-3)
    assert stats.missed_ticks == 150  # slots 2, 5, 8, …: 4.5 s of ticks, 450 slots
    assert stats.requested_hz == 100


def test_slow_loop_rate_is_capped_at_one_hertz() -> None:
    with pytest.raises(ValueError, match="slow-loop rate"):
        GpuSampler(MockNvml(), hz=100, sink=lambda *_: None, slow_hz=5)
    with pytest.raises(ValueError, match="> 0 Hz"):
        GpuSampler(MockNvml(), hz=0, sink=lambda *_: None)


def test_slow_loop_feeds_its_own_sink_from_its_own_thread() -> None:
    got: list[tuple[str, list[Any]]] = []
    done = threading.Event()

    def slow_sink(mono_ns: int, samples: list[Any]) -> None:
        got.append((threading.current_thread().name, samples))
        done.set()

    sampler = GpuSampler(MockNvml(), hz=50, sink=lambda *_: None, slow_sink=slow_sink)
    sampler.start()
    assert done.wait(10)
    sampler.stop()
    ((thread, samples),) = got[:1]
    assert thread == "gpuprofd-gpu-slow"
    assert samples[0].gpm_sm_util_pct is not None and samples[0].energy_mj is None


def test_a_device_that_keeps_failing_is_logged_once_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Lost(MockNvml):
        lost = True

        def sample(self, device: Any) -> Any:
            if self.lost:
                raise RuntimeError("GPU has fallen off the bus")
            return super().sample(device)

    backend = Lost()
    sampler = GpuSampler(backend, hz=100, sink=lambda *_: None)
    caplog.set_level("ERROR", logger="gpuprofd.sampling.gpu_sampler")
    assert [sampler.tick() for _ in range(5)] == [[]] * 5
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None
    backend.lost = False
    assert len(sampler.tick()) == 1
    backend.lost = True
    sampler.tick()
    assert len(caplog.records) == 2  # failing again after recovering: a new line
