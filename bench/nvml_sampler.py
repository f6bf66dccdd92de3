"""NVML sampler rate and cost: the fast loop at 100 Hz and the 1 Hz slow loop,
on the replay backend playing the H200 trace (no GPU needed).

Prints, for each loop: the requested and achieved rate, the slots it missed,
its longest tick, and its thread's CPU share (``time.thread_time`` over wall
time). With ``--probe-costs`` every pynvml call first sleeps what it cost on
the H200 (``probe.json``; only calls ≥ 100 µs, below that sleep is too coarse),
and ``--naive`` also runs the slow queries inside the fast loop, as the
fixture's own recorder did (it reached ~68 Hz of 100).

    python bench/nvml_sampler.py [--seconds 10] [--hz 100] [--probe-costs] [--naive]

A benchmark, not a test: numbers depend on this machine's load.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from gpuprofd.sampling.gpu_sampler import GpuSampler, LoopStats
from gpuprofd.sampling.nvml import GpuDevice, GpuSample, RealNvml
from gpuprofd.sampling.nvml_replay import ReplayPynvml

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200"

#: pynvml function → its key in probe.json's ``calls`` (µs per call measured there).
PROBE_KEYS = {
    "nvmlDeviceGetTotalEnergyConsumption": "total_energy_mJ",
    "nvmlDeviceGetFieldValues": "field_values",
    "nvmlDeviceGetViolationStatus": "violation_power",
    "nvmlDeviceGetPcieThroughput": "pcie_rx_KBps",  # never called, except by --naive
}
MIN_SLEEP_US = 100.0


def probe_costs(probe: Path) -> dict[str, float]:
    """Seconds per call of the expensive pynvml functions, from probe.json."""
    data = json.loads(probe.read_text())
    costs = {fn: data["calls"][key]["us_per_call"] for fn, key in PROBE_KEYS.items()}
    costs["nvmlGpmSampleGet"] = data["gpm"]["sample_get_us"]
    return {fn: us / 1e6 for fn, us in costs.items() if us >= MIN_SLEEP_US}


class NaiveBackend:
    """The fixture recorder's design (the mistake to avoid): every fast sample
    also reads the slow queries, and every tenth the PCIe throughput both ways."""

    def __init__(self, inner: RealNvml, fake: ReplayPynvml) -> None:
        self.inner, self.fake, self.name, self.n = inner, fake, "naive", 0

    def devices(self) -> list[GpuDevice]:
        return self.inner.devices()

    def sample(self, device: GpuDevice) -> GpuSample:
        self.inner.slow_sample(device)
        if self.n % 10 == 0:
            handle = self.fake.nvmlDeviceGetHandleByIndex(device.index)
            for counter in (0, 1):  # NVML_PCIE_UTIL_TX_BYTES, _RX_BYTES
                self.fake.nvmlDeviceGetPcieThroughput(handle, counter)
        self.n += 1
        return self.inner.sample(device)

    def slow_sample(self, device: GpuDevice) -> Any:
        return self.inner.slow_sample(device)

    def close(self) -> None:
        self.inner.close()


def line(name: str, s: LoopStats, wall_s: float) -> str:
    achieved = f"{s.achieved_hz:7.2f}" if s.achieved_hz else "    n/a"
    cpu_pct = 100 * s.cpu_s / wall_s
    return (
        f"{name:5} requested {s.requested_hz:6.1f} Hz  achieved {achieved} Hz  "
        f"ticks {s.ticks:5d}  missed {s.missed_ticks:4d}  longest tick "
        f"{s.tick_s_max * 1e3:6.2f} ms  thread CPU {cpu_pct:5.2f} %"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hz", type=float, default=100.0)
    ap.add_argument("--trace", type=Path, default=FIXTURES / "nvml_trace.jsonl")
    ap.add_argument("--probe-costs", action="store_true")
    ap.add_argument("--naive", action="store_true")
    args = ap.parse_args()

    costs = probe_costs(args.trace.with_name("probe.json")) if args.probe_costs else {}
    fake = ReplayPynvml.from_file(args.trace, cost=lambda fn: time.sleep(costs.get(fn, 0.0)))
    backend: Any = RealNvml(fake, clock=fake.clock, name="replay")
    if args.naive:
        backend = NaiveBackend(backend, fake)
    fast_n = slow_n = 0

    def fast_sink(_t: int, s: list[GpuSample]) -> None:
        nonlocal fast_n
        fast_n += len(s)

    def slow_sink(_t: int, s: list[Any]) -> None:
        nonlocal slow_n
        slow_n += len(s)

    sampler = GpuSampler(backend, args.hz, fast_sink, slow_sink=slow_sink)
    t0 = time.monotonic()
    sampler.start()
    time.sleep(args.seconds)
    sampler.stop()
    wall = time.monotonic() - t0
    stats = sampler.stats()
    mode = ("naive: slow queries in the fast loop" if args.naive else "split loops") + (
        ", probe.json call costs" if args.probe_costs else ", replay call costs only"
    )
    print(f"replay of {args.trace.name}, {wall:.1f} s, {mode}")
    print(line("fast", stats["fast"], wall))
    print(line("slow", stats["slow"], wall))
    print(f"samples delivered: {fast_n} fast, {slow_n} slow")


if __name__ == "__main__":
    main()
