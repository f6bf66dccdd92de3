"""Trace-mode overhead: the same CPU training loop under gpuprof.profile() with
no trace option and with each trace mode.

Prints, per mode, the mean time of a whole training step (loop wall time /
steps, traced steps included) over the same loop with gpuprof and no tracing
(ratio; 1.00 = free), the number of windows, and the mean extra cost of one
window (ms). Blocks of the modes are interleaved and repeated; the median
block is reported.

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

MODES: dict[str, dict[str, Any]] = {
    "no tracing": {},
    "trace_every_n_steps=100": {"trace_every_n_steps": 100},
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


def one_block(run: Callable[[int], None], steps: int, options: dict[str, Any]) -> tuple[float, int]:
    """(seconds for *steps* steps, windows) under profile(**options)."""
    sock = Path(tempfile.mkdtemp(prefix="gptb", dir="/tmp"))
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
    return elapsed, tracer.windows if tracer is not None else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=6)
    args = ap.parse_args()
    logging.getLogger("gpuprof").setLevel(logging.ERROR)  # "gpuprofd unreachable"
    torch.set_num_threads(1)
    run = make_loop(args.width, args.depth)
    run(20)  # warm-up outside any profile
    times: dict[str, list[float]] = {m: [] for m in MODES}
    windows: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, options in MODES.items():
            elapsed, n = one_block(run, args.steps, options)
            times[name].append(elapsed)
            windows[name] = n
    base = median(times["no tracing"])
    step_ms = base / args.steps * 1e3
    print(
        f"CPU loop: {args.depth}x Linear({args.width})+GELU+LayerNorm, batch 64, AdamW, "
        f"{args.steps} steps, {args.rounds} rounds; step {step_ms:.2f} ms without tracing"
    )
    print(f"{'mode':28} {'ratio':>6} {'windows':>8} {'ms/window':>10}")
    for name in MODES:
        t = median(times[name])
        n = windows[name]
        per = (t - base) / n * 1e3 if n else 0.0
        print(f"{name:28} {t / base:6.3f} {n:8d} {per:10.1f}")


if __name__ == "__main__":
    main()
