"""The one prepared check for a real GPU: the real NVML backend under load.

Live mode (default; needs CUDA and NVML) starts :class:`GpuSampler` on the
real backend at ``--hz`` (100) in this process, and runs a load in a child
process (as a training process beside gpuprofd would), one phase after the
other, ``--phase-s`` seconds each (13 s: ~65 s of load):

==============  =============================================================
phase           load
==============  =============================================================
idle            nothing
bf16_matmul     8192³ bf16 matmuls back to back (compute-bound; the H200 trace
                shows the SW power-cap bit here)
h2d_copy        1 GiB pinned host→device copies back to back (copy-bound)
memory_92pct    one tensor takes NVML's used memory to 92 % of the total, then
                light work: a 0.1 s burst of writes into it every second
loader_stall    a 0.1 s burst of bf16 4096² matmuls every second, the host
                busy-waiting in between (a GPU starved by its input pipeline)
==============  =============================================================

Each phase's samples (by their own monotonic timestamps, minus the phase's
first ``--skip-s`` (0.5 s) for NVML's averaging windows; slow-loop samples only when
their whole measuring interval lies inside the phase) go through the row
shape the daemon folds (:func:`gpuprofd.sampling.rollup.sample_row` /
:func:`~gpuprofd.sampling.rollup.slow_row`), :func:`gpuprof.insights.gpu.gpu_stats`
and the GPU rules (the GPU's max SM clock the throttling reference, as in
the daemon's rollups), and the rules that fire are compared with
:data:`tests.h200_expected.EXPECTED` for the same phase of the recorded H200
trace. ``import torch`` and CUDA's initialisation are timed apart and happen
before the sampler starts.

Replay mode (``--replay PATH``, no GPU needed; how CI runs this script)
takes the phases from the trace's labels (each phase's first row dropped:
rows lag their label by one sample, as in the replay test) and runs the same
judging and report code; the sampler figures then come from a short run of
the sampler over the replay backend (``--sampler-s``), which measures this
machine, not a GPU.

Writes ``report.json`` and ``report.md`` to ``--out`` (default
``bench/results/gpu_check/``) and prints the summary. Exit status: 0 every
verdict matches, 1 a mismatch (or an incomplete run), 2 live mode without
CUDA or NVML (one line on stderr).

Never changes GPU settings (clocks, power limit, MIG, persistence) and never
resets the device; the child frees what it allocated after each phase, and
exits (freeing everything) when this process stops or fails.

    python scripts/gpu_check.py [--phase-s 13] [--hz 100] [--out DIR]
    python scripts/gpu_check.py --replay tests/fixtures/h200/nvml_trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from gpu_check_common import (
    ROOT,
    NoGpu,
    add_out_option,
    no_cuda,
    report_dir,
    run_and_report,
    save_report,
    script_main,
    start_cuda,
)
from gpu_check_common import fmt as _fmt

from gpuprof.insights import RunContext, registered_rules
from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.gpu import GPU_RULES, gpu_stats
from gpuprofd.sampling.backend import open_backend
from gpuprofd.sampling.gpu_sampler import GpuSampler, LoopStats
from gpuprofd.sampling.nvml import (
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    PERF_POLICY_POWER,
    GpuDevice,
    GpuSample,
    GpuSlowSample,
    NvmlBackend,
    match_uuid,
)
from gpuprofd.sampling.rollup import sample_row, slow_row
from tests.h200_expected import EXPECTED

DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check"
DEFAULT_TRACE = ROOT / "tests" / "fixtures" / "h200" / "nvml_trace.jsonl"
GB = 1e9
NS = 1_000_000_000

#: Seconds dropped at the start of a phase: NVML's utilization is an average
#: over a window (~1/6 s on the H200: the trace's util lags its phase by
#: 0.2-0.3 s), so the first readings still describe the previous phase.
SKIP_S = 0.5
#: How long the live child may stay silent beyond a phase before it counts as hung, s.
CHILD_SLACK_S = 90.0
#: Burst and cycle of the memory and loader-stall phases' light work, s. NVML's
#: utilization window on the H200 is ~1/6-1/5 s (the trace's util jumps 3 → 99 %
#: and 100 → 0 % in one update), so a burst touches at most 2 of the ~5 windows
#: of a cycle: most read idle, some busy (what ``gpu_idle_between_steps`` is for).
BURST_S, CYCLE_S = 0.1, 1.0
#: Share of the GPU's total memory that NVML should report used in memory_92pct
#: (the trace's phase: 138.8 of 150.75 GB = 92.1 %).
MEM_FRACTION = 0.92


@dataclass(frozen=True)
class Phase:
    """One live load phase; its name is the H200 trace phase it is judged against."""

    name: str
    what: str


PHASES = (
    Phase("idle", "nothing runs"),
    Phase("bf16_matmul", "8192^3 bf16 matmuls back to back"),
    Phase("h2d_copy", "1 GiB pinned host-to-device copies back to back"),
    Phase(
        "memory_92pct",
        f"NVML used memory held at {MEM_FRACTION:.0%}; {BURST_S * 1e3:.0f} ms of writes "
        f"every {CYCLE_S:.1f} s",
    ),
    Phase(
        "loader_stall",
        f"{BURST_S * 1e3:.0f} ms of bf16 4096^2 matmuls every {CYCLE_S:.1f} s, host "
        "busy-waiting between",
    ),
)


# --- judging a phase (both modes) ----------------------------------------------


@dataclass
class PhaseResult:
    """One phase's readings and the GPU rules' verdicts on it."""

    name: str
    expected: list[str]
    fired: list[str]
    samples: int
    """Fast-loop rows judged (each with a utilization reading)."""
    slow_samples: int
    """Slow-loop readings (PCIe, GPM) folded in."""
    readings: dict[str, Any]
    evidence: dict[str, dict[str, Any]]
    window_s: tuple[float, float] | None = None
    """(start, end) of the judged window, seconds after the first phase's start."""
    load: dict[str, Any] = field(default_factory=dict)
    """What the live load achieved (iterations, GB/s, TFLOP/s)."""
    ran: bool = True
    """False: the load never ran this phase (the run failed first)."""

    @property
    def match(self) -> bool:
        return self.ran and self.samples > 0 and self.fired == self.expected

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["match"] = self.match
        d["missing"] = sorted(set(self.expected) - set(self.fired))
        d["unexpected"] = sorted(set(self.fired) - set(self.expected))
        return d


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def readings(rows: Sequence[Mapping[str, Any]], g: GpuStats | None) -> dict[str, Any]:
    """The phase's key readings, in the units their names say (None: not available)."""
    if g is None:
        return {}
    rx_mean = _mean(rows, "pcie_rx_KBps")
    return {
        "util_mean_pct": _r(g.util_mean_pct),
        "idle_share": _r(g.idle_share, 3),
        "gpm_sm_util_pct": _r(g.gpm_sm_util_pct, 2),
        "gpm_tensor_util_pct": _r(g.gpm_tensor_util_pct, 2),
        "gpm_dram_bw_util_pct": _r(g.gpm_dram_bw_util_pct, 2),
        "mem_used_max_pct": _r(100 * g.mem_used_fraction, 2) if g.mem_used_fraction else None,
        "mem_used_max_gb": _r(g.mem_used_max_bytes / GB, 2) if g.mem_used_max_bytes else None,
        "mem_total_gb": _r(g.mem_total_bytes / GB, 2) if g.mem_total_bytes else None,
        "pcie_rx_max_gbps": _r(g.pcie_rx_max_bytes_per_s / GB, 2)
        if g.pcie_rx_max_bytes_per_s is not None
        else None,
        "pcie_rx_mean_gbps": _r(rx_mean * 1000 / GB, 2) if rx_mean is not None else None,
        "pcie_tx_max_gbps": _r(g.pcie_tx_max_kbps * 1000 / GB, 2)
        if g.pcie_tx_max_kbps is not None
        else None,
        "power_mean_w": _r(_mean(rows, "power_mW") / 1e3) if _mean(rows, "power_mW") else None,
        "power_max_w": _r(g.power_max_mw / 1e3) if g.power_max_mw is not None else None,
        "temp_max_c": g.temp_max_c,
        "sm_mhz_mean": _r(_mean(rows, "sm_MHz"), 0),
        "sm_mhz_ref": g.sm_mhz_ref,
        "sm_mhz_power_capped": _r(g.sm_mhz_power_capped, 0),
        "power_capped_share": _r(g.power_capped_share, 3),
        "reasons_seen": hex(g.reasons_seen) if g.reasons_seen is not None else None,
    }


