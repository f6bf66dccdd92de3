"""The dashboard on a long run: time to first chart, bytes per live update,
and how big a whole-day series is.

On the database ``bench/storage.py`` builds (a 24-hour run of 8 ranks on 8
GPUs: per-second GPU rollups, host samples, every step of every rank), a
real ``gpuprofd --http`` serves the dashboard, and this measures:

- time to first chart for one rank's whole-run view: the API alone (GET
  ``/api/v1/runs/1/series`` at the page's width, the step chart's part and
  the whole series, cold and best of 3; and the run's headline, GET
  ``/api/v1/runs/1``), and the page in headless Chromium
  (``/usr/bin/chromium``): navigation start to the page's
  ``gpuprof:first-chart`` mark (the step chart drawn) and to its
  ``gpuprof:all-charts`` mark (the GPUs and the host too), cold and best of
  3 reloads;
- the API response for the whole day vs one hour of it at the same width,
  and at two widths: bounded by the width, not by the run's length;
- bytes per live update at step 100 and at step 100,000: a sender (the
  manual API, ``prof.step(i)``) runs on the same daemon; a WebSocket client
  holds cursors at its latest step while it sends one 500 ms step at a time,
  and counts what the server pushes; then the sender bursts on to step
  100,000 and the same is counted again.

    python bench/dashboard.py [--hours 24] [--gpus 8] [--step-ms 500] [--width 1400]
                              [--live-steps 100000] [--db DAY.db]

``--db`` uses a database ``bench/storage.py`` built before (a copy of it:
the daemon writes to what it serves) instead of building one.

Prints the figures and their ratios from one run; not a test (these
machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]

#: A live run: commands on stdin ("burst N": steps up to index N-1 as fast as
#: they go; "slow N": N steps of 500 ms), "done <steps>" on stdout after each.
SENDER = r"""
import sys, time
import gpuprof
with gpuprof.profile(sys.argv[1], auto=False, print_summary=False) as prof:
    i = 0
    print("done", i, flush=True)
    for line in sys.stdin:
        cmd, n = line.split()
        if cmd == "burst":
            while i < int(n):
                with prof.step(i):
                    pass
                i += 1
        else:
            for _ in range(int(n)):
                with prof.step(i):
                    time.sleep(0.5)
                i += 1
        print("done", i, flush=True)
"""


def _storage_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_storage", ROOT / "bench" / "storage.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env(sock: Path, db: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GPUPROF_SOCKET=str(sock), GPUPROF_DB=str(db), PYTHONUNBUFFERED="1")
    env.pop("GPUPROF_NVML", None)
    paths = [str(ROOT), str(ROOT / "shim"), str(ROOT / "daemon")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[bytes, float]:
    """The body of GET *url* and the seconds it took."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
    return body, time.perf_counter() - t


