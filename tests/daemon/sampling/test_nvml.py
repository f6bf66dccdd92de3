"""The NVML wrapper over the H200 replay, "not available" values, the
no-library path, and UUID matching (torch, NVML, CUDA_VISIBLE_DEVICES, MIG)."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from statistics import mean
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuprof import config
from gpuprofd.sampling import nvml
from gpuprofd.sampling.backend import open_backend
from gpuprofd.sampling.gpu_sampler import GpuSampler
from gpuprofd.sampling.nvml import (
    FAST_CALLS,
    NO_GPU_NOTE,
    SLOW_CALLS,
    GpuDevice,
    RealNvml,
    match_uuid,
    normalize_uuid,
)
from gpuprofd.sampling.nvml_replay import REPLAY_UUID, ReplayPynvml
from tests.daemon import helpers as h

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "h200"
TRACE = FIXTURES / "nvml_trace.jsonl"
H200_UUID = "GPU-69cfecb8-dd0f-d46a-a967-785474cc5ca4"  # probe.json's calls.uuid

pytestmark = pytest.mark.skipif(not TRACE.exists(), reason="H200 fixture not checked out")


class ReplayClock:
    """Seconds since the replay began, set by the test."""

    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> float:
        return self.s


def replay(clock: ReplayClock | None = None, **kw: Any) -> tuple[ReplayPynvml, RealNvml]:
    clock = clock or ReplayClock()
    fake = ReplayPynvml.from_file(TRACE, clock=clock, **kw)
    return fake, RealNvml(fake, clock=clock, name="replay")


def phase_samples(name: str, hz: float = 100.0) -> tuple[list[Any], list[Any]]:
    """Fast samples at *hz* and slow samples at 1 Hz over one phase of the trace."""
    clock = ReplayClock()
    fake, backend = replay(clock)
    (dev,) = backend.devices()
    t0, t1 = fake.trace.phase(name)
    start, end = t0 - fake.trace.t_start + 0.05, t1 - fake.trace.t_start
    fast, slow = [], []
    clock.s = start
    backend.slow_sample(dev)  # primes the counters and the first GPM sample
    next_slow = start + 1.0
    while clock.s < end:
        fast.append(backend.sample(dev))
        if clock.s >= next_slow:
            slow.append(backend.slow_sample(dev))
            next_slow += 1.0
        clock.s += 1.0 / hz
    return fast, slow


# --- replay of the H200 trace: the recorded values, through RealNvml ------------


def test_replay_answers_with_the_row_current_at_the_replay_clock() -> None:
    clock = ReplayClock()
    fake, backend = replay(clock)
    (dev,) = backend.devices()
    assert (dev.uuid, dev.name, backend.name) == (H200_UUID, "NVIDIA H200", "replay")
    row = fake.trace.rows[500]
    clock.s = row["t"] - fake.trace.t_start + 1e-6
    s = backend.sample(dev)
    assert (
        s.util_pct,
        s.mem_util_pct,
        s.mem_used_bytes,
        s.mem_total_bytes,
        s.power_mw,
        s.temp_c,
        s.sm_clock_mhz,
        s.clock_event_reasons,
    ) == (
        row["util_gpu"],
        row["util_mem"],
        row["mem_used"],
        row["mem_total"],
        row["power_mW"],
        row["temp_C"],
        row["sm_MHz"],
        row["reasons"],
    )


def test_h2d_copy_phase_busy_copy_engine_idle_sms_and_pcie_rx() -> None:
    fast, slow = phase_samples("h2d_copy")
    assert mean(s.util_pct for s in fast) == pytest.approx(94, abs=3)  # README: util 94 %
    assert len(slow) >= 3
    rx = mean(s.pcie_rx_bytes_per_s for s in slow)
    assert rx == pytest.approx(58.8e9, rel=0.03)  # README: PCIe RX ~58.8 GB/s
    assert all(s.pcie_tx_bytes_per_s < 0.2 * rx for s in slow)
    assert all(s.gpm_sm_util_pct == 0.0 for s in slow)  # util counts copies; SMs idle


def test_d2h_copy_phase_pcie_tx() -> None:
    fast, slow = phase_samples("d2h_copy")
    assert mean(s.util_pct for s in fast) == pytest.approx(99, abs=2)
    assert mean(s.pcie_tx_bytes_per_s for s in slow) == pytest.approx(57.5e9, rel=0.05)


def test_memory_92pct_phase_used_of_total() -> None:
    fast, _ = phase_samples("memory_92pct")
    late = fast[len(fast) // 2 :]
    assert {s.mem_used_bytes for s in late} == {138_808_262_656}  # README: 138.8 GB used
    assert {s.mem_total_bytes for s in late} == {150_754_820_096}  # of 150.75 GB


def test_bf16_matmul_phase_power_cap_tensor_cores_and_energy() -> None:
    fast, slow = phase_samples("bf16_matmul")
    assert any(s.clock_event_reasons & 0x4 for s in fast)  # SW power cap seen
    assert mean(s.power_mw for s in fast) == pytest.approx(627_000, rel=0.05)
    assert mean(s.gpm_tensor_util_pct for s in slow) > 80  # README: tensor util 88 %
    assert mean(s.gpm_sm_util_pct for s in slow) > 85
    # energy's mean power agrees with the power readings (mJ/s = mW)
    assert mean(s.energy_power_mw for s in slow) == pytest.approx(627_000, rel=0.1)


def test_what_the_trace_lacks_is_none_never_zero(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="gpuprofd.sampling.nvml")
    clock = ReplayClock()
    fake, backend = replay(clock)
    (dev,) = backend.devices()
    assert dev.mig_uuids == ()  # MIG mode: not supported → no slices
    backend.slow_sample(dev)
    clock.s = 2.0
    s = backend.slow_sample(dev)
    # violation counters are not in the trace: NotSupported → None, no log line
    assert (s.power_violation_ns, s.thermal_violation_ns) == (None, None)
    assert (s.power_capped_pct, s.thermal_capped_pct) == (None, None)
    assert s.energy_mj is not None and s.pcie_rx_bytes_per_s is not None
    assert not [r for r in caplog.records if r.name == "gpuprofd.sampling.nvml"]


def test_a_trace_without_a_column_gives_none_for_it_only(tmp_path: Path) -> None:
    lines = TRACE.read_text().splitlines()
    rows = [json.loads(ln) for ln in lines[1:50]]
    for r in rows:
        del r["power_mW"]
        r.pop("pcie_rx_KBps", None)
        r.pop("pcie_tx_KBps", None)
        r.pop("energy_mJ")
    (tmp_path / "t.jsonl").write_text("\n".join([lines[0], *map(json.dumps, rows)]))
    clock = ReplayClock()
    fake = ReplayPynvml.from_file(tmp_path / "t.jsonl", clock=clock)
    backend = RealNvml(fake, clock=clock)
    (dev,) = backend.devices()
    assert dev.uuid == REPLAY_UUID  # no probe.json beside this trace
    s = backend.sample(dev)
    assert s.power_mw is None and s.util_pct == 0.0 and s.temp_c == 37
    backend.slow_sample(dev)
    clock.s = 0.3
    slow = backend.slow_sample(dev)
    assert (slow.energy_mj, slow.pcie_rx_bytes_per_s, slow.pcie_tx_bytes_per_s) == (None,) * 3
    assert slow.gpm_sm_util_pct is not None  # GPM columns are still there


def test_replay_loops_with_counters_that_never_go_backwards() -> None:
    clock = ReplayClock()
    fake, backend = replay(clock)
    (dev,) = backend.devices()
    energies = []
    for k in range(80):  # ~2.8 passes over the 28 s trace
        clock.s = k * 1.0
        energies.append(backend.slow_sample(dev).energy_mj)
    assert energies == sorted(energies)
    clock.s = fake.trace.duration_s * 3 - 0.5
    backend.slow_sample(dev)
    clock.s += 1.0  # across the wrap-around: a rate, not a reset
    s = backend.slow_sample(dev)
    assert s.pcie_rx_bytes_per_s is not None and s.pcie_rx_bytes_per_s > 0
    assert s.energy_power_mw is not None and s.energy_power_mw > 0


def test_replay_copy_without_probe_gets_the_named_replay_uuid(tmp_path: Path) -> None:
    shutil.copy(TRACE, tmp_path / "trace.jsonl")
    backend, note = open_backend(f"replay:{tmp_path / 'trace.jsonl'}")
    assert note is None and backend is not None and backend.name == "replay"
    (dev,) = backend.devices()
    assert (dev.uuid, dev.name) == (REPLAY_UUID, "Replay GPU")
    assert dev.power_limit_mw is None  # no probe.json: no limit known, never a made-up one
    backend.close()


def test_replay_reads_the_probes_enforced_power_limit() -> None:
    backend, _ = open_backend(f"replay:{TRACE}")
    assert backend is not None
    (dev,) = backend.devices()
    assert dev.power_limit_mw == 700_000  # probe.json: enforced_power_limit_mW
    backend.close()


def test_replay_of_a_missing_trace_is_off_with_a_note(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level("INFO", logger="gpuprofd.sampling.nvml")
    backend, note = open_backend(f"replay:{tmp_path / 'nope.jsonl'}")
    assert backend is None and note is not None and "nope.jsonl" in note
    (line,) = [r for r in caplog.records if r.name == "gpuprofd.sampling.nvml"]
    assert line.exc_info is None


def test_config_parses_the_replay_backend() -> None:
    assert config.nvml_backend({"GPUPROF_NVML": "replay:/x/t.jsonl"}) == "replay:/x/t.jsonl"
    assert config.nvml_backend({"GPUPROF_NVML": " Replay:/x/t.jsonl "}) == "replay:/x/t.jsonl"
    for bad in ("replay:", "bogus", "moc"):  # a typo is an error, not the real backend
        with pytest.raises(ValueError, match="is not a GPU backend: use real"):
            config.nvml_backend({"GPUPROF_NVML": bad})
    assert config.nvml_backend({"GPUPROF_NVML": "real"}) == "real"
    assert config.nvml_backend({"GPUPROF_NVML": "mock"}) == "mock"
    assert config.nvml_backend({}) == "real"


def test_replay_constants_are_pynvmls() -> None:
    assert (nvml.FI_PCIE_RX_BYTES, nvml.FI_PCIE_TX_BYTES) == (
        pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    )
    assert nvml.GPM_METRICS == (
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    )
    assert (nvml.PERF_POLICY_POWER, nvml.PERF_POLICY_THERMAL) == (
        pynvml.NVML_PERF_POLICY_POWER,
        pynvml.NVML_PERF_POLICY_THERMAL,
    )


# --- which loop asks what ----------------------------------------------------------


def test_fast_tick_makes_only_cheap_calls_and_slow_tick_only_expensive_ones() -> None:
    clock = ReplayClock()
    fake, backend = replay(clock)
    sampler = GpuSampler(backend, hz=100, sink=lambda *_: None, slow_sink=lambda *_: None)
    slows = []
    for k in range(3):
        clock.s = 10.0 + k
        fake.calls.clear()
        sampler.tick()
        fast = {name for name, _ in fake.calls}
        fake.calls.clear()
        sampler.slow_tick()
        slows.append(slow := {name for name, _ in fake.calls})
        assert fast and fast <= FAST_CALLS, fast
        assert slow and slow <= SLOW_CALLS, slow
    assert {
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlDeviceGetViolationStatus",
    } <= slow
    # the H200's 32-bit PCIe counters are read once, found narrow, never again
    assert ["nvmlDeviceGetFieldValues" in s for s in slows] == [True, False, False]


def test_pcie_rates_come_from_gpm_not_from_32_bit_counters() -> None:
    # the live H200 (2026-12-04): 55.5 GB/s of copies read 4.0 GB/s from its
    # 32-bit counters at 1 Hz; the replay's counters are 32-bit as its are
    clock = ReplayClock()
    fake, backend = replay(clock)
    (dev,) = backend.devices()
    t0 = fake.trace.phase("h2d_copy")[0] - fake.trace.t_start
    rates = []
    for k in range(1, 5):
        clock.s = t0 + k
        rates.append(backend.slow_sample(dev).pcie_rx_bytes_per_s)
    assert rates[0] is None  # GPM's first sample: no interval yet, no counter rate
    assert rates[1:] == [pytest.approx(58.8e9, rel=0.05)] * 3
    values = fake.nvmlDeviceGetFieldValues(None, [nvml.FI_PCIE_RX_BYTES])
    assert values[0].valueType == 1 and values[0].value.uiVal < 2**32


def test_wide_pcie_counters_give_the_rate_without_gpm(tmp_path: Path) -> None:
    # a GPU without GPM (pre-Hopper) whose counters are 64-bit: rates from them
    rows = [
        {"t": float(t), "util_gpu": 90, "pcie_rx_KBps": 30e6, "pcie_tx_KBps": 1e6} for t in range(6)
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(map(json.dumps, rows)))
    clock = ReplayClock()
    for wide, want in ((True, pytest.approx(30e9)), (False, None)):
        fake = ReplayPynvml.from_file(trace, clock=clock, wide_pcie_counters=wide)
        fake.nvmlGpmQueryDeviceSupport = lambda h: SimpleNamespace(isSupportedDevice=0)
        backend = RealNvml(fake, clock=clock)
        (dev,) = backend.devices()
        clock.s = 1.5
        backend.slow_sample(dev)
        clock.s = 3.5
        assert backend.slow_sample(dev).pcie_rx_bytes_per_s == want


def test_sampler_threads_split_the_calls_and_never_ask_pcie_throughput() -> None:
    fake = ReplayPynvml.from_file(TRACE)
    backend = RealNvml(fake, name="replay")
    fast_got, slow_got = [], []
    enough = threading.Event()

    def slow_sink(mono_ns: int, samples: list[Any]) -> None:
        slow_got.append(samples)
        enough.set()

    sampler = GpuSampler(backend, hz=200, sink=lambda t, s: fast_got.append(s), slow_sink=slow_sink)
    sampler.start()
    assert enough.wait(10)
    while len(fast_got) < 10:
        threading.Event().wait(0.01)
    sampler.stop()
    by_thread: dict[str, set[str]] = {}
    for name, thread in fake.calls:
        by_thread.setdefault(thread, set()).add(name)
    assert by_thread["gpuprofd-gpu"] <= FAST_CALLS
    assert by_thread["gpuprofd-gpu-slow"] <= SLOW_CALLS
    assert "nvmlDeviceGetPcieThroughput" not in {n for n, _ in fake.calls}
    stats = sampler.stats()
    assert stats["fast"].ticks >= 10 and stats["slow"].ticks >= 1


# --- no library, and failures -----------------------------------------------------


class NoLibPynvml:
    """pynvml without libnvidia-ml.so: nvmlInit raises LibraryNotFound."""

    NVMLError = pynvml.NVMLError

    def nvmlInit(self) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_no_libnvidia_ml_is_one_clear_line_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    backend, note = open_backend("real", lambda: NoLibPynvml())  # type: ignore[arg-type,return-value]
    assert (backend, note) == (None, NO_GPU_NOTE)
    (line,) = [r for r in caplog.records if r.name.startswith("gpuprofd")]
    assert NO_GPU_NOTE in line.getMessage() and "LibraryNotFound" in line.getMessage()
    assert line.exc_info is None and line.levelname == "INFO"


def test_daemon_without_gpu_samples_the_host_and_says_why_once(
    daemons: h.Daemons, sock_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "g.db"
    proc, _ = daemons.start_ready(sock_dir, db)
    h.poll_db(db, "SELECT COUNT(*) > 0 FROM host_samples", (), 1)
    assert daemons.stop(proc) == 0
    log = daemons.log(proc)
    assert log.count(NO_GPU_NOTE) == 1 and "Traceback" not in log
    assert h.query(db, "SELECT COUNT(*) FROM gpu_samples")[0][0] == 0


def test_daemon_replays_the_h200_trace_and_matches_the_run_by_uuid(
    daemons: h.Daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    proc, client = daemons.start_ready(sock_dir, db, env={"GPUPROF_NVML": f"replay:{TRACE}"})
    hi = client.request(h.hello("gpu", my_pid, cuda_uuid=H200_UUID[4:].upper()))
    assert hi is not None and hi["notes"] == []
    h.poll_db(db, "SELECT COUNT(*) >= 20 FROM gpu_samples", (), 1)
    (run,) = h.query(db, "SELECT gpu_model, gpu_count FROM runs")
    assert (run["gpu_model"], run["gpu_count"]) == ("NVIDIA H200", 1)
    rows = h.query(db, "SELECT uuid, mem_total_bytes FROM gpu_samples")
    assert {(r["uuid"], r["mem_total_bytes"]) for r in rows} == {(H200_UUID, 150_754_820_096)}
    assert daemons.stop(proc) == 0
    log = daemons.log(proc)
    assert "replayed from" in log and "GPU fast loop:" in log and "Traceback" not in log


class FlakyPynvml:
    """One GPU where power is unsupported and the SM clock fails (GPU lost)."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        return SimpleNamespace(gpu=50, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        raise RuntimeError("a pynvml bug, not an NVMLError")

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return 55

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