def judge(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    gpu_model: str | None,
    slow_samples: int,
    max_sm_mhz: float | None,
) -> PhaseResult:
    """Fold *rows* (``gpu_stats``' row shape) and run every GPU rule on them, as
    the daemon does for a run whose steps covered exactly this phase (no steps:
    MFU unknown, so ``small_batch`` stays silent, as in the replay test).
    *max_sm_mhz*: the GPU's max SM clock (``GpuDevice.max_sm_mhz``), which the
    daemon gives its rollups as the throttling rules' reference."""
    g = gpu_stats(rows, max_sm_mhz=max_sm_mhz)
    ctx = RunContext(
        run_name=f"gpu_check:{name}",
        status="finished",
        step_ms=(),
        wait_ms=(),
        gpu=g,
        gpu_model=gpu_model,
        gpu_count=1,
    )
    rules = registered_rules()
    found = {rule: rules[rule](ctx) for rule in GPU_RULES}
    fired = sorted(rule for rule, ins in found.items() if ins is not None)
    return PhaseResult(
        name=name,
        expected=sorted(EXPECTED[name]),
        fired=fired,
        samples=g.samples if g else 0,
        slow_samples=slow_samples,
        readings=readings(rows, g),
        evidence={rule: dict(ins.evidence) for rule, ins in found.items() if ins is not None},
    )


