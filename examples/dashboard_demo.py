"""See gpuprof's dashboard move without a GPU.

    python examples/dashboard_demo.py               # about a minute of training
    python examples/dashboard_demo.py --seconds 300 # longer

Starts a gpuprofd of its own whose GPU is a recorded H200 trace played back
(``GPUPROF_NVML=replay:PATH``; the trace is ``tests/fixtures/h200/nvml_trace.jsonl``
in the repository, else gpuprofd's mock GPU), then trains a small model on
the CPU under ``gpuprof.profile("dashboard-demo", dashboard=True)``, which
prints the dashboard's URL first: open it and watch the step times, the phase
split and the GPU's utilization, memory, power and clocks update while the
run goes on (or, in a terminal, ``gpuprofctl top gpuprof-demo.db``). The run
is stored in ``--db`` (``gpuprofctl runs gpuprof-demo.db``).

The model is an MLP on made-up data; the loader crops and flips each batch
in Python and, for 10 s of every 30 s, waits on slow "storage" too; every 300
steps comes a short evaluation pass: the loader-wait band and the eval marks
show on the charts.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import gpuprof
from gpuprof import config
from gpuprofd.commands import client
from gpuprofd.core.errors import NoDaemonError

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "tests" / "fixtures" / "h200" / "nvml_trace.jsonl"
EVAL_EVERY = 300
#: The "slow storage" wait per batch in the demo's slow stretches, seconds.
SLOW_READ_S = 0.015
#: How long to wait for the demo's gpuprofd to answer, seconds.
START_TIMEOUT_S = 30.0


class Batches(IterableDataset):
    """Endless batches of 64 made-up 20x20 "images", each randomly cropped to
    16x16 and flipped in Python (~6 ms a batch on a laptop core), as
    (64 x 256 floats, 64 class indices). For 10 s of every 30 s each batch
    also waits :data:`SLOW_READ_S` on "storage", so the loader-wait band on
    the step chart grows and shrinks."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g, rng = torch.Generator().manual_seed(0), random.Random(0)
        while True:
            if (time.monotonic() - self.t0) % 30 >= 20:
                time.sleep(SLOW_READ_S)
            crops = []
            for img in torch.randn(64, 20, 20, generator=g):
                r, c = rng.randrange(5), rng.randrange(5)
                crop = img[r : r + 16, c : c + 16]
                crops.append((crop.flip(1) if rng.random() < 0.5 else crop).reshape(-1))
            x = torch.stack(crops)
            yield x, x[:, :10].argmax(dim=1)


def start_daemon(socket_dir: Path, db: Path, nvml: str, http: str | None) -> subprocess.Popen:
    """``gpuprofd`` for this demo, answering on *socket_dir* (its log in there)."""
    argv = [sys.executable, "-m", "gpuprofd", "--socket-dir", str(socket_dir), "--db", str(db)]
    if http:
        argv += ["--http", http]
    with (socket_dir / "gpuprofd.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, env={**os.environ, "GPUPROF_NVML": nvml}, stdout=log, stderr=log
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"gpuprofd exited ({proc.returncode}):\n{(socket_dir / 'gpuprofd.log').read_text()}"
            )
        try:
            client.ping(socket_dir, 0.5)
            return proc
        except NoDaemonError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"gpuprofd did not answer within {START_TIMEOUT_S:.0f} s")


def stop_daemon(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def profile(socket_dir: Path, db: Path) -> AbstractContextManager[Any]:
    """The demo's profile, with the dashboard URL printed first."""
    opts = dict(socket_dir=socket_dir, db=db, autostart=False)
    try:
        return gpuprof.profile("dashboard-demo", dashboard=True, **opts)
    except TypeError:  # a gpuprof from before profile(dashboard=...)
        print("this gpuprof has no dashboard option: training without the URL", flush=True)
        return gpuprof.profile("dashboard-demo", **opts)


def train(seconds: float, socket_dir: Path, db: Path) -> int:
    """Train until *seconds* have passed; return the steps taken."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    held_out = torch.randn(256, 256)
    steps = 0
    with profile(socket_dir, db):
        end = time.monotonic() + seconds
        for x, y in DataLoader(Batches(), batch_size=None):
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps % EVAL_EVERY == 0:
                with torch.no_grad():
                    model(held_out)
            if time.monotonic() >= end:
                break
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long to train (s)")
    p.add_argument("--db", type=Path, default=Path("gpuprof-demo.db"), help="where the run goes")
    p.add_argument("--trace", type=Path, default=TRACE, help="the NVML trace to replay")
    p.add_argument("--http", metavar="HOST:PORT", help="the dashboard's address (gpuprofd --http)")
    args = p.parse_args(argv)
    if args.trace.is_file():
        nvml = f"replay:{args.trace.resolve()}"
    else:
        print(f"no H200 trace at {args.trace}: the GPU is gpuprofd's mock one", flush=True)
        nvml = "mock"
    db = args.db.resolve()
    # the socket directory gpuprofctl finds for this database (never a node-wide
    # GPUPROF_SOCKET's daemon), so `gpuprofctl top DB` watches the demo
    socket_dir = config.socket_dir(env={**os.environ, config.ENV_SOCKET: ""}, db=db)
    try:
        client.ping(socket_dir, 0.5)
    except NoDaemonError:
        pass
    else:
        raise SystemExit(
            f"a gpuprofd already serves {args.db} (an earlier demo's?): stop it with "
            f"`gpuprofctl stop {args.db}`, or give --db another file"
        )
    socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    daemon = start_daemon(socket_dir, db, nvml, args.http)
    watch = f"gpuprofctl top {args.db}"
    if config.socket_dir(db=db) != socket_dir:  # GPUPROF_SOCKET names another daemon
        watch = f"gpuprofctl top --socket-dir {socket_dir}"
    print(f"in a terminal: {watch}", flush=True)
    try:
        steps = train(args.seconds, socket_dir, db)
        if sys.stdin.isatty():
            input(f"{steps} steps trained; the dashboard stays up until you press Enter. ")
    except KeyboardInterrupt:
        print("\ninterrupted")
    finally:
        stop_daemon(daemon)
    print(f"the run is stored in {args.db}: gpuprofctl runs {args.db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