def test_one_failing_query_never_aborts_a_sample_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="gpuprofd.sampling.nvml")
    backend = RealNvml(FlakyPynvml())
    backend._handles[0] = "h0"
    dev = GpuDevice(0, "GPU-1", "x")
    for _ in range(3):
        s = backend.sample(dev)
        assert (s.util_pct, s.mem_used_bytes, s.power_mw, s.temp_c, s.sm_clock_mhz) == (
            50.0,
            None,
            None,
            55,
            None,
        )
        assert s.clock_event_reasons is None  # this pynvml has no reasons query at all
    msgs = sorted(r.getMessage() for r in caplog.records)
    assert len(msgs) == 2  # memory and sm_clock, once each; power is "not supported": silent
    assert "memory" in msgs[0] and "sm_clock" in msgs[1]


# --- matching runs to GPUs by UUID ----------------------------------------------------

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"
U2 = "GPU-cccccccc-2222-2222-2222-222222222222"
MIG_A = "MIG-dddddddd-3333-3333-3333-333333333333"


def test_uuid_spellings_of_torch_nvml_and_the_shim_match() -> None:
    devs = [GpuDevice(0, U0, "H200"), GpuDevice(1, U1, "H200")]
    assert match_uuid(devs, U1) == devs[1]  # NVML's own spelling
    assert match_uuid(devs, U1[4:]) == devs[1]  # torch: str(props.uuid), no prefix
    assert match_uuid(devs, U1.upper()) == devs[1]  # any case
    assert match_uuid(devs, f"  {U1[4:].upper()} ") == devs[1]
    assert match_uuid(devs, "GPU-ffffffff-0000-0000-0000-000000000000") is None
    assert match_uuid(devs, None) is None and match_uuid(devs, "") is None


