"""Forward-detector overhead: what auto mode adds to a forward pass of many
small modules, and what ``import gpuprof`` adds to ``import torch``.

Prints, from one run on this machine:
- a model of >= 500 small modules: the forward time plain, with gpuprof in
  its steady state (``Module.__call__`` restored, a wrapper on the root only),
  and during a discovery window (``Module.__call__`` patched); the extra µs
  per forward and ns per module call of each (medians of interleaved blocks);
- ``import gpuprof`` after ``import torch``, in fresh interpreters (ms,
  median of several; target <= 50 ms), and the shim modules a profile
  imports at entry.

    python bench/forward_overhead.py [--blocks 15] [--reps 40] [--imports 7]

No daemon is needed (the profile runs without one). Not a test: these
machines are noisy, so read the ratios.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import torch
from torch import nn

import gpuprof


def build_model(blocks: int = 250, width: int = 16) -> nn.Sequential:
    """``blocks`` × (Linear, ReLU) + the Sequential: 2·blocks + 1 modules."""
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def forward_us(model: nn.Module, x: torch.Tensor, reps: int) -> float:
    """Median µs of one grad-enabled forward (the graph is dropped each time)."""
    times = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        model(x)
        times.append(time.perf_counter_ns() - t)
    return median(times) / 1e3


def measure(blocks: int, reps: int) -> dict[str, float]:
    """Median forward µs per mode over interleaved blocks."""
    model = build_model()
    x = torch.randn(1, 16)
    socket_dir = Path(tempfile.mkdtemp(prefix="gpf", dir="/tmp"))  # no daemon there
    results: dict[str, list[float]] = {"plain": [], "steady": [], "discovery": []}
    forward_us(model, x, reps)  # warm-up
    for b in range(blocks):
        order = ["plain", "steady", "discovery"]
        order = order[b % 3 :] + order[: b % 3]
        for mode in order:
            if mode == "plain":
                results[mode].append(forward_us(model, x, reps))
                continue
            with gpuprof.profile(
                "bench-forward", socket_dir=socket_dir, autostart=False, print_summary=False
            ) as prof:
                det = prof._patches.wrappers.forwards
                if mode == "steady":
                    for _ in range(3):  # two backward calls end discovery
                        model(x).sum().backward()
                        # no optimizer step: updated weights could turn the
                        # activations denormal and slow every later forward
                        model.zero_grad(set_to_none=True)
                    assert not det.discovering and det.hooked_roots() == [model]
                else:
                    assert det.discovering
                results[mode].append(forward_us(model, x, reps))
    return {k: median(v) for k, v in results.items()}


def import_ms(n: int) -> tuple[float, float]:
    """(``import gpuprof``, + the shim modules a profile imports) after
    ``import torch``, ms, median of *n* fresh interpreters."""
    code = (
        "import time, torch\n"
        "t = time.perf_counter()\n"
        "import gpuprof\n"
        "a = time.perf_counter()\n"
        "import gpuprof_shim.session, gpuprof_shim.patches\n"
        "b = time.perf_counter()\n"
        "print((a - t) * 1e3, (b - t) * 1e3)\n"
    )
    pairs = []
    for _ in range(n):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
        pairs.append(tuple(float(v) for v in out.stdout.split()))
    return median(p[0] for p in pairs), median(p[1] for p in pairs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=15, help="interleaved rounds of the 3 modes")
    ap.add_argument("--reps", type=int, default=40, help="forwards timed per block")
    ap.add_argument("--imports", type=int, default=7, help="fresh interpreters for import time")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    logging.getLogger("gpuprof").setLevel(logging.ERROR)  # "no daemon" is expected here

    n_modules = sum(1 for _ in build_model().modules())
    r = measure(args.blocks, args.reps)
    print(f"model: {n_modules} modules, one forward per call (grad enabled)")
    print(f"  plain                  {r['plain']:8.1f} µs per forward")
    for mode in ("steady", "discovery"):
        extra = r[mode] - r["plain"]
        print(
            f"  gpuprof {mode:<14} {r[mode]:8.1f} µs per forward: extra {extra:6.1f} µs "
            f"({extra * 1e3 / n_modules:5.0f} ns per module call, ratio {r[mode] / r['plain']:.4f})"
        )
    gp, shim = import_ms(args.imports)
    print(
        f"import gpuprof after import torch: {gp:.1f} ms (target <= 50 ms); "
        f"with the shim modules a profile loads: {shim:.1f} ms"
    )


if __name__ == "__main__":
    main()
