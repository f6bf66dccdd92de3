"""Ingest: how many step events a real gpuprofd stores per second, on SQLite
and on Postgres, and what it drops.

For each backend a real ``python -m gpuprofd`` is started on its own socket
directory and database; sender processes use the manual API
(``gpuprof.profile(auto=False)``, ``prof.step(i)``), as a training loop
would, in two shapes:

- burst: one process sends ``--burst`` steps as fast as it can;
- sustained: ``--senders`` processes each send at a fixed rate for
  ``--seconds`` (the rates in ``--rates``, events/s summed over senders).

Per case: events the senders sent, events stored (counted in the database
once the runs ended), drops (the shim's and the daemon's, by reason), the
rate the senders achieved and the rate stored, and the p50/p99 time from a
step's end to its commit (a poller reads each run's step count every 10 ms;
a step is committed when the count passes it, both clocks monotonic on this
host, so the figure is good to ~10 ms). Beside them: the shim's fixed cost
per step (thread CPU µs of ``prof.step`` with nothing inside), measured in
the burst sender.

    python bench/ingest.py [--backends sqlite,postgres] [--burst 200000]
                           [--rates 20000,50000] [--senders 2] [--seconds 10]
                           [--postgres postgres://root@127.0.0.1:5432/test]

Prints the figures; not a test (these machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from gpuprofd.storage import stepcodec
from gpuprofd.storage.reads import steprows

ROOT = Path(__file__).resolve().parents[1]

#: A sender: manual-API steps at a rate (0: as fast as it goes); prints JSON.
SENDER = r"""
import json, sys, time
import gpuprof
name, n, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
period = 1.0 / rate if rate else 0.0
cpu = 0
clock = time.thread_time_ns
with gpuprof.profile(name, auto=False, print_summary=False) as prof:
    start = time.perf_counter()
    for i in range(n):
        if period:  # sleep when ahead (a busy wait would take a core from the daemon)
            ahead = start + i * period - time.perf_counter()
            if ahead > 0.001:
                time.sleep(ahead)
        c0 = clock()
        with prof.step(i):
            pass
        cpu += clock() - c0
    sent_s = time.perf_counter() - start
print(json.dumps({"n": n, "sent_s": sent_s, "cpu_us_per_step": cpu / n / 1e3}))
"""


def _env(socket_dir: Path, db: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env["GPUPROF_SOCKET"] = str(socket_dir)
    if db is not None:
        env["GPUPROF_DB"] = str(db)
    env.pop("GPUPROF_NVML", None)
    paths = [str(ROOT), str(ROOT / "shim"), str(ROOT / "daemon")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


@contextlib.contextmanager
def daemon(backend: str, pg: str) -> Iterator[tuple[dict[str, str], Any]]:
    """A real gpuprofd on *backend*; yields (env for senders, a query function)."""
    work = Path(tempfile.mkdtemp(prefix="gpi", dir="/tmp"))
    sock = work / "s"
    schema = f"gpuprof_bench_{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        db: Path | None = work / "gpuprof.db"
        args = ["--db", str(db)]
    else:
        db = None
        url = f"{pg}{'&' if '?' in pg else '?'}search_path={schema}"
        args = ["--storage-url", url]
    env = _env(sock, db)
    log = (work / "gpuprofd.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuprofd", "--socket-dir", str(sock), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not (sock / "control.sock").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gpuprofd did not start: {(work / 'gpuprofd.log').read_text()}")
            time.sleep(0.05)
        yield env, _querier(backend, db, pg, schema)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        proc.kill()
        log.close()
        if backend == "postgres":
            asyncio.run(_pg(pg, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        shutil.rmtree(work, ignore_errors=True)


async def _pg(dsn: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def _querier(backend: str, db: Path | None, pg: str, schema: str) -> Any:
    if backend == "sqlite":

        def q(sql: str, *args: Any) -> list[tuple]:
            if db is None or not db.exists():
                return []
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
                c.execute("PRAGMA busy_timeout=5000")
                return c.execute(sql, args).fetchall()

        return q

    def qpg(sql: str, *args: Any) -> list[tuple]:
        from gpuprofd.storage.dialect import POSTGRES

        url = f"{pg}{'&' if '?' in pg else '?'}search_path={schema}"
        try:
            return [tuple(r) for r in asyncio.run(_pg(url, POSTGRES.sql(sql), *args))]
        except Exception:  # noqa: BLE001 - the schema may not exist yet
            return []

    return qpg


class CommitPoller:
    """Polls each run's step count; the first time a count covers step i is
    step i's commit time (monotonic ns)."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.seen: dict[str, list[int]] = {}  # run name -> commit time per step index
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CommitPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.01):
            now = time.monotonic_ns()
            rows = self.query(steprows.BY_NAME_SQL)
            for name, count in rows:
                seen = self.seen.setdefault(name, [])
                seen.extend([now] * (count - len(seen)))


