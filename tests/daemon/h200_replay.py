"""The recorded H200 trace played through the real NVML backend on a stepped
clock: the samples the daemon's sampler would have delivered, deterministically."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprofd.sampling.nvml import GpuSample, GpuSlowSample, RealNvml
from gpuprofd.sampling.nvml_replay import ReplayPynvml

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
TRACE = H200 / "nvml_trace.jsonl"


def trace_path() -> Path:
    if not TRACE.exists():
        pytest.fail(f"H200 fixture missing at {TRACE}: tests/fixtures/ is part of the repository")
    return TRACE


def phases() -> dict[str, tuple[float, float]]:
    """Phase name → (t0, t1), trace seconds (= monotonic seconds of the recording)."""
    header = json.loads(trace_path().read_text().splitlines()[0])
    return {p["phase"]: (p["t0"], p["t1"]) for p in header["phases"]}


def ticks(
    hz: float = 100.0, slow_hz: float = 1.0
) -> Iterator[tuple[int, list[GpuSample], list[GpuSlowSample]]]:
    """(mono_ns, fast samples, slow samples) at *hz* over the whole trace, the
    slow loop every ``1/slow_hz`` s; mono_ns is the trace's own time."""
    now = [0.0]
    fake = ReplayPynvml.from_file(trace_path(), clock=lambda: now[0])
    backend = RealNvml(fake, clock=lambda: now[0], name="replay")
    (dev,) = backend.devices()
    t0 = fake.trace.t_start
    n = int(fake.trace.duration_s * hz)
    every = max(1, round(hz / slow_hz))
    for i in range(n):
        now[0] = i / hz
        slow = [backend.slow_sample(dev)] if i % every == 0 else []
        yield int((t0 + i / hz) * 1e9), [backend.sample(dev)], slow
    backend.close()