def test_cuda_visible_devices_reordering_matches_by_uuid_not_index() -> None:
    """``CUDA_VISIBLE_DEVICES=2,0``: the process's cuda:0 is NVML's GPU 2, and its
    cuda:1 is NVML's GPU 0; the hello carries the UUID, so index never matters."""
    devs = [GpuDevice(0, U0, "H200"), GpuDevice(1, U1, "H200"), GpuDevice(2, U2, "H200")]
    visible = [U2, U0]  # what torch.cuda.get_device_properties(i).uuid says, i = 0, 1
    assert [match_uuid(devs, u[4:]).index for u in visible] == [2, 0]  # type: ignore[union-attr]


def test_mig_slices_match_their_gpu_in_every_spelling() -> None:
    devs = [GpuDevice(0, U0, "A100", mig_uuids=(MIG_A,)), GpuDevice(1, U1, "A100")]
    assert match_uuid(devs, MIG_A) == devs[0]  # NVML / CUDA_VISIBLE_DEVICES spelling
    assert match_uuid(devs, "GPU-" + MIG_A[4:]) == devs[0]  # the shim prefixes GPU-
    assert match_uuid(devs, MIG_A[4:]) == devs[0]  # torch's bare hex
    # the old MIG-GPU-<parent>/<gi>/<ci> names a slice, never the whole parent GPU
    assert normalize_uuid(f"MIG-{U1}/1/0") != normalize_uuid(U1)
    assert match_uuid(devs, f"MIG-{U1}/1/0") is None


