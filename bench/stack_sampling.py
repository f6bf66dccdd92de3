"""Stack sampling cost: what the sampler takes from the training thread.

Three figures from one run on this machine:

1. The sampler thread's time per sample (µs) with the gate open, the
   training thread ~30 frames deep (a typical loop under a script and a
   helper). The training thread pays for it only through the GIL.
2. The whole-loop ratio on a 5 ms step loop (a CPU matmul sized to ~5 ms),
   sampler running with its gate closed (the loop never leaves its phases:
   nothing is sampled) vs no sampler. Target: <= 1.01.
3. The same with the gate always open (every step "between phases", the
   worst case: 100 samples a second the whole run). Target: <= 1.01.

    python bench/stack_sampling.py [--steps 400] [--blocks 4]

Not a test: these machines are noisy, so read the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from gpuprof_shim.stacks import StackSampler


def _deep(n: int, fn):
    return fn() if n == 0 else _deep(n - 1, fn)


def per_sample_us(samples: int = 2000) -> float:
    """Sampler thread time (µs) per open-gate sample of a 30-frame-deep thread."""
    ready, done = threading.Event(), threading.Event()

    def target() -> None:
        _deep(30, lambda: (ready.set(), done.wait()))

    t = threading.Thread(target=target)
    t.start()
    ready.wait()
    s = StackSampler(t.ident or 0, lambda: True, lambda: 0)
    t0 = time.thread_time()
    for _ in range(samples):
        s.sample_once()
    cost = (time.thread_time() - t0) / samples * 1e6
    done.set()
    t.join()
    assert s.samples == samples
    return cost


def _loop(steps: int, sampler_gate: bool | None) -> tuple[float, int]:
    """Median step (ms) of a ~5 ms matmul loop; *sampler_gate*: None no sampler,
    else a sampler whose gate stays at that value. Returns (median ms, samples)."""
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    s = None
    if sampler_gate is not None:
        s = StackSampler(threading.get_ident(), lambda: sampler_gate, lambda: 0)
        s.start()
    times = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            for _ in range(6):
                a @ b
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        if s is not None:
            s.stop()
    return statistics.median(times), (s.samples if s else 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--blocks", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"per sample (sampler thread CPU): {per_sample_us():.1f} µs")
    base, closed, opened = [], [], []
    n_closed = n_open = 0
    for _ in range(args.blocks):  # interleaved blocks: drift hits every mode alike
        base.append(_loop(args.steps, None)[0])
        m, n = _loop(args.steps, False)
        closed.append(m)
        n_closed += n
        m, n = _loop(args.steps, True)
        opened.append(m)
        n_open += n
    b = statistics.median(base)
    print(f"step median, no sampler:      {b:.3f} ms")
    print(
        f"gate closed: {statistics.median(closed):.3f} ms, ratio "
        f"{statistics.median(closed) / b:.4f}, samples taken {n_closed}"
    )
    print(
        f"gate open:   {statistics.median(opened):.3f} ms, ratio "
        f"{statistics.median(opened) / b:.4f}, samples taken {n_open}"
    )


if __name__ == "__main__":
    main()