@contextlib.contextmanager
def daemon(db: Path, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A real gpuprofd on *db* serving HTTP; yields (base URL, env for senders)."""
    sock = work / "s"
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
        yield base, env
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        proc.kill()
        log.close()


def _timed(url: str) -> tuple[bytes, float, float]:
    """The body of GET *url*, the cold request's seconds and the best of 3 after."""
    body, cold = get(url)
    return body, cold, min(get(url)[1] for _ in range(3))


def api_case(base: str, width: int, run: dict[str, Any]) -> None:
    for what, path in (("run headline", "/api/v1/runs/1"), ("step chart's part", None)):
        path = path or f"/api/v1/runs/1/series?width={width}&parts=steps"
        body, cold, warm = _timed(base + path)
        print(
            f"API {what} (GET {path}): cold {cold * 1e3:.0f} ms, best of 3 {warm * 1e3:.0f} ms; "
            f"{len(body) / 1e3:.0f} kB"
        )
    url = f"{base}/api/v1/runs/1/series?width={width}"
    body, cold, warm = _timed(url)
    data = json.loads(body)
    print(
        f"API whole-run series, width {width}: cold {cold * 1e3:.0f} ms, best of 3 "
        f"{warm * 1e3:.0f} ms; {len(body) / 1e3:.0f} kB, {data['buckets']} buckets, "
        f"{len(data['steps']['t'])} step points for {run['steps']:,} steps, tier {data['tier']}"
    )
    half, _ = get(f"{base}/api/v1/runs/1/series?width={width // 2}")
    length = (run["end_s"] - run["start_s"]) / 3600
    line = f"API response size at width {width}: whole run ({length:.1f} h) {len(body) / 1e3:.0f}"
    line += " kB"
    if length >= 2:  # against one hour of it
        hour, _ = get(f"{url}&from={run['end_s'] - 3600}&to={run['end_s']}")
        line += f" vs its last hour {len(hour) / 1e3:.0f} kB (x{len(body) / len(hour):.2f}"
        line += f" for x{length:.1f} the time)"
    print(f"{line}; width {width // 2}: {len(half) / 1e3:.0f} kB (x{len(body) / len(half):.2f})")


def page_case(base: str, width: int) -> None:
    if not CHROMIUM.exists():
        print(f"page load: skipped, no Chromium at {CHROMIUM}")
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": 900})
        marks = {
            m: f"performance.getEntriesByName('gpuprof:{m}')[0]?.startTime ?? null"
            for m in ("first-chart", "all-charts")
        }
        times: dict[str, list[float]] = {m: [] for m in marks}
        for i in range(4):
            if i == 0:
                page.goto(f"{base}/#/run/1")
            else:
                page.reload()
            for m, js in marks.items():
                page.wait_for_function(f"{js} !== null", timeout=120_000)
                times[m].append(page.evaluate(js))
        charts = page.evaluate("document.querySelectorAll('.chart').length")
        browser.close()
    for m, label in (("first-chart", "first chart (steps)"), ("all-charts", "every chart")):
        print(
            f"page load to {label} (Chromium, {width} px, {charts} charts): cold "
            f"{times[m][0]:.0f} ms, best of 3 reloads {min(times[m][1:]):.0f} ms"
        )


class Sender:
    def __init__(self, env: dict[str, str], work: Path, name: str) -> None:
        script = work / "sender.py"
        script.write_text(SENDER)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), name],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.wait()

    def wait(self) -> int:
        line = self.proc.stdout.readline()
        if not line.startswith("done"):
            raise SystemExit(f"sender: {line!r}")
        return int(line.split()[1])

    def send(self, cmd: str, n: int) -> int:
        self.proc.stdin.write(f"{cmd} {n}\n")
        self.proc.stdin.flush()
        return self.wait()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def _wait_steps(base: str, rid: int, n: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = json.loads(get(f"{base}/api/v1/runs/{rid}")[0])["run"]
        if run["steps"] >= n:
            return
        time.sleep(0.5)
    raise SystemExit(f"the daemon did not store {n} steps of run {rid} in {timeout_s:.0f} s")


async def _listen(base: str, rid: int, step: int, sender: Sender, slow: int) -> dict[str, list]:
    """Message sizes by type while *sender* sends *slow* 500 ms steps (and until
    a steps message came, at most 60 s); ``"first_s"``: seconds to the first."""
    sizes: dict[str, list] = {}
    async with aiohttp.ClientSession() as s, s.ws_connect(f"{base}/api/v1/live") as ws:
        await ws.send_json({"run": rid, "cursors": {"step": step, "t": time.time()}})
        send = asyncio.create_task(asyncio.to_thread(sender.send, "slow", slow))
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = None
        while end is None or loop.time() < end:
            if send.done() and end is None:
                # what the last step brings; longer while no steps came
                end = loop.time() + (1.5 if "steps" in sizes else 60)
            try:
                msg = await ws.receive(timeout=0.5)
            except asyncio.TimeoutError:
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                print(f"  the socket ended: {msg.type.name} {msg.data} {msg.extra or ''}")
                break
            body = json.loads(msg.data)
            kind = body.get("type", "?")
            sizes.setdefault(kind, []).append(len(msg.data.encode()))
            if kind == "steps":
                rows = max(1, len(body.get("rows") or []))
                sizes.setdefault("steps/row", []).append(len(msg.data.encode()) / rows)
                sizes.setdefault("first_s", [loop.time() - start])
                if end is not None:
                    end = min(end, loop.time() + 1.5)
        await send
    return sizes


def live_case(base: str, env: dict[str, str], work: Path, far: int) -> None:
    sender = Sender(env, work, "bench-live")
    try:
        # a burst's last steps leave the shim with the next step: one slow step sends them
        sender.send("burst", 100)
        at = sender.send("slow", 1)
        rid = json.loads(get(f"{base}/api/v1/runs?name=bench-live")[0])["runs"][0]["id"]
        _wait_steps(base, rid, at)
        near = asyncio.run(_listen(base, rid, at - 1, sender, 6))
        t = time.perf_counter()
        sender.send("burst", far)
        at = sender.send("slow", 1)
        _wait_steps(base, rid, at)
        print(f"sender burst to step {at:,}: stored in {time.perf_counter() - t:.0f} s")
        farther = asyncio.run(_listen(base, rid, at - 1, sender, 6))
    finally:
        sender.close()

    def per(sizes: dict[str, list[int]], kind: str) -> float:
        xs = sizes.get(kind) or [0]
        return sum(xs) / len(xs)

    first = [f"{x['first_s'][0]:.1f} s" if x.get("first_s") else "none" for x in (near, farther)]
    print(f"first steps message after the client's hello: {first[0]} at step 100, {first[1]} after")
    kinds = sorted((set(near) | set(farther)) - {"first_s"})
    print("live messages while one 500 ms step at a time arrives (mean bytes per message):")
    print(f"  {'type':<10}{'at step 100':>14}{f'at step {at - 1:,}':>18}{'ratio':>8}")
    for k in kinds:
        a, b = per(near, k), per(farther, k)
        ratio = f"{b / a:.2f}" if a else "-"
        n = f"(n={len(near.get(k, []))}/{len(farther.get(k, []))})"
        print(f"  {k:<10}{a:>14.0f}{b:>18.0f}{ratio:>8}  {n}")

    def update(sizes: dict[str, list[int]]) -> float:
        """Bytes pushed per steps message, all but insights (sent when they change)."""
        skip = ("insights", "first_s", "steps/row")
        pushed = sum(sum(v) for k, v in sizes.items() if k not in skip)
        return pushed / max(1, len(sizes.get("steps", [])))

    a, b = update(near), update(farther)
    print(
        f"  bytes per live update (steps, samples and run state per steps message): {a:.0f} "
        f"at step 100, {b:.0f} at step {at - 1:,} (x{b / a if a else float('nan'):.2f})"
    )


def _wait_rollups(db: Path, steps: int, seconds: float, timeout_s: float = 900) -> None:
    """Wait for the daemon's rollup passes to cover run 1's *steps* and its
    *seconds* of host samples (:mod:`gpuprofd.storage.upkeep.steprollup`,
    :mod:`gpuprofd.storage.reads.steptotals`, :mod:`gpuprofd.storage.upkeep.hostrollup`:
    the whole-run series and the run's figures read them; the run's last
    host block has no later sample, so it stays raw)."""
    from gpuprofd.storage.upkeep.hostrollup import HOST_BLOCK_NS
    from gpuprofd.storage.upkeep.steprollup import STEP_BLOCK

    want = {
        "step_rollups": steps // STEP_BLOCK,
        "step_totals": steps // STEP_BLOCK,
        "host_rollups": int(seconds * 1e9) // HOST_BLOCK_NS - 1,
    }
    t = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    have: dict[str, int] = {}
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            for table in want:
                try:
                    sql = f"SELECT COUNT(*) FROM {table} WHERE run_id = 1"
                    (have[table],) = conn.execute(sql).fetchone()
                except sqlite3.OperationalError:  # the table not made yet
                    have[table] = 0
        if all(have[k] >= n for k, n in want.items()):
            print(
                f"rollups of run 1: {have['step_rollups']:,} step blocks (and their totals), "
                f"{have['host_rollups']:,} host blocks, in {time.perf_counter() - t:.0f} s"
            )
            return
        time.sleep(1)
    raise SystemExit(f"the daemon's rollups did not cover run 1 in {timeout_s:.0f} s: {have}")


def _store_summaries(db: Path, storage: Any, gpus: int) -> None:
    """Each rank's end-of-run summary, as gpuprofd stores it when a run ends
    (``bench/storage.py``'s), unless the database has them."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (missing,) = conn.execute("SELECT COUNT(*) FROM runs WHERE summary IS NULL").fetchone()
    if missing:
        t = time.perf_counter()
        storage.store_summaries(db, gpus)
        print(f"stored each rank's summary in {time.perf_counter() - t:.0f} s")


def _counts(db: Path) -> dict[str, int]:
    """Rows by table of a database built before (what :func:`build` returns)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("steps", "gpu_rollups")
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--step-ms", type=float, default=500.0)
    ap.add_argument("--width", type=int, default=1400, help="the page's width (px)")
    ap.add_argument("--live-steps", type=int, default=100_000)
    ap.add_argument("--db", type=Path, help="a database bench/storage.py built (copied)")
    args = ap.parse_args()
    storage = _storage_bench()
    work = Path(tempfile.mkdtemp(prefix="gpd", dir="/tmp"))
    try:
        db = work / "day.db"
        t = time.perf_counter()
        if args.db is not None:
            shutil.copyfile(args.db, db)
            counts = _counts(db)
            how = f"copied {args.db}"
        else:
            counts = storage.build(db, args.hours, args.gpus, args.step_ms)
            how = f"built the {args.hours:g} h, {args.gpus}-GPU database"
        print(
            f"{how} in {time.perf_counter() - t:.0f} s: {counts['steps']:,} steps, "
            f"{counts['gpu_rollups']:,} GPU rollups, {db.stat().st_size / 1e6:.0f} MB"
        )
        _store_summaries(db, storage, args.gpus)
        with daemon(db, work) as (base, env):
            _wait_rollups(db, counts["steps"] // args.gpus, args.hours * 3600)
            run = json.loads(get(f"{base}/api/v1/runs/1")[0])["run"]
            api_case(base, args.width, run)
            page_case(base, args.width)
            live_case(base, env, work, args.live_steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