class MigPynvml:
    """One GPU in MIG mode with two slices (and one empty slot)."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return "gpu0"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return {"gpu0": U0, "mig0": MIG_A, "mig2": "MIG-eeee"}[h]

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMigMode(self, h: str) -> list[int]:
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, k: int) -> str:
        if k == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return f"mig{k}"


def test_real_backend_lists_the_mig_slices_of_a_gpu_in_mig_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="gpuprofd.sampling.nvml")
    (dev,) = RealNvml(MigPynvml()).devices()
    assert dev == GpuDevice(0, U0, "NVIDIA A100-SXM4-80GB", (MIG_A, "MIG-eeee"))
    assert match_uuid([dev], "GPU-eeee") == dev
    assert not caplog.records  # the empty slot is expected, not worth a line


# --- hostile traces and values: a clear note or "not available", never a crash ------


@pytest.mark.parametrize("bad_line", ["[3]", "5", '"text"', "null"])
def test_a_trace_line_that_is_not_an_object_is_off_with_a_note(
    tmp_path: Path, bad_line: str
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(f'{{"t": 0, "util_gpu": 50}}\n{bad_line}\n')
    backend, note = open_backend(f"replay:{trace}")
    assert backend is None and note is not None and "line 2" in note
    trace.write_text(f'{bad_line}\n{{"t": 0, "util_gpu": 50}}\n')  # as the header, too
    backend, note = open_backend(f"replay:{trace}")
    assert backend is None and note is not None and "line 1" in note


def test_trace_rows_with_a_non_finite_time_are_not_samples(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [("NaN", 99), ("0", 50), ("Infinity", 98), ("true", 97), ("2", 60), ("4", 70)]
    trace.write_text("".join(f'{{"t": {t}, "util_gpu": {u}, "util_mem": 1}}\n' for t, u in rows))
    clock = ReplayClock()
    fake = ReplayPynvml.from_file(trace, clock=clock)
    assert [r["t"] for r in fake.trace.rows] == [0, 2, 4]
    backend = RealNvml(fake, clock=clock)
    (dev,) = backend.devices()
    clock.s = 1.0
    assert backend.sample(dev).util_pct == 50.0
    clock.s = 2.5
    assert backend.sample(dev).util_pct == 60.0
    trace.write_text('{"t": NaN, "util_gpu": 99}\n')
    backend, note = open_backend(f"replay:{trace}")
    assert backend is None and note is not None


def test_a_nan_or_mistyped_reading_is_not_available_and_the_rest_of_the_sample_stays(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"t": 0, "util_gpu": NaN, "util_mem": 5, "mem_used": NaN, "mem_total": 100, '
        '"power_mW": 300000, "temp_C": 50, "sm_MHz": 1500, "reasons": 0}\n'
        '{"t": 1, "util_gpu": 40, "util_mem": Infinity, "mem_used": "lots", "mem_total": 100, '
        '"power_mW": -Infinity, "temp_C": NaN, "sm_MHz": 1500, "reasons": NaN}\n'
        '{"t": 2, "util_gpu": 0}\n'  # keeps the replay from looping before t = 2
    )
    clock = ReplayClock()
    fake = ReplayPynvml.from_file(trace, clock=clock)
    backend = RealNvml(fake, clock=clock)
    (dev,) = backend.devices()
    s = backend.sample(dev)
    assert (s.util_pct, s.mem_used_bytes, s.mem_total_bytes) == (None, None, 100)
    assert (s.mem_util_pct, s.power_mw, s.temp_c, s.sm_clock_mhz) == (5.0, 300000, 50, 1500)
    clock.s = 1.5
    s = backend.sample(dev)
    # the replay's memory query itself fails on a text "used" (free = total - used)
    assert (s.util_pct, s.mem_util_pct, s.mem_used_bytes, s.mem_total_bytes) == (
        40.0,
        None,
        None,
        None,
    )
    assert (s.power_mw, s.temp_c, s.sm_clock_mhz, s.clock_event_reasons) == (
        None,
        None,
        1500,
        None,
    )


def test_a_nan_pcie_or_gpm_reading_costs_only_its_own_interval(tmp_path: Path) -> None:
    """One NaN PCIe rate once made the synthesized byte counters NaN for the
    whole replay (every later slow sample had no PCIe rate at all)."""
    trace = tmp_path / "t.jsonl"
    rows = [
        {
            "t": float(t),
            "util_gpu": 50,
            "util_mem": 1,
            "pcie_rx_KBps": rx,
            "pcie_tx_KBps": 1000.0,
            "gpm_sm_util": gpm,
        }
        for t, rx, gpm in (
            (0, 1e6, 10.0),
            (1, "NaN", "NaN"),
            (2, 2e6, 30.0),
            (3, 2e6, 30.0),
            (4, 2e6, 30.0),
        )
    ]
    trace.write_text("\n".join(json.dumps(r).replace('"NaN"', "NaN") for r in rows))
    clock = ReplayClock()
    backend = RealNvml(ReplayPynvml.from_file(trace, clock=clock), clock=clock)
    (dev,) = backend.devices()
    clock.s = 2.5
    backend.slow_sample(dev)
    clock.s = 3.5
    s = backend.slow_sample(dev)
    assert s.pcie_rx_bytes_per_s == pytest.approx(2e9)
    assert s.pcie_tx_bytes_per_s == pytest.approx(1e6)
    assert s.gpm_sm_util_pct == 30.0


class OneLostOfThreePynvml:
    """Three GPUs; GPU 1 fell off the bus (GPU_IS_LOST on every query of it)."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        if i == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return f"gpu{i}"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return {"gpu0": U0, "gpu2": U2}[h]

    def nvmlDeviceGetName(self, h: str) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=70, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=1, total=2)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 300_000

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 50

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return 1500

    def nvmlShutdown(self) -> None:
        pass


