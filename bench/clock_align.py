"""Clock alignment between ranks: accuracy and start-up cost.

Runs ``torchrun --standalone --nproc-per-node=N`` (gloo, CPU) several times.
Every rank's clock is ``time.monotonic_ns()`` plus an injected offset (rank
1: +5 s, rank 2: -3 ms, rank 3: 0, ...; ranks on one node share the
monotonic clock, so the true offsets are exactly the injected ones), and
each rank runs one :class:`gpuprof_shim.clock_align.ClockAligner`. Prints per
run and peer:

- the offset error ``|measured - injected|`` (µs) and the reported
  uncertainty (µs; the error must stay within it) and best round trip (µs);
- the alignment's cost: wall time from ``start()`` to the result (ms; the
  part spent waiting for the other ranks to arrive in brackets), and what
  ``start()`` itself took on the training thread (µs).

With ``--busy`` each rank's main thread trains a small MLP on the CPU while
the alignment runs (the thread then competes for the GIL).

    python bench/clock_align.py [--runs 5] [--nproc 2] [--busy]

Not a test: these machines are noisy; read the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

#: Injected offsets by rank, ns (repeated beyond 4 ranks).
INJECTED = [0, 5_000_000_000, -3_000_000, 0]


def injected(rank: int) -> int:
    return INJECTED[rank % len(INJECTED)] + (rank // len(INJECTED)) * 1_000_000


def worker(out_dir: Path, busy: bool) -> None:
    """One rank under torchrun: align once, write the figures as JSON."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from gpuprof_shim.clock_align import ClockAligner

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    offset = injected(rank)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dist.barrier()  # every rank ready: start() at about the same moment
    calls = []
    al = ClockAligner(calls.append, clock=lambda: time.monotonic_ns() + offset, timeout_s=30)
    t = time.perf_counter_ns()
    started = al.start()
    start_us = (time.perf_counter_ns() - t) / 1e3
    steps = 0
    deadline = time.monotonic() + 60
    while al.running and time.monotonic() < deadline:
        if busy:
            model(torch.randn(64, 256)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            steps += 1
        else:
            time.sleep(0.005)
    al.close()
    r = al.result
    rec = {
        "rank": rank,
        "started": started,
        "injected_ns": offset - injected(0),
        "result": None if r is None else [r.offset_ns, r.uncertainty_ns, r.rtt_ns],
        "note": al.note,
        "elapsed_ms": al.elapsed_ms,
        "wait_ms": al.wait_ms,
        "connect_ms": al.connect_ms,
        "start_us": start_us,
        "busy_steps": steps,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(rec))
    dist.destroy_process_group()


def run_once(nproc: int, busy: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="gpuprof-align-") as tmp:
        torchrun = Path(sys.executable).with_name("torchrun")
        env = {**os.environ, "CLOCK_ALIGN_BENCH_OUT": tmp}
        if busy:
            env["CLOCK_ALIGN_BENCH_BUSY"] = "1"
        out = subprocess.run(
            [
                str(torchrun),
                "--standalone",
                f"--nproc-per-node={nproc}",
                "--monitor-interval=0.2",
                str(Path(__file__).resolve()),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if out.returncode != 0:
            raise SystemExit(f"torchrun failed:\n{out.stderr[-3000:]}")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(nproc)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--busy", action="store_true", help="train on every rank meanwhile")
    args = ap.parse_args()

    print(
        f"{args.nproc} ranks (gloo, CPU, one node), {args.runs} runs"
        f"{', training meanwhile' if args.busy else ''}"
    )
    print(
        f"{'run':>3} {'rank':>4} {'injected ms':>12} {'error us':>9} {'uncert us':>9} "
        f"{'rtt us':>7} {'align ms':>9} {'wait':>6} {'connect':>7} {'exchange':>8} "
        f"{'start() us':>10}"
    )
    errors, uncertainties, elapsed, rank0_elapsed, starts = [], [], [], [], []
    for run in range(args.runs):
        recs = run_once(args.nproc, args.busy)
        rank0_elapsed.append(recs[0]["elapsed_ms"])
        starts.extend(r["start_us"] for r in recs)
        for rec in recs[1:]:
            if rec["result"] is None:
                print(f"{run:>3} {rec['rank']:>4} failed: {rec['note']}")
                continue
            offset, uncertainty, rtt = rec["result"]
            signed = offset - rec["injected_ns"]
            error = abs(signed)
            errors.append(error / 1e3)
            uncertainties.append(uncertainty / 1e3)
            elapsed.append(rec["elapsed_ms"])
            flag = "" if error <= uncertainty else "  OUTSIDE UNCERTAINTY"
            print(
                f"{run:>3} {rec['rank']:>4} {rec['injected_ns'] / 1e6:>+12.3f} "
                f"{signed / 1e3:>+9.1f} {uncertainty / 1e3:>9.1f} {rtt / 1e3:>7.1f} "
                f"{rec['elapsed_ms']:>9.1f} {rec['wait_ms']:>6.1f} {rec['connect_ms']:>7.1f} "
                f"{rec['elapsed_ms'] - rec['wait_ms'] - rec['connect_ms']:>8.1f} "
                f"{rec['start_us']:>10.0f}{flag}"
            )
    if errors:
        print(
            f"offset error us: median {median(errors):.1f}, max {max(errors):.1f}; "
            f"uncertainty us: median {median(uncertainties):.1f}, max {max(uncertainties):.1f}"
        )
        print(
            f"alignment ms (peers): median {median(elapsed):.1f}, max {max(elapsed):.1f}; "
            f"rank 0 (all peers): median {median(rank0_elapsed):.1f}; "
            f"start() on the training thread us: median {median(starts):.0f}, "
            f"max {max(starts):.0f}"
        )


if __name__ == "__main__":
    if os.environ.get("CLOCK_ALIGN_BENCH_OUT"):
        worker(
            Path(os.environ["CLOCK_ALIGN_BENCH_OUT"]),
            bool(os.environ.get("CLOCK_ALIGN_BENCH_BUSY")),
        )
    else:
        main()