def _steps_t1(query: Any, name: str) -> list[int]:
    rows = query(
        "SELECT s.step, s.t1_ns FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.run_name = ?",
        name,
    )
    packs = query(
        "SELECT p.data FROM step_packs p JOIN runs r ON r.id = p.run_id WHERE r.run_name = ?", name
    )  # the daemon packs older steps (gpuprofd.storage.upkeep.steppack)
    rows += [r[:3:2] for (data,) in packs for r in stepcodec.decode(data)]
    return [t1 for _, t1 in sorted(rows, key=lambda r: r[0])]


def _drops(query: Any, names: list[str]) -> tuple[int, int, dict[str, int]]:
    marks = ", ".join("?" * len(names))
    shim = query(
        f"SELECT COALESCE(SUM(dropped_events), 0) FROM runs WHERE run_name IN ({marks})", *names
    )
    stored = [(sum(int(n) for name, n in query(steprows.BY_NAME_SQL) if name in names),)]
    daemon = {str(r): int(c) for r, c in query("SELECT reason, count FROM drops")}
    return int(shim[0][0]) if shim else 0, int(stored[0][0]) if stored else 0, daemon


def case(env: dict[str, str], query: Any, label: str, senders: int, n: int, rate: float) -> None:
    names = [f"{label}-{uuid.uuid4().hex[:6]}-{k}" for k in range(senders)]
    before = _drops(query, names)[2]
    per_rate = rate / senders if rate else 0.0
    with CommitPoller(query) as poller:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SENDER, name, str(n), str(per_rate)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for name in names
        ]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"sender failed: {err.decode()[-2000:]}")
            outs.append(orjson.loads(out.splitlines()[-1]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until every run has ended and been stored
            ended = query("SELECT COUNT(*) FROM runs WHERE status != 'running'")
            if ended and ended[0][0] >= len(names) * 1 and _all_ended(query, names):
                break
            time.sleep(0.1)
        # Events still in the daemon's socket buffer land (or are dropped and
        # counted) after the runs ended: wait until the counts stop moving
        # (drops are persisted once a second).
        last, still = None, 0.0
        while still < 2.5 and time.monotonic() < deadline + 60:
            now = _drops(query, names)
            now = (now[0], now[1], sum(now[2].values()))
            still = still + 0.5 if now == last else 0.0
            last = now
            time.sleep(0.5)
    shim_dropped, stored, daemon_drops = _drops(query, names)
    sent = senders * n
    sent_s = max(o["sent_s"] for o in outs)
    lat = []
    for name in names:
        t1 = _steps_t1(query, name)
        commits = poller.seen.get(name, [])
        lat += [(c - t) / 1e6 for t, c in zip(t1, commits, strict=False)]
    lat.sort()
    p50 = statistics.median(lat) if lat else float("nan")
    p99 = lat[int(0.99 * (len(lat) - 1))] if lat else float("nan")
    cpu = statistics.median(o["cpu_us_per_step"] for o in outs)
    store_drops = {k: v - before.get(k, 0) for k, v in daemon_drops.items() if v > before.get(k, 0)}
    print(
        f"  {label:<26} sent {sent:>8,} at {sent / sent_s:>9,.0f}/s  stored {stored:>8,} "
        f"({stored / sent_s:>9,.0f}/s)  dropped: shim {shim_dropped:,}, daemon {store_drops or 0}"
        f"  commit p50 {p50:6.1f} ms p99 {p99:7.1f} ms  shim CPU {cpu:.1f} µs/step",
        flush=True,
    )


def _all_ended(query: Any, names: list[str]) -> bool:
    marks = ", ".join("?" * len(names))
    rows = query(
        f"SELECT COUNT(*) FROM runs WHERE status != 'running' AND run_name IN ({marks})", *names
    )
    return bool(rows) and rows[0][0] == len(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--burst", type=int, default=200_000, help="steps in the one-process burst")
    ap.add_argument("--rates", default="20000,50000", help="sustained rates, events/s in all")
    ap.add_argument("--senders", type=int, default=2, help="processes in the sustained cases")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of a sustained case")
    ap.add_argument(
        "--postgres",
        default=os.environ.get("GPUPROF_TEST_POSTGRES", "postgres://root@127.0.0.1:5432/test"),
    )
    a = ap.parse_args()
    print(f"gpuprof ingest benchmark ({os.cpu_count()} CPUs)")
    for backend in a.backends.split(","):
        print(f"{backend}:")
        with daemon(backend, a.postgres) as (env, query):
            case(env, query, "burst (1 process)", 1, a.burst, 0.0)
            for rate in (float(r) for r in a.rates.split(",")):
                n = int(rate * a.seconds / a.senders)
                case(env, query, f"{rate:,.0f}/s ({a.senders} processes)", a.senders, n, rate)


if __name__ == "__main__":
    main()