def test_a_gpu_lost_at_startup_leaves_the_others_sampled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One GPU that fell off the bus once turned GPU metrics off for the whole node."""
    caplog.set_level("INFO", logger="gpuprofd.sampling.nvml")
    fake = OneLostOfThreePynvml()
    backend, note = nvml._checked(RealNvml(fake), fake)
    assert note is None and backend is not None
    devs = backend.devices()
    assert [(d.index, d.uuid) for d in devs] == [(0, U0), (2, U2)]
    assert [backend.sample(d).util_pct for d in devs] == [70.0, 70.0]
    lost = [r.getMessage() for r in caplog.records if "GPU 1" in r.getMessage()]
    assert len(lost) == 1  # once, though devices() ran twice


class LosablePynvml(OneLostOfThreePynvml):
    """Three readable GPUs; the test loses them one by one (GPU_IS_LOST)."""

    def __init__(self) -> None:
        self.lost: set[str] = set()

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return {"gpu0": U0, "gpu1": U1, "gpu2": U2}[h]

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        if h in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(gpu=70, memory=10)


def test_each_gpu_lost_mid_run_is_logged_once_by_its_index(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A second GPU lost later used to go unlogged (one line per query kind),
    and the line never said which GPU."""
    caplog.set_level("INFO", logger="gpuprofd.sampling.nvml")
    fake = LosablePynvml()
    backend = RealNvml(fake)
    devs = backend.devices()
    fake.lost.add("gpu2")
    for _ in range(3):
        assert [backend.sample(d).util_pct for d in devs] == [70.0, 70.0, None]
    fake.lost.add("gpu0")
    for _ in range(3):
        assert [backend.sample(d).util_pct for d in devs] == [None, 70.0, None]
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2
    assert "utilization" in msgs[0] and "GPU 2" in msgs[0]
    assert "utilization" in msgs[1] and "GPU 0" in msgs[1]