def phase_rows(
    fast: Sequence[tuple[int, GpuSample]],
    slow: Sequence[tuple[int, GpuSlowSample]],
    t0_ns: int,
    t1_ns: int,
    skip_ns: int,
) -> tuple[list[dict[str, Any]], int]:
    """The rows of one live phase: fast samples taken in ``[t0 + skip, t1)``,
    each slow sample whose measuring interval (since the previous slow sample)
    lies inside that window joined to the nearest fast row (a fast row holds
    one slow reading, as the fixture's rows do). Returns (rows, slow joined)."""
    lo = t0_ns + skip_ns
    picked = [(t, sample_row(s)) for t, s in fast if lo <= t < t1_ns]
    if not picked:
        return [], 0
    times = [t for t, _ in picked]
    free = set(range(len(picked)))
    joined = 0
    for (t_prev, _), (t, s) in zip(slow, slow[1:], strict=False):
        if not (t_prev >= lo and t < t1_ns) or not free:
            continue
        i = min(free, key=lambda k: abs(times[k] - t))
        free.discard(i)
        picked[i][1].update({k: v for k, v in slow_row(s).items() if v is not None})
        joined += 1
    return [row for _, row in picked], joined


# --- the sampler's own figures (both modes) --------------------------------------


def loop_report(s: LoopStats, wall_s: float) -> dict[str, Any]:
    """One loop's rate, misses and its thread's CPU share (% of one core)."""
    return {
        "requested_hz": s.requested_hz,
        "achieved_hz": _r(s.achieved_hz, 2),
        "ticks": s.ticks,
        "missed_ticks": s.missed_ticks,
        "tick_max_ms": round(s.tick_s_max * 1e3, 3),
        "thread_cpu_s": round(s.cpu_s, 4),
        "thread_cpu_pct_of_core": round(100 * s.cpu_s / wall_s, 3) if wall_s > 0 else None,
    }


def _median_us(fn: Callable[[], Any], n: int) -> dict[str, Any]:
    """Median (and max) µs of *n* calls of *fn*, or the error it raised."""
    times = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported and friends: report it
        return {"error": f"{exc.__class__.__name__}: {exc}"}
    return {
        "median_us": round(statistics.median(times) * 1e6, 2),
        "max_us": round(max(times) * 1e6, 2),
        "calls": n,
    }


def call_costs(
    nv: Any,
    handle: Any,
    backend: NvmlBackend,
    device: GpuDevice,
    n_fast: int = 200,
    n_slow: int = 5,
) -> dict[str, Any]:
    """µs per NVML call (*nv*: pynvml or the replay's fake), and per whole
    fast/slow sample of *backend* (what one sampler tick costs per GPU)."""
    reasons = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    fast = {
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(handle),
        "memory_info": lambda: nv.nvmlDeviceGetMemoryInfo(handle),
        "power": lambda: nv.nvmlDeviceGetPowerUsage(handle),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
        "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
        "clock_event_reasons": lambda: reasons(handle),
    }
    slow = {
        "total_energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle),
        "field_values_pcie_bytes": lambda: nv.nvmlDeviceGetFieldValues(
            handle, [FI_PCIE_RX_BYTES, FI_PCIE_TX_BYTES]
        ),
        "violation_status_power": lambda: nv.nvmlDeviceGetViolationStatus(
            handle, PERF_POLICY_POWER
        ),
    }
    out = {name: _median_us(fn, n_fast) for name, fn in fast.items()}
    out.update({name: _median_us(fn, n_slow) for name, fn in slow.items()})
    out["backend_fast_sample"] = _median_us(lambda: backend.sample(device), n_fast)
    out["backend_slow_sample"] = _median_us(lambda: backend.slow_sample(device), n_slow)
    return out


