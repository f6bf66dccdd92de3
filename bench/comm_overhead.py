"""Comm-timing overhead: DDP step time with and without gpuprof's comm hook
and clock alignment, 2 ranks on gloo (CPU), in one ``torchrun`` job.

Each rank trains two identical DDP models in interleaved blocks, each block
under its own ``gpuprof.profile``: ``time_comm=False`` (no comm hook, no
clock alignment) on one model, the default (per-bucket comm hook, clock
alignment at the profile's start) on the other. Prints, from one run on this
machine: per rank the median step time of each mode and their ratio (target:
<= 1.02: comm timing must stay invisible), the buckets timed per step, and the clock alignment's
start-up cost (ms, from the profile's start to its result).

    python bench/comm_overhead.py [--blocks 6] [--steps 40] [--nproc 2]

A real gpuprofd runs in a temporary socket directory for the job and is
stopped at the end; ``--shim-only`` runs without one (the shim's own cost:
its events are dropped and counted), which on a 2-vCPU box tells the shim's
share from the daemon's (it stores the buckets on the same two cores).
Not a test: these machines are noisy, so read the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

WORKER = r"""
import json, os, sys, time
import torch
import torch.distributed as dist
from torch import nn
import gpuprof

blocks, steps, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()

def ddp():
    torch.manual_seed(0)
    net = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(256, 256), nn.ReLU())])
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.3)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)

models = {"off": ddp(), "on": ddp()}
x = torch.randn(batch, 256)
times = {"off": [], "on": []}
align_ms, buckets = [], []
for block in range(blocks):
    for mode in (("off", "on") if block % 2 == 0 else ("on", "off")):
        model, opt = models[mode]
        start = time.perf_counter()
        with gpuprof.profile(f"bench-comm-{mode}-b{batch}", print_summary=False,
                             autostart=not os.environ.get("BENCH_SHIM_ONLY"),
                             time_comm=mode == "on") as prof:
            for i in range(steps):
                t = time.perf_counter()
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                if i >= 10:  # the block's first steps: warm-up, and the alignment thread
                    times[mode].append((time.perf_counter() - t) * 1e3)
            aligner = getattr(prof, "_aligner", None)
            if mode == "on" and aligner is not None and aligner.result is not None:
                align_ms.append(aligner.elapsed_ms)
print("RESULT " + json.dumps({"rank": rank, "times": times, "align_ms": align_ms}), flush=True)
dist.destroy_process_group()
"""


def _ping(socket_dir: Path) -> bool:
    from gpuprofd.commands import client
    from gpuprofd.core.errors import NoDaemonError

    try:
        return client.ping(socket_dir, 0.3) is not None
    except NoDaemonError:
        return False


def _buckets_per_step(db: Path, batch: int) -> float:
    """Bucket rows per timed step stored for the job at *batch*."""
    from gpuprofd.storage.reads import open_ro

    conn = open_ro(db)
    try:
        row = conn.execute(
            "SELECT SUM(b.buckets) AS n, COUNT(DISTINCT b.run_id || '-' || b.step) AS steps "
            "FROM comm_steps b JOIN runs r ON r.id = b.run_id WHERE r.run_name = ?",
            (f"bench-comm-on-b{batch}",),
        ).fetchone()
    finally:
        conn.close()
    return row["n"] / row["steps"] if row["steps"] else 0.0


def _job(
    script: Path, env: dict[str, str], args: argparse.Namespace, batch: int, db: Path | None
) -> None:
    """One torchrun job at *batch*; prints each rank's figures."""
    torchrun = Path(sys.executable).with_name("torchrun")
    t = time.monotonic()
    out = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            f"--nproc-per-node={args.nproc}",
            str(script),
            str(args.blocks),
            str(args.steps),
            str(batch),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        sys.exit(f"torchrun failed:\n{out.stderr[-3000:]}")
    results = [
        json.loads(line.split("RESULT ", 1)[1])
        for line in out.stdout.splitlines()
        if "RESULT " in line
    ]
    buckets = _buckets_per_step(db, batch) if db is not None else 3.0  # the model's 3
    print(
        f"batch {batch}: {args.nproc} ranks, gloo, CPU; {args.blocks} interleaved block "
        f"pairs of {args.steps} steps ({time.monotonic() - t:.0f} s); {buckets:.1f} buckets "
        "timed per step"
    )
    for r in sorted(results, key=lambda r: r["rank"]):
        off, on = median(r["times"]["off"]), median(r["times"]["on"])
        align = r["align_ms"]
        cost = f"{median(align):.1f} ms (median of {len(align)})" if align else "n/a"
        print(
            f"  rank {r['rank']}: step {off:.2f} ms without comm timing, {on:.2f} ms "
            f"with: ratio {on / off:.3f} ({(on - off) * 1e3 / max(buckets, 1):+.0f} µs per "
            "bucket); "
            f"clock alignment start-up {cost}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=6, help="interleaved block pairs")
    ap.add_argument("--steps", type=int, default=40, help="steps per block")
    ap.add_argument("--nproc", type=int, default=2, help="ranks")
    ap.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=[128, 512],
        help="batch sizes (longer steps, the same buckets), one job each",
    )
    ap.add_argument(
        "--shim-only",
        action="store_true",
        help="no gpuprofd: the shim's own cost (events are dropped, counted)",
    )
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gpbc", dir="/tmp"))
    env = {
        **os.environ,
        "GPUPROF_SOCKET": str(tmp / "s"),
        "GPUPROF_DB": str(tmp / "bench.db"),
        "OMP_NUM_THREADS": "1",
    }
    if args.shim_only:  # a socket dir no daemon answers in, and no auto-start
        env["BENCH_SHIM_ONLY"] = "1"
        script = tmp / "worker.py"
        script.write_text(WORKER)
        try:
            for batch in args.batch:
                _job(script, env, args, batch, None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuprofd",
            "--socket-dir",
            str(tmp / "s"),
            "--db",
            str(tmp / "bench.db"),
            "--idle-exit",
            "0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not _ping(tmp / "s"):
            if time.monotonic() > deadline:
                sys.exit("gpuprofd did not start")
            time.sleep(0.05)
        script = tmp / "worker.py"
        script.write_text(WORKER)
        for batch in args.batch:
            _job(script, env, args, batch, tmp / "bench.db")
    finally:
        daemon.terminate()
        daemon.wait(20)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
