"""Evidence windows' cost: the same CPU training loop under gpuprof.profile()
with ``auto_evidence=False`` (the base; a request on every ``ack`` reply,
refused), with ``auto_evidence=True`` and nothing asked (the step-boundary
hook alone), and with ``auto_evidence=True`` and a request on every ``ack``
reply from 60 % of the way through the block (one window taken, within the default
1 % budget of the run's time). Also the training thread's CPU time of the
step-boundary hook alone, measured around the calls (a busy host changes it little).

A small in-process stand-in for gpuprofd answers ``hello`` and ``ack`` (the
request rides the ``ack`` reply, as gpuprofd sends it) and drains the data
socket, so the shim's resend thread runs as it does against gpuprofd. Prints,
per mode, the mean whole-loop step time over the base's (ratio; 1.00 =
free) in wall time and in the training thread's CPU time (less moved by
other processes on a shared host), the windows taken and what they cost (the shim's own count: the
window's whole span, steps, profiler start, stop and fold). Blocks of the
modes are interleaved and repeated; the median block is reported.

    python bench/evidence_cost.py [--seconds 20] [--rounds 3] [--width 256]

Not a test: read the ratios.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import orjson
import torch
import zmq
from torch import nn

import gpuprof
from gpuprof import config
from gpuprof.evidence import EvidenceRequest
from gpuprof.protocol import decode, decode_frame

#: mode -> (auto_evidence, a request asked for)
MODES = {
    "auto_evidence=False, asked": (False, True),
    "auto_evidence=True, nothing asked": (True, False),
    "auto_evidence=True, asked": (True, True),
}


class StandIn:
    """Answers hello / ack / bye like gpuprofd; *ask_after_s*: from that long
    after the hello on, a request rides every ack reply (gpuprofd asks once
    a live pass found something and the budget covers a window); None: never."""

    def __init__(self, socket_dir: Path, ask_after_s: float | None) -> None:
        self.ask_after_s = ask_after_s
        self.hello_at = 0.0
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(config.control_endpoint(socket_dir))
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(config.ingest_endpoint(socket_dir))
        self.seq = 0
        self.windows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pull, zmq.POLLIN)
        req = EvidenceRequest("bench1", "high_step_variance").to_wire()
        while not self._stop.is_set():
            ready = dict(poller.poll(20))
            if self.pull in ready:
                events, _, env = decode_frame(self.pull.recv())
                if env is not None and env.get("seq"):
                    self.seq = max(self.seq, env["seq"])
                self.windows += sum(1 for e in events if e.get("source") == "evidence")
            if self.router in ready:
                *env_frames, raw = self.router.recv_multipart()
                msg = decode(raw, channel="control")
                reply: dict[str, Any] = {"ok": True}
                if msg["type"] == "hello":
                    reply.update(run_id=1, db="bench.db", daemon_pid=1, notes=[], acked=0)
                    self.hello_at = time.monotonic()
                elif msg["type"] == "ack":
                    reply["acked"] = self.seq
                    after = self.ask_after_s
                    if after is not None and time.monotonic() - self.hello_at >= after:
                        reply["evidence"] = req
                elif msg["type"] == "bye":
                    reply["summary"] = {"run_name": "bench", "insights": [], "notes": []}
                self.router.send_multipart([*env_frames, orjson.dumps(reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.router.close(0)
        self.pull.close(0)
        self.ctx.term()


def make_loop(width: int) -> Callable[[], None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(64, width), torch.randint(0, 10, (64,))

    def step() -> None:
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def block(mode: str, seconds: float, step: Callable[[], None]) -> dict[str, float]:
    """Train for *seconds* under *mode*: mean step (ms), windows, their cost (ms)."""
    with tempfile.TemporaryDirectory(prefix="gpev", dir="/tmp") as tmp:
        auto, asked = MODES[mode]
        # late enough that 1 % of the time so far covers a window on a ~2 ms loop
        stand_in = StandIn(Path(tmp), seconds * 0.6 if asked else None)
        try:
            prof = gpuprof.profile(
                "bench",
                socket_dir=tmp,
                autostart=False,
                print_summary=False,
                count_flops=False,
                auto_evidence=auto,
            )
            n, t0, c0 = 0, time.perf_counter(), time.thread_time()
            with prof:
                while time.perf_counter() - t0 < seconds:
                    step()
                    n += 1
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            slot = prof._evidence
            return {
                "step_ms": wall / n * 1e3,
                "cpu_ms": cpu / n * 1e3,
                "steps": n,
                "windows": len(slot.taken) if slot is not None else 0,
                "cost_ms": slot.used_ns / 1e6 if slot is not None else 0.0,
                "wall_s": wall,
            }
        finally:
            stand_in.close()


def boundary_us(n: int = 200_000) -> float:
    """The training thread's CPU time per step boundary with evidence on and
    nothing asked (the hook every step pays), µs."""
    from gpuprof_shim.trace.evidence import EvidenceSlot
    from gpuprof_shim.trace.options import TraceOptions
    from gpuprof_shim.trace.windows import Tracer

    slot = EvidenceSlot(True, time.monotonic_ns(), time.monotonic_ns)
    tracer = Tracer(
        TraceOptions(),
        run_key="b" * 16,
        run_name="b",
        send=lambda m: True,
        clock=time.monotonic_ns,
        evidence=slot,
    )
    t = time.thread_time()
    for i in range(n):
        tracer.boundary(i)
    return (time.thread_time() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    logging.getLogger("gpuprof").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    step = make_loop(args.width)
    for _ in range(50):
        step()
    got: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            got[mode].append(block(mode, args.seconds, step))
    base = median(b["step_ms"] for b in got["auto_evidence=False, asked"])
    base_cpu = median(b["cpu_ms"] for b in got["auto_evidence=False, asked"])
    print(f"loop: {base:.2f} ms per step (auto_evidence=False), {args.seconds:g} s blocks")
    print(f"step boundary hook, nothing asked: {boundary_us():.2f} us of CPU per step")
    for mode in MODES:
        blocks = got[mode]
        ms = median(b["step_ms"] for b in blocks)
        cpu = median(b["cpu_ms"] for b in blocks)
        windows = median(b["windows"] for b in blocks)
        cost = median(b["cost_ms"] for b in blocks)
        share = median(b["cost_ms"] / (b["wall_s"] * 1e3) for b in blocks)
        print(
            f"{mode:36s} wall {ms / base:5.3f}x  thread CPU {cpu / base_cpu:5.3f}x  "
            f"windows {windows:g}  "
            f"window cost {cost:6.1f} ms ({share:.2%} of the run)"
        )


if __name__ == "__main__":
    main()