class Collector:
    """The sampler's sinks: keeps every sample of one GPU with its tick's time (ns)."""

    def __init__(self) -> None:
        self.uuid: str | None = None
        self.fast: list[tuple[int, GpuSample]] = []
        self.slow: list[tuple[int, GpuSlowSample]] = []

    def on_fast(self, t_ns: int, samples: list[GpuSample]) -> None:
        self.fast.extend((t_ns, s) for s in samples if s.uuid == self.uuid)

    def on_slow(self, t_ns: int, samples: list[GpuSlowSample]) -> None:
        self.slow.extend((t_ns, s) for s in samples if s.uuid == self.uuid)


# --- live mode -----------------------------------------------------------------


def _emit(event: str, **kw: Any) -> None:
    """One JSON line from the load child to the parent (stdout)."""
    print(json.dumps({"event": event, **kw}), flush=True)


def child_main(phase_s: float, dry: bool) -> int:
    """The load process: import torch and start CUDA (timed), wait for "go" on
    stdin, run :data:`PHASES`, reporting each one's monotonic ns window.
    *dry*: the same phases, scaled down, on the CPU (``--dry-run``)."""
    t = time.perf_counter()
    import torch

    import_s = time.perf_counter() - t
    if dry:
        dev = torch.device("cpu")
        _emit(
            "ready",
            import_torch_s=round(import_s, 3),
            cuda_init_s=0.0,
            uuid="",
            name="CPU (dry run)",
            torch=torch.__version__,
            cuda=None,
        )
    elif not torch.cuda.is_available():
        _emit("no_cuda", msg=no_cuda(torch))
        return 2
    else:
        dev, init_s = start_cuda(torch)
        props = torch.cuda.get_device_properties(dev)
        _emit(
            "ready",
            import_torch_s=round(import_s, 3),
            cuda_init_s=round(init_s, 3),
            uuid=str(getattr(props, "uuid", "") or ""),
            name=props.name,
            torch=torch.__version__,
            cuda=torch.version.cuda,
        )
    if sys.stdin.readline().strip() != "go":
        return 0
    try:
        for phase in PHASES:
            info = _run_phase(torch, dev, phase.name, phase_s)
            _emit("phase", phase=phase.name, **info)
            _free(torch, dev)
    finally:
        _free(torch, dev)
    _emit("done")
    return 0


