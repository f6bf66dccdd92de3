"""The shim's fixed cost per step, counted in instructions (stable on a busy box).

Runs the 1-module training step of ``bench/shim_overhead.py`` (``Linear(4, 4)``,
SGD) under ``valgrind --tool=callgrind`` with instrumentation off until the
measured loops, a real gpuprofd answering. For each mode (plain, auto, the
manual API) the child runs N steps then 2N steps, each loop between two
``callgrind_control --dump`` calls (a dump zeroes the counters); the
difference of the two loops divided by N is the instructions per step, so
the dump commands' own cost and any per-loop constant cancel out. Prints:

- instructions per step, plain and profiled, and the extra per step;
- the µs the extra implies at this machine's rate, measured natively on the
  plain loop (its instructions per step over its best thread-CPU µs per step).

    python bench/shim_instructions.py [--steps 1000] [--modes plain,auto,manual]

Instruction counts do not depend on how busy the machine is; the µs figure
is the count at the plain loop's speed (the shim's code may run at a
somewhat different rate). Under valgrind a step takes ~100x longer, so a
burst would go out every few steps by its 50 ms time bound; the child lifts
that bound, so bursts go out every 64 steps as they do at native speed.
Needs valgrind (``apt-get install valgrind``); about 1-2 minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("plain", "auto", "manual")


def _ctl(*args: str) -> None:
    """Send a command to the callgrind tool running this process."""
    subprocess.run(
        ["callgrind_control", *args, str(os.getpid())],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _setup() -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, x = nn.Linear(4, 4), torch.randn(1, 4)
    return model, x, torch.optim.SGD(model.parameters(), lr=1e-3)


def _loop(mode: str, prof: Any, model: Any, x: Any, opt: Any, n: int) -> None:
    if mode == "manual":
        for i in range(n):
            with prof.step(i) as s:
                with s.phase("forward"):
                    loss = model(x).sum()
                with s.phase("backward"):
                    loss.backward()
                with s.phase("optimizer"):
                    opt.step()
    else:  # the same loop plain and in auto mode
        for _ in range(n):
            model(x).sum().backward()
            opt.step()


def child(steps: int, modes: list[str]) -> None:
    """Under callgrind: warm up each mode, then dump around N and 2N steps."""
    import gpuprof
    from gpuprof_shim import batcher

    batcher.SEND_EVERY_NS = 1 << 62  # bursts by size, as at native speed
    model, x, opt = _setup()
    _loop("plain", None, model, x, opt, 200)
    _ctl("--instr=on")
    for mode in modes:
        if mode == "plain":
            _ctl(f"--dump={mode}-start")
            _loop(mode, None, model, x, opt, steps)
            _ctl(f"--dump={mode}-n")
            _loop(mode, None, model, x, opt, 2 * steps)
            _ctl(f"--dump={mode}-2n")
            continue
        with gpuprof.profile("bench-instr", print_summary=False, auto=mode == "auto") as p:
            _loop(mode, p, model, x, opt, 256)  # discovery, first bursts
            _ctl(f"--dump={mode}-start")
            _loop(mode, p, model, x, opt, steps)
            _ctl(f"--dump={mode}-n")
            _loop(mode, p, model, x, opt, 2 * steps)
            _ctl(f"--dump={mode}-2n")
    _ctl("--instr=off")


def _native_plain_us(steps: int, repeats: int = 7) -> float:
    """Best thread-CPU µs per plain step, natively."""
    model, x, opt = _setup()
    _loop("plain", None, model, x, opt, 200)
    best = 1e30
    for _ in range(repeats):
        t = time.thread_time_ns()
        _loop("plain", None, model, x, opt, steps)
        best = min(best, (time.thread_time_ns() - t) / steps / 1e3)
    return best


def _totals(out_dir: Path) -> dict[str, int]:
    """Instruction totals by dump label from callgrind's output files."""
    found: dict[str, int] = {}
    for f in out_dir.glob("cg.out*"):
        text = f.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: dump (\S+)", text, re.M)
        total = re.search(r"^(?:totals|summary): (\d+)", text, re.M)
        if trigger and total:
            found[trigger.group(1)] = int(total.group(1))
    return found


def _start_daemon(socket_dir: Path, db: Path) -> subprocess.Popen[bytes]:
    from gpuprofd.commands import client
    from gpuprofd.core.errors import NoDaemonError

    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuprofd", "--socket-dir", str(socket_dir), "--db", str(db)]
        + ["--idle-exit", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping(socket_dir, 0.3)
            return daemon
        except NoDaemonError:
            if time.monotonic() > deadline:
                daemon.kill()
                sys.exit("gpuprofd did not start")
            time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000, help="N (the loops run N and 2N steps)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: plain,auto,manual")
    ap.add_argument(
        "--keep", type=Path, help="copy callgrind's output files here (for callgrind_annotate)"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        sys.exit(f"--modes: choose from {', '.join(MODES)}")
    if args.child:
        child(args.steps, modes)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("needs valgrind's callgrind (apt-get install valgrind)")
    if "plain" not in modes:
        modes.insert(0, "plain")

    socket_dir = Path(tempfile.mkdtemp(prefix="gpi", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="gpiout"))
    env = dict(os.environ, GPUPROF_SOCKET=str(socket_dir), GPUPROF_DB=str(work / "bench.db"))
    env["PYTHONHASHSEED"] = "0"
    os.environ.update(GPUPROF_SOCKET=str(socket_dir))
    daemon = _start_daemon(socket_dir, work / "bench.db")
    try:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={work}/cg.out",
            sys.executable,
            __file__,
            "--child",
            f"--steps={args.steps}",
            f"--modes={','.join(modes)}",
        ]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"the callgrind run failed ({run.returncode}):\n{run.stderr[-3000:]}")
        totals = _totals(work)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for f in work.glob("cg.out*"):
                shutil.copy(f, args.keep / f.name)
        per_step: dict[str, float] = {}
        for mode in modes:
            try:
                per_step[mode] = (totals[f"{mode}-2n"] - totals[f"{mode}-n"]) / args.steps
            except KeyError:
                sys.exit(f"no dumps for {mode} in {work}: {sorted(totals)}")
        plain_us = _native_plain_us(args.steps)
        rate = per_step["plain"] / plain_us  # instructions per µs of thread CPU
        print(
            f"plain step (1-module model): {per_step['plain']:,.0f} instructions, "
            f"{plain_us:.1f} µs thread CPU natively: {rate:,.0f} instructions/µs"
        )
        for mode in modes:
            if mode == "plain":
                continue
            extra = per_step[mode] - per_step["plain"]
            label = "auto" if mode == "auto" else "manual API"
            print(
                f"fixed cost per step, {label:>10}: {per_step[mode]:,.0f} instructions, "
                f"extra {extra:,.0f} (~{extra / rate:.1f} µs at that rate; target < 20 µs)"
            )
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
