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
4. ``gpuprof.profile()`` as users get it, default (``stacks=True``) vs
   ``stacks=False``, against a real gpuprofd, on the overhead bench's loop
   (``shim_overhead.py``: 101 modules, ~5 ms steps), as it is (next to
   nothing between steps) and with 1 ms of host work between steps (the
   gate open ~1/6 of the time): the whole-loop ratio, samples taken, and
   the training thread's wall time per sample (the extra per step over the
   samples per step). Target: ratio <= 1.01.

    python bench/stack_sampling.py [--steps 400] [--blocks 4] [--profile-blocks 8]

Not a test: these machines are noisy, so read the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
from shim_overhead import build_model, gpuprofd_for_bench, run_block

import gpuprof
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


def per_closed_check_us(checks: int = 20000) -> float:
    """Sampler thread time (µs) per wake-up with the gate closed (inside a
    phase): what it holds the GIL for 100 times a second while nothing is sampled."""
    s = StackSampler(threading.get_ident(), lambda: False, lambda: 0)
    t0 = time.thread_time()
    for _ in range(checks):
        s.sample_once()
    return (time.thread_time() - t0) / checks * 1e6


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


def _host_work_ms(ms: float) -> None:
    """Host work between steps (logging, a metric): a busy wait of *ms*."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def _profiled_block(stacks: bool, steps: int, gap_ms: float) -> tuple[list[float], int]:
    """Iteration times (ms; step + gap) of the overhead bench's loop under
    ``profile(stacks=...)``, and the samples the sampler took."""
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 128)
    times: list[float] = []
    with gpuprof.profile("bench-stacks", print_summary=False, stacks=stacks) as prof:
        for _ in range(steps):
            t = time.perf_counter_ns()
            run_block(model, opt, x, 1)
            if gap_ms:
                _host_work_ms(gap_ms)
            times.append((time.perf_counter_ns() - t) / 1e6)
        sampler = prof._stacks
        taken = sampler.samples if sampler is not None else 0
    return times[2:], taken


def profile_ratios(steps: int, blocks: int) -> None:
    """Figure 4: default profile() vs stacks=False, interleaved blocks."""
    with gpuprofd_for_bench():
        for gap_ms in (0.0, 1.0):
            on: list[float] = []
            off: list[float] = []
            taken = 0
            for b in range(blocks):
                for use in (True, False) if b % 2 == 0 else (False, True):
                    t, n = _profiled_block(use, steps, gap_ms)
                    (on if use else off).extend(t)
                    taken += n
            m_on, m_off = statistics.median(on), statistics.median(off)
            per_step = taken / len(on) if on else 0.0
            per_sample = (m_on - m_off) * 1e3 / per_step if per_step else float("nan")
            print(
                f"profile(), {gap_ms:.0f} ms between steps: stacks=False {m_off:.3f} ms, "
                f"default {m_on:.3f} ms, ratio {m_on / m_off:.4f} (target <= 1.01); "
                f"{taken} samples ({per_step:.2f} a step), training thread "
                f"{per_sample:.1f} µs a sample"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--profile-blocks", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    open_us, closed_us = per_sample_us(), per_closed_check_us()
    print(f"per sample (sampler thread CPU): {open_us:.1f} µs")
    print(f"per wake-up with the gate closed: {closed_us:.2f} µs")
    # the training thread waits at most that long for the GIL per wake-up
    # (100 a second): the bound on its cost, whatever else the host runs
    print(
        f"bound on the training thread's time: {100 * open_us / 1e4:.3f} % while between "
        f"phases, {100 * closed_us / 1e4:.4f} % inside them (target <= 1 %)"
    )
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
    profile_ratios(args.steps // 2, args.profile_blocks)


if __name__ == "__main__":
    main()