def _free(torch: Any, dev: Any) -> None:
    """Wait for the GPU, then hand the allocator's cached blocks back to CUDA."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def _run_phase(torch: Any, dev: Any, name: str, phase_s: float) -> dict[str, Any]:
    """Set up, run *name* for *phase_s* seconds (timed from ``t0_ns`` to
    ``t1_ns``, monotonic ns, the GPU synchronized at both ends), free.
    On the CPU (a dry run) the sizes shrink so that a phase stays cheap."""
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    info: dict[str, Any] = {}
    if name == "idle":
        sync()
        t0 = time.monotonic_ns()
        time.sleep(phase_s)
        return {"t0_ns": t0, "t1_ns": time.monotonic_ns()}
    if name == "bf16_matmul":
        n = 8192 if cuda else 128
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        torch.matmul(a, b, out=c)  # cuBLAS picks its kernel before the window
        sync()
        t0, iters = time.monotonic_ns(), 0
        while time.monotonic_ns() - t0 < phase_s * NS:
            for _ in range(16):
                torch.matmul(a, b, out=c)
            iters += 16
            sync()
        t1 = time.monotonic_ns()
        info = {"iters": iters, "tflops": round(iters * 2 * n**3 / ((t1 - t0) / NS) / 1e12, 1)}
        del a, b, c
        return {"t0_ns": t0, "t1_ns": t1, **info}
    if name == "h2d_copy":
        size = 1 << 30 if cuda else 1 << 20
        src = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
        dst = torch.empty(size, dtype=torch.uint8, device=dev)
        dst.copy_(src, non_blocking=True)
        sync()
        t0, iters = time.monotonic_ns(), 0
        while time.monotonic_ns() - t0 < phase_s * NS:
            for _ in range(4):
                dst.copy_(src, non_blocking=True)
            iters += 4
            sync()
        t1 = time.monotonic_ns()
        info = {"iters": iters, "gbps": round(iters * size / ((t1 - t0) / NS) / GB, 1)}
        del src, dst
        return {"t0_ns": t0, "t1_ns": t1, **info}
    if name == "memory_92pct":
        free, total = torch.cuda.mem_get_info(dev) if cuda else (1 << 24, 1 << 24)
        want = int(MEM_FRACTION * total) - (total - free)  # bytes more to reach 92 % used
        big = torch.empty(max(want, 1 << 20), dtype=torch.uint8, device=dev)
        chunk = big[: 1 << 30]
        sync()
        t0, bursts = time.monotonic_ns(), 0
        while time.monotonic_ns() - t0 < phase_s * NS:
            cycle0 = time.monotonic()
            while time.monotonic() - cycle0 < BURST_S:
                chunk.add_(1)
                sync()
            bursts += 1
            time.sleep(max(0.0, CYCLE_S - (time.monotonic() - cycle0)))
        t1 = time.monotonic_ns()
        free_after = torch.cuda.mem_get_info(dev)[0] if cuda else None
        info = {
            "allocated_gb": round(big.numel() / GB, 2),
            "bursts": bursts,
            "used_fraction_cuda": round(1 - free_after / total, 4)
            if free_after is not None
            else None,
        }
        del chunk, big
        return {"t0_ns": t0, "t1_ns": t1, **info}
    if name == "loader_stall":
        n = 4096 if cuda else 64
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        torch.matmul(a, b, out=c)
        sync()
        t0, bursts = time.monotonic_ns(), 0
        while time.monotonic_ns() - t0 < phase_s * NS:
            cycle0 = time.monotonic()
            while time.monotonic() - cycle0 < BURST_S:
                for _ in range(5):
                    torch.matmul(a, b, out=c)
                sync()
            bursts += 1
            while time.monotonic() - cycle0 < CYCLE_S:  # the "input pipeline": host busy
                pass
        t1 = time.monotonic_ns()
        del a, b, c
        return {"t0_ns": t0, "t1_ns": t1, "bursts": bursts}
    raise ValueError(f"unknown phase {name!r}")


class Child:
    """The load child process and a reader of its JSON-line events."""

    def __init__(self, phase_s: float, dry: bool) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", "--phase-s", str(phase_s)]
        self.proc = subprocess.Popen(
            cmd + ["--dry-run"] * dry,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                sys.stderr.write(line)  # a library printed to stdout: pass it on
        self.events.put(None)

    def next(self, timeout_s: float) -> dict[str, Any]:
        """The next event; ``{"event": "exit"}`` when the child ended, ``"timeout"``."""
        try:
            ev = self.events.get(timeout=timeout_s)
        except queue.Empty:
            return {"event": "timeout"}
        return ev if ev is not None else {"event": "exit", "rc": self.proc.wait()}

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """End the child (it frees its GPU memory by exiting)."""
        if self.proc.poll() is None:
            try:
                self.send("stop")
            except OSError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_live(args: argparse.Namespace) -> dict[str, Any]:
    """Live mode: the report's content. Raises :class:`NoGpu` without NVML or CUDA.

    ``--dry-run`` runs the same code with no GPU, to check the plumbing: NVML
    answers from the replay of ``--replay`` (default: the H200 trace) and the
    load child runs its phases, scaled down, on the CPU. Its verdicts mean
    nothing (the replay's phases do not line up with the load's)."""
    t_start = time.monotonic()
    nv: Any
    if args.dry_run:
        from gpuprofd.sampling.nvml import RealNvml
        from gpuprofd.sampling.nvml_replay import ReplayPynvml

        nv = ReplayPynvml.from_file(Path(args.replay or DEFAULT_TRACE))
        nv.nvmlInit()
        backend: NvmlBackend | None = RealNvml(nv, clock=nv.clock, name="replay")
    else:
        backend, note = open_backend("real")
        if backend is None:
            raise NoGpu(f"NVML: {note}")
        import pynvml as nv  # open_backend succeeded: it imports and is initialised
    assert backend is not None
    backend_name = backend.name

    child: Child | None = None
    sampler: GpuSampler | None = None
    try:
        child = Child(args.phase_s, args.dry_run)
        ready = child.next(timeout_s=300)
        if ready["event"] == "no_cuda":
            raise NoGpu(f"CUDA: {ready['msg']}")
        if ready["event"] != "ready":
            raise RuntimeError(f"the load process did not start: {ready}")
        devices = backend.devices()
        device = match_uuid(devices, ready["uuid"]) or (devices[0] if len(devices) == 1 else None)
        if device is None:
            raise RuntimeError(f"no NVML device has torch's UUID {ready['uuid']!r}")
        costs = call_costs(nv, nv.nvmlDeviceGetHandleByIndex(device.index), backend, device)
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except Exception as exc:  # noqa: BLE001 - NVMLError or the replay's missing call
            driver = f"n/a ({exc.__class__.__name__})"
        col = Collector()
        col.uuid = device.uuid
        sampler = GpuSampler(backend, args.hz, col.on_fast, slow_sink=col.on_slow)
        s0 = time.monotonic()
        sampler.start()  # from here on, sampler.stop() closes the backend
        backend = None
        time.sleep(1.5)  # the slow loop's first tick has counters but no rates yet
        child.send("go")
        windows: dict[str, dict[str, Any]] = {}
        error = None
        while True:
            ev = child.next(timeout_s=args.phase_s + CHILD_SLACK_S)
            if ev["event"] == "phase":
                windows[ev["phase"]] = ev
                print(f"gpu_check: phase {ev['phase']} done", file=sys.stderr, flush=True)
            elif ev["event"] == "done":
                break
            else:  # judge what ran; the rest is reported as not run
                error = f"the load process failed after {len(windows)} phase(s): {ev}"
                print(f"gpu_check: {error}", file=sys.stderr, flush=True)
                break
        time.sleep(0.2)
        sampler.stop()
        wall_s = time.monotonic() - s0
        stats = sampler.stats()
        sampler = None
    finally:
        if sampler is not None:
            sampler.stop()
        if backend is not None:
            backend.close()
        if child is not None:
            child.close()
    first_t0 = min((w["t0_ns"] for w in windows.values()), default=0)
    results = []
    for phase in PHASES:
        w = windows.get(phase.name)
        if w is None:
            results.append(
                PhaseResult(
                    phase.name,
                    sorted(EXPECTED[phase.name]),
                    [],
                    0,
                    0,
                    {},
                    {},
                    load={"what": phase.what},
                    ran=False,
                )
            )
            continue
        skip_ns = int(args.skip_s * NS)
        rows, joined = phase_rows(col.fast, col.slow, w["t0_ns"], w["t1_ns"], skip_ns)
        res = judge(phase.name, rows, device.name, joined, device.max_sm_mhz)
        res.window_s = (
            round((w["t0_ns"] + skip_ns - first_t0) / NS, 3),
            round((w["t1_ns"] - first_t0) / NS, 3),
        )
        res.load = {k: v for k, v in w.items() if k not in ("event", "phase", "t0_ns", "t1_ns")}
        res.load["what"] = phase.what
        results.append(res)
    return {
        "mode": "dry-run" if args.dry_run else "live",
        "error": error,
        "device": {
            "name": device.name,
            "uuid": device.uuid,
            "driver": driver,
            "max_sm_mhz": device.max_sm_mhz,
            "torch": ready["torch"],
            "cuda": ready["cuda"],
        },
        "backend": backend_name,
        "timings_s": {
            "import_torch": ready["import_torch_s"],
            "cuda_init": ready["cuda_init_s"],
            "sampling_wall": round(wall_s, 2),
            "total_wall": round(time.monotonic() - t_start, 2),
        },
        "phase_s": args.phase_s,
        "skip_s": args.skip_s,
        "sampler": {
            "fast": loop_report(stats["fast"], wall_s),
            "slow": loop_report(stats["slow"], wall_s),
            "wall_s": round(wall_s, 2),
            "fast_samples": len(col.fast),
            "slow_samples": len(col.slow),
        },
        "nvml_call_costs": costs,
        "phases": results,
    }


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


# --- replay mode ---------------------------------------------------------------


def labelled_phases(path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(phase, rows) for each header phase of the trace that :data:`EXPECTED`
    knows, by the rows' labels, each phase's first row dropped (it lags its label)."""
    from gpuprofd.sampling.nvml_replay import Trace

    trace = Trace.load(path)
    for p in trace.header.get("phases", []):
        name = p.get("phase")
        if name in EXPECTED:
            yield name, [r for r in trace.rows if r.get("phase") == name][1:]


