"""The host sampler's cost of reading DataLoader workers' context switches.

gpuprofd tells a starved worker (preempted while it wants the CPU) from an
idle one (asleep on I/O, a lock, a sleep) by its voluntary and involuntary
context switches (``psutil.Process.num_ctx_switches``, one more /proc read
per worker per 0.5 s tick). This times :meth:`WorkerCpu.sample` over N
sleeping child processes followed as one pool, with and without that read,
and prints the cost per tick and its share of one core at the 2 Hz tick.

    python bench/worker_switches.py [--workers 16] [--ticks 400]

A benchmark, not a test: numbers depend on this machine's load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from gpuprofd.sampling import host_sampler
from gpuprofd.sampling.host_sampler import DEFAULT_INTERVAL_S, WorkerCpu


def _tick_ms(pids: list[int], ticks: int) -> float:
    """Mean wall ms of one WorkerCpu.sample over the *pids* (a fresh follower)."""
    wc = WorkerCpu()
    msg = {
        "loader_seq": 0,
        "t_ns": 0,
        "workers": [{"worker_id": i, "pid": p} for i, p in enumerate(pids)],
    }
    wc.add(1, msg)
    me = {1: os.getpid()}
    wc.sample(me, 0)
    for w in wc._followed.values():  # make every tick report every worker
        w.cpu_s = -1.0
    t = time.perf_counter()
    for i in range(ticks):
        for w in wc._followed.values():
            w.cpu_s = -1.0
        wc.sample(me, i + 1)
    return (time.perf_counter() - t) / ticks * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--ticks", type=int, default=400)
    args = ap.parse_args()
    kids = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        for _ in range(args.workers)
    ]
    try:
        time.sleep(1.0)
        pids = [k.pid for k in kids]
        with_switches = _tick_ms(pids, args.ticks)
        original = host_sampler._switches
        host_sampler._switches = lambda proc: (None, None)
        try:
            without = _tick_ms(pids, args.ticks)
        finally:
            host_sampler._switches = original
    finally:
        for k in kids:
            k.kill()
            k.wait()
    per_tick = with_switches - without
    share = per_tick / 1e3 / DEFAULT_INTERVAL_S
    print(f"{args.workers} workers, {args.ticks} ticks")
    print(f"  tick with switches    {with_switches:.3f} ms")
    print(f"  tick without          {without:.3f} ms")
    print(
        f"  switches cost         {per_tick:.3f} ms/tick "
        f"({per_tick / args.workers * 1e3:.1f} µs/worker), "
        f"{share:.3%} of one core at {1 / DEFAULT_INTERVAL_S:g} Hz"
    )
    print(f"  ratio                 {with_switches / without:.2f}x")


if __name__ == "__main__":
    main()
