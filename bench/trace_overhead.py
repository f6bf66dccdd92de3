"""Trace-mode overhead: the same CPU training loop under gpuprof.profile() with
no trace option and with each trace mode.

Prints, per mode, the mean time of a whole training step (loop wall time /
steps, traced steps included) over the same loop with gpuprof and no tracing
(ratio; 1.00 = free), the number of windows, the mean extra cost of one
window (ms) and, with ``trace_dir``, the mean size of one gzipped chrome
trace (kB) and the training thread's CPU time to write it (ms, measured
around the write itself, so a busy host changes it little). Blocks of the
modes are interleaved and repeated; the median block is reported.

    python bench/trace_overhead.py [--steps 600] [--rounds 3] [--width 512]

CPU only (``ProfilerActivity.CPU``): on a GPU the window also records CUPTI
kernel activity. No daemon: events are counted as dropped, so the figures are
the training thread's own cost. Not a test: read the ratios.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import torch
from torch import nn

import gpuprof
from gpuprof_shim.trace.windows import Tracer

MODES: dict[str, dict[str, Any]] = {
    "no tracing": {},
    "trace_every_n_steps=100": {"trace_every_n_steps": 100},
    "the same, with trace_dir": {"trace_every_n_steps": 100, "trace_dir": None},
    "trace_range=(200, 219)": {"trace_range": (200, 219)},
    "continuous_traces_hz=1": {"continuous_traces_hz": 1.0},
    "continuous_traces_hz=10": {"continuous_traces_hz": 10.0},
}


def make_loop(width: int, depth: int) -> Callable[[int], None]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(64, width), torch.randint(0, 10, (64,))

    def run(steps: int) -> None:
        for _ in range(steps):
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return run


#: Chrome traces written, and the training thread's CPU seconds writing them.
WRITES = {"files": 0, "cpu_s": 0.0}


def timed_writes() -> None:
    """Sum the CPU time of every chrome trace written (``Tracer._write``)."""
    write = Tracer._write

    def timed(self: Tracer, prof: Any) -> None:
        t = time.thread_time()
        try:
            write(self, prof)
        finally:
            WRITES["files"] += 1
            WRITES["cpu_s"] += time.thread_time() - t

    Tracer._write = timed  # type: ignore[method-assign]


def one_block(
    run: Callable[[int], None], steps: int, options: dict[str, Any]
) -> tuple[float, int, int]:
    """(seconds for *steps* steps, windows, chrome trace bytes written) under
    profile(**options); a ``trace_dir`` of None becomes a fresh directory."""
    sock = Path(tempfile.mkdtemp(prefix="gptb", dir="/tmp"))
    if "trace_dir" in options:
        options = {**options, "trace_dir": sock / "traces"}
    with gpuprof.profile(
        "bench",
        socket_dir=sock,
        autostart=False,
        print_summary=False,
        count_flops=False,
        dtype="float32",
        **options,
    ) as prof:
        t = time.perf_counter()
        run(steps)
        elapsed = time.perf_counter() - t
    tracer = prof._tracer
    if tracer is None:
        return elapsed, 0, 0
    return elapsed, tracer.windows, tracer.bytes_written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=6)
    args = ap.parse_args()
    logging.getLogger("gpuprof").setLevel(logging.ERROR)  # "gpuprofd unreachable"
    torch.set_num_threads(1)
    timed_writes()
    run = make_loop(args.width, args.depth)
    run(20)  # warm-up outside any profile
    times: dict[str, list[float]] = {m: [] for m in MODES}
    windows: dict[str, int] = {}
    written: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, options in MODES.items():
            elapsed, n, nbytes = one_block(run, args.steps, options)
            times[name].append(elapsed)
            windows[name] = n
            written[name] = nbytes
    base = median(times["no tracing"])
    step_ms = base / args.steps * 1e3
    print(
        f"CPU loop: {args.depth}x Linear({args.width})+GELU+LayerNorm, batch 64, AdamW, "
        f"{args.steps} steps, {args.rounds} rounds; step {step_ms:.2f} ms without tracing"
    )
    print(f"{'mode':28} {'ratio':>6} {'windows':>8} {'ms/window':>10} {'kB/trace':>9}")
    for name in MODES:
        t = median(times[name])
        n = windows[name]
        per = (t - base) / n * 1e3 if n else 0.0
        size = f"{written[name] / n / 1e3:9.0f}" if n and written[name] else f"{'':9}"
        print(f"{name:28} {t / base:6.3f} {n:8d} {per:10.1f} {size}")
    if WRITES["files"]:
        cpu_ms = WRITES["cpu_s"] / WRITES["files"] * 1e3
        print(f"writing one chrome trace: {cpu_ms:.1f} ms of CPU ({WRITES['files']} written)")


if __name__ == "__main__":
    main()