def run_replay(args: argparse.Namespace) -> dict[str, Any]:
    """Replay mode: verdicts on the trace's labelled phases, and the sampler's
    figures from ``--sampler-s`` seconds over the replay backend."""
    from gpuprofd.sampling.nvml_replay import ReplayPynvml

    t_start = time.monotonic()
    path = Path(args.replay)
    backend, note = open_backend(f"replay:{path}")
    if backend is None:
        raise RuntimeError(note)
    device = backend.devices()[0]
    fake = ReplayPynvml.from_file(path)
    costs = call_costs(fake, fake.nvmlDeviceGetHandleByIndex(0), backend, device, n_slow=3)
    col = Collector()
    col.uuid = device.uuid
    sampler = GpuSampler(backend, args.hz, col.on_fast, slow_sink=col.on_slow)
    s0 = time.monotonic()
    sampler.start()
    try:
        time.sleep(args.sampler_s)
    finally:
        sampler.stop()
    wall_s = time.monotonic() - s0
    stats = sampler.stats()
    results = []
    for name, rows in labelled_phases(path):
        slow_n = sum(
            1 for r in rows if r.get("gpm_sm_util") is not None or r.get("pcie_rx_KBps") is not None
        )
        res = judge(name, rows, device.name, slow_n, device.max_sm_mhz)
        if rows:
            res.window_s = (round(rows[0]["t"], 3), round(rows[-1]["t"], 3))
        results.append(res)
    return {
        "mode": "replay",
        "trace": str(path),
        "device": {"name": device.name, "uuid": device.uuid, "max_sm_mhz": device.max_sm_mhz},
        "backend": backend.name,
        "timings_s": {
            "sampling_wall": round(wall_s, 2),
            "total_wall": round(time.monotonic() - t_start, 2),
        },
        "sampler": {
            "fast": loop_report(stats["fast"], wall_s),
            "slow": loop_report(stats["slow"], wall_s),
            "wall_s": round(wall_s, 2),
            "fast_samples": len(col.fast),
            "slow_samples": len(col.slow),
        },
        "nvml_call_costs": costs,
        "phases": results,
    }


