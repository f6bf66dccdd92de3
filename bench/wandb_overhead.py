"""``profile(wandb=True)``'s cost: what the training thread pays per step, and
what the background thread spends logging each step to a real W&B run.

Prints, from one run of the real wandb in offline mode (written under a
temporary directory):
- the training thread's cost of one finished step (``WandbSink.add``: a
  queue append), ns;
- the logging thread's CPU time and wall time per step logged
  (``run.log`` of one row of step time, loader wait, three phases), µs;
- how long the end of the run takes once the queue is empty (the findings
  table and the summary figures), ms.

    python bench/wandb_overhead.py [--steps 5000]

Not a test: read the figures (the machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

from gpuprof_shim.steps import StepRecord
from gpuprof_shim.wandb_sink import WandbSink

MS = 1_000_000


def records(n: int) -> list[StepRecord]:
    phases = {"forward": 10 * MS, "backward": 20 * MS, "optimizer": 5 * MS}
    return [
        StepRecord(i, i * 50 * MS, i * 50 * MS + 40 * MS, 10 * MS, True, 1, phases)
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5000)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gpuprof-wandb-bench")
    os.environ.update(
        WANDB_MODE="offline", WANDB_DIR=tmp, WANDB_SILENT="true", WANDB_DISABLE_GIT="true"
    )
    import wandb

    run = wandb.init(project="gpuprof-bench", dir=tmp)
    try:
        recs = records(args.steps)
        sink = WandbSink(run, wandb, interval_s=3600)  # this script drains the queue itself
        t = time.perf_counter_ns()
        for rec in recs:
            sink.add(rec)
        add_ns = (time.perf_counter_ns() - t) / len(recs)
        cpu = {}

        def drain() -> None:
            t = time.thread_time()
            sink._drain()
            cpu["s"] = time.thread_time() - t

        t_wall = time.perf_counter()
        logger = threading.Thread(target=drain)  # a thread of its own, as the sink's
        logger.start()
        logger.join()
        wall_s = time.perf_counter() - t_wall
        t_wall = time.perf_counter()
        sink.finish({"run_name": "bench", "steps": args.steps, "insights": []})
        finish_s = time.perf_counter() - t_wall
    finally:
        run.finish()
    print(f"wandb {wandb.__version__}, offline, {args.steps} steps")
    print(f"training thread, per step (a queue append): {add_ns:.0f} ns")
    print(
        f"logging thread, per step logged: {cpu['s'] / sink.logged * 1e6:.0f} µs of CPU, "
        f"{wall_s / sink.logged * 1e6:.0f} µs of wall time"
    )
    print(f"the end of the run, the queue empty: {finish_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
