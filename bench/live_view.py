"""What a terminal viewer costs the daemon: gpuprofd's CPU per viewer of
``gpuprofctl top`` (the live feed's node view) and ``gpuprofctl watch`` (a
run's feed), per minute of viewing.

A real ``gpuprofd --http`` runs with ``--runs`` live runs (each a process
stepping every ``--step-ms`` ms through the manual API, after a burst to
``--steps`` steps, so the reads are those of a run well under way). Five
phases of ``--seconds`` each, alternating: no viewer, ``--viewers`` top
viewers, no viewer, as many watch viewers, no viewer: each viewer phase is
set against the mean of the two around it (the daemon's own work grows as
the runs go on, and the shared machine drifts). A viewer is the socket
gpuprofctl opens, subscribed the way it subscribes, reading every message
(in this process: the viewers' own CPU is not the daemon's). The daemon's CPU (user + system, from
``/proc``) is read at each phase's start and end.

    python bench/live_view.py [--runs 2] [--viewers 8] [--seconds 60]
                              [--step-ms 100] [--steps 20000] [--settle 20]

Prints the daemon's CPU seconds per minute in each phase, what each viewer
adds, and the ratio to the daemon with no viewer; not a test (these
machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]

#: A live run: bursts to argv[2] steps, then one step every argv[3] ms until killed.
SENDER = r"""
import sys, time
import gpuprof
name, burst, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1e3
with gpuprof.profile(name, auto=False, print_summary=False) as prof:
    i = 0
    while i < burst:
        with prof.step(i):
            pass
        i += 1
    print("burst", i, flush=True)
    while True:
        with prof.step(i) as s:
            with s.phase("forward"):
                time.sleep(step_s / 3)
            with s.phase("backward"):
                time.sleep(step_s / 2)
        i += 1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(sock: Path, db: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GPUPROF_SOCKET=str(sock), GPUPROF_DB=str(db), PYTHONUNBUFFERED="1")
    paths = [str(ROOT), str(ROOT / "shim"), str(ROOT / "daemon")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


@contextlib.contextmanager
def daemon(work: Path) -> Iterator[tuple[str, dict[str, str], psutil.Process]]:
    """A real gpuprofd serving HTTP; yields (base URL, env for runs, its process)."""
    sock, db = work / "s", work / "gpuprof.db"
    port = _free_port()
    env = _env(sock, db)
    log = (work / "gpuprofd.log").open("wb")
    cmd = [sys.executable, "-m", "gpuprofd", "--socket-dir", str(sock), "--db", str(db)]
    cmd += ["--idle-exit", "0", "--http", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gpuprofd did not serve: {(work / 'gpuprofd.log').read_text()}")
            try:
                get(f"{base}/api/v1/runs?limit=1")
                break
            except OSError:
                time.sleep(0.1)
        yield base, env, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        proc.kill()
        log.close()


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


async def viewer(base: str, sub: dict[str, Any], stop: asyncio.Event, got: list[int]) -> None:
    """One viewer's socket: subscribe as gpuprofctl does, read every message."""
    async with aiohttp.ClientSession() as s, s.ws_connect(f"{base}/api/v1/live") as ws:
        await ws.send_str(json.dumps(sub))
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                msg = await ws.receive(timeout=0.5)
                if msg.type == aiohttp.WSMsgType.TEXT:
                    got[0] += 1
                    got[1] += len(msg.data)


async def phase(
    base: str, proc: psutil.Process, subs: list[dict[str, Any]], seconds: float
) -> tuple[float, int, int]:
    """(daemon CPU s per minute, messages, bytes) over *seconds* with a viewer per *subs*."""
    stop = asyncio.Event()
    got = [0, 0]
    tasks = [asyncio.create_task(viewer(base, sub, stop, got)) for sub in subs]
    await asyncio.sleep(2.0)  # connected and past the first (catch-up) messages
    got[:] = [0, 0]
    t0, c0 = time.monotonic(), cpu_s(proc)
    await asyncio.sleep(seconds)
    used, span = cpu_s(proc) - c0, time.monotonic() - t0
    stop.set()
    await asyncio.gather(*tasks)
    return used / span * 60.0, got[0], got[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--viewers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--settle", type=float, default=20.0, help="seconds before measuring")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gplv") as tmp, daemon(Path(tmp)) as (base, env, p):
        script = Path(tmp) / "sender.py"
        script.write_text(SENDER)
        senders = [
            subprocess.Popen(
                [sys.executable, str(script), f"run-{i}", str(args.steps), str(args.step_ms)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(args.runs)
        ]
        try:
            for s in senders:
                assert s.stdout is not None and s.stdout.readline().startswith("burst")
            ids = [r["id"] for r in get(f"{base}/api/v1/runs?status=running")["runs"]]
            while min(get(f"{base}/api/v1/runs/{i}")["run"]["steps"] for i in ids) < args.steps:
                time.sleep(1.0)  # the bursts stored
            time.sleep(args.settle)  # the bursts' rollups written: the daemon at its pace
            print(
                f"gpuprofd with {args.runs} live runs of {args.steps:,}+ steps, a step every "
                f"{args.step_ms:g} ms each; {args.seconds:g} s per phase, phases alternating "
                "with and without viewers"
            )
            phases: list[tuple[str, float, int, int, int]] = []
            for name in ("none", "top", "none", "watch", "none"):
                subs: list[dict[str, Any]] = []
                if name == "top":
                    subs = [{"node": True}] * args.viewers
                elif name == "watch":  # as gpuprofctl watch starts: at a run's latest step
                    held = {i: get(f"{base}/api/v1/runs/{i}")["run"]["steps"] - 1 for i in ids}
                    subs = [
                        {"run": i, "cursors": {"step": held[i], "t": time.time() - 1}}
                        for i in (ids[k % len(ids)] for k in range(args.viewers))
                    ]
                cpu, msgs, size = asyncio.run(phase(base, p, subs, args.seconds))
                phases.append((name, cpu, msgs, size, len(subs)))
                who = f"{len(subs)} {name} viewers" if subs else "no viewer"
                print(f"{who}: {cpu:.2f} CPU s per minute")
            # a viewer phase against the mean of the phases without one on either side
            # of it (the daemon's own work grows with the runs' length as they go on)
            for k, (name, cpu, msgs, size, n) in enumerate(phases):
                if not n:
                    continue
                alone = (phases[k - 1][1] + phases[k + 1][1]) / 2
                per = (cpu - alone) / n
                print(
                    f"{name}: each viewer {per:+.3f} CPU s per minute of viewing "
                    f"({per / 60 * 100:+.2f} % of a core); {n} viewers x{cpu / alone:.2f} the "
                    f"daemon alone ({alone:.2f} CPU s per minute, the phases around); "
                    f"{msgs / n / args.seconds:.1f} messages/s and "
                    f"{size / n / args.seconds / 1e3:.1f} kB/s each"
                )
        finally:
            for s in senders:
                s.kill()
                s.wait(30)


if __name__ == "__main__":
    main()