# --- report --------------------------------------------------------------------


def summary_md(rep: Mapping[str, Any]) -> str:
    """The human summary (Markdown) of a report."""
    dev = rep["device"]
    phases = rep["phases"]
    ok = all(p["match"] for p in phases)
    out = [f"# gpuprof GPU check: {rep['mode']} on {dev['name']} ({dev['uuid']})", ""]
    if rep["mode"] == "dry-run":
        out += [
            "Dry run: NVML replayed from the H200 trace, the load scaled down on the CPU. "
            "It checks the plumbing; its verdicts mean nothing.",
            "",
        ]
    out.append(
        f"{rep['created_utc']}; backend `{rep['backend']}`"
        + (f"; trace `{rep['trace']}`" if rep.get("trace") else "")
        + (
            f"; driver {dev['driver']}, torch {dev['torch']}, CUDA {dev['cuda']}"
            if rep["mode"] != "replay"
            else ""
        )
    )
    t = rep["timings_s"]
    if rep["mode"] != "replay":
        out.append(
            f"`import torch` {t['import_torch']:.2f} s and CUDA init {t['cuda_init']:.2f} s "
            f"(in the load process, before sampling); sampling {t['sampling_wall']:.1f} s; "
            f"whole check {t['total_wall']:.1f} s. Phases of {rep['phase_s']:g} s, "
            f"each judged from {rep['skip_s']:g} s after its start."
        )
    else:
        out.append(
            "Verdicts: the trace's labelled phases. Sampler figures: "
            f"{t['sampling_wall']:.1f} s over the replay backend on this machine "
            "(not a GPU's figures)."
        )
    out += [
        "",
        "## Sampler",
        "",
        "| loop | requested Hz | achieved Hz | ticks | missed slots | longest tick ms "
        "| thread CPU % of one core |",
        "|---|---|---|---|---|---|---|",
    ]
    for loop in ("fast", "slow"):
        s = rep["sampler"][loop]
        out.append(
            f"| {loop} | {s['requested_hz']:g} | {_fmt(s['achieved_hz'], 2)} | "
            f"{s['ticks']} | {s['missed_ticks']} | {s['tick_max_ms']:.2f} | "
            f"{_fmt(s['thread_cpu_pct_of_core'], 3)} |"
        )
    costs = ", ".join(
        f"{k} {_fmt(v.get('median_us'), 1)}"
        if "error" not in v
        else f"{k} unavailable ({v['error']})"
        for k, v in rep["nvml_call_costs"].items()
    )
    source = "real pynvml" if rep["backend"] == "real" else "the replay's fake pynvml"
    out += ["", f"NVML cost per call, µs (median of repeated calls; {source}): {costs}"]
    out += [
        "",
        "## Phases",
        "",
        "| phase | rows (slow) | util % | idle share | GPM SM % | tensor % | mem used % "
        "| PCIe RX max GB/s | power mean/max W | SM MHz mean/ref/capped | reasons "
        "| fired | expected (replay) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        r = p["readings"]
        out.append(
            f"| {p['name']} | {p['samples']} ({p['slow_samples']}) "
            f"| {_fmt(r.get('util_mean_pct'))} | {_fmt(r.get('idle_share'), 2)} "
            f"| {_fmt(r.get('gpm_sm_util_pct'), 2)} "
            f"| {_fmt(r.get('gpm_tensor_util_pct'), 1)} | {_fmt(r.get('mem_used_max_pct'), 1)} "
            f"| {_fmt(r.get('pcie_rx_max_gbps'), 1)} "
            f"| {_fmt(r.get('power_mean_w'), 0)}/{_fmt(r.get('power_max_w'), 0)} "
            f"| {_fmt(r.get('sm_mhz_mean'), 0)}/{_fmt(r.get('sm_mhz_ref'), 0)}/"
            f"{_fmt(r.get('sm_mhz_power_capped'), 0)} | {_fmt(r.get('reasons_seen'))} "
            f"| {', '.join(p['fired']) or '-'} | {', '.join(p['expected']) or '-'} "
            f"| {_verdict(p, rep['mode'])} |"
        )
    if rep["mode"] != "replay":
        out += [
            "",
            "Loads: "
            + "; ".join(
                f"{p['name']}: {p['load'].get('what')}"
                + "".join(f", {k} {v}" for k, v in p["load"].items() if k != "what")
                for p in phases
            ),
        ]
    if rep.get("error"):
        out += ["", f"**Run failed:** {rep['error']}"]
    if rep["mode"] == "dry-run":
        out += [
            "",
            "**Plumbing OK: every phase ran and was sampled.**"
            if plumbing_ok(rep)
            else "**Plumbing FAILED:** "
            + "; ".join(
                f"{p['name']}: {_why(p)}" for p in phases if not (p["ran"] and p["samples"])
            ),
        ]
    else:
        out += [
            "",
            "**All verdicts match the replay.**"
            if ok
            else "**MISMATCH:** "
            + "; ".join(f"{p['name']}: {_why(p)}" for p in phases if not p["match"]),
        ]
    return "\n".join(out) + "\n"


def plumbing_ok(rep: Mapping[str, Any]) -> bool:
    """A dry run's pass: every phase ran and its window held samples."""
    return all(p["ran"] and p["samples"] for p in rep["phases"])


def _verdict(p: Mapping[str, Any], mode: str) -> str:
    if not p["ran"]:
        return "NOT RUN"
    if mode == "dry-run":
        return "not judged"
    return "match" if p["match"] else "MISMATCH"


def _why(p: Mapping[str, Any]) -> str:
    """Why a phase did not match, in a few words."""
    if not p["ran"]:
        return "not run"
    if not p["samples"]:
        return "no samples in its window"
    return f"missing {p['missing'] or '-'}, unexpected {p['unexpected'] or '-'}"


def write_report(rep: dict[str, Any], out_dir: Path) -> str:
    """Write report.json and report.md to *out_dir*; return the summary."""
    rep["phases"] = [p.to_dict() if isinstance(p, PhaseResult) else p for p in rep["phases"]]
    rep["all_match"] = all(p["match"] for p in rep["phases"])
    return save_report(rep, out_dir, summary_md(rep))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--replay", metavar="PATH", help="judge a recorded trace's phases (no GPU)")
    add_out_option(ap, DEFAULT_OUT, "--replay and --dry-run")
    ap.add_argument("--phase-s", type=float, default=13.0, help="seconds per live phase")
    ap.add_argument("--hz", type=float, default=100.0, help="the fast loop's sample_hz")
    ap.add_argument(
        "--skip-s",
        type=float,
        default=SKIP_S,
        help="live mode: seconds of each phase's start left unjudged (NVML lag)",
    )
    ap.add_argument(
        "--sampler-s",
        type=float,
        default=2.0,
        help="replay mode: seconds to run the sampler over the replay backend",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="live mode's code with no GPU: NVML replayed, the load on the CPU "
        "(checks the plumbing; its verdicts mean nothing)",
    )
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        return child_main(args.phase_s, args.dry_run)
    out = report_dir("gpu_check", args.out, DEFAULT_OUT, bool(args.replay or args.dry_run))
    return run_and_report(
        "gpu_check",
        lambda: run_replay(args) if args.replay and not args.dry_run else run_live(args),
        write_report,
        out,
        lambda rep: plumbing_ok(rep) if rep["mode"] == "dry-run" else rep["all_match"],
        needs="an NVIDIA GPU with CUDA and NVML",
        instead="use --replay PATH to check a recorded trace",
    )


if __name__ == "__main__":
    script_main(main)
