"""Team-server ingest: how many nodes one ``gpuprofd serve`` sustains.

A real ``python -m gpuprofd serve`` is started on a fresh Postgres schema
(or an SQLite file); ``--nodes`` simulated nodes (one asyncio task each, in
this process) post one gzip batch a second each for ``--seconds``, shaped
like an 8-GPU node at 100 ms steps with per-second rollups: 8 ranks x 10
steps, 8 GPU rollup rows and one host sample per batch (89 rows). Every
body is built before the timed part (each batch its own sequence numbers,
steps and times), the runs' ``run`` events are sent before it too, and all
nodes send through one pool of keep-alive connections (uvloop's event loop
where installed): the senders share the server's CPUs, so they are kept
cheap.

Prints: batches and rows sent and stored (counted in the database at the
end), rows stored per second, p50/p99 batch latency (request to answer,
this host's monotonic clock, a wait for a pooled connection included),
the CPU per batch (psutil, user + system) of the server, of the senders
and of Postgres (the backends of the server's connections and Postgres's
background processes: other clients' work on the box is left out), and
whether every batch kept up (a node whose batch took longer than its
second falls behind: it sends the next at once), with the verdict: the
nodes kept up (p99 batch latency within the second, nothing dropped) or
not. Then ``--runs-list`` runs are stored and the time to open the runs
list (``GET /api/v1/runs``, logged in) is taken, the median of 5.

    python bench/server_ingest.py [--nodes 100] [--seconds 20] [--runs-list 10000]
                                  [--storage postgres|sqlite]
                                  [--postgres postgres://root@127.0.0.1:5432/test]
                                  [--profile FILE]

``--profile FILE`` runs the server under cProfile (pstats in FILE; it
slows the server down several times: for where the time goes, not for
figures). The senders and Postgres share the server's CPUs (this box has
2 cores): the figures are a floor for what the server alone would do.
Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yarl

from gpuprofd.storage.reads import steprows

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-key-0123456789"
PASSWORD = "bench"
RANKS, STEPS_PER_S, GPUS = 8, 10, 8
#: Connections the senders keep open to the server at most (one per request in flight).
MAX_CONNECTIONS = 256


def new_loop() -> asyncio.AbstractEventLoop:
    """An event loop for the senders: uvloop's where installed (cheaper per
    request: the senders share the server's CPUs)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run_event(seq: int, run: str, rank: int, boot: str) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": "run",
        "run": run,
        "fields": {
            "run_name": f"bench-rank{rank}",
            "status": "running",
            "start_wall_ns": time.time_ns(),
            "start_mono_ns": 1_000_000_000,
            "rank": rank,
            "world_size": RANKS,
            "boot_id": boot,
            "group_id": boot,
        },
    }


class Node:
    """One simulated node: its runs, its sequence, its clock."""

    def __init__(self, n: int) -> None:
        self.node = f"bench-node-{n}-{uuid.uuid4().hex[:8]}"
        self.boot = uuid.uuid4().hex
        self.runs = [str(uuid.uuid4()) for _ in range(RANKS)]
        self.gpus = [str(uuid.uuid4()) for _ in range(GPUS)]
        self.seq = 0
        self.second = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def hello(self) -> dict[str, Any]:
        events = [_run_event(self._next(), r, i, self.boot) for i, r in enumerate(self.runs)]
        return {"v": 1, "node": self.node, "events": events}

    def second_batch(self) -> tuple[dict[str, Any], int]:
        s = self.second
        self.second += 1
        events: list[dict[str, Any]] = []
        base = 1_000_000_000 + s * 1_000_000_000
        for run in self.runs:
            rows = []
            for k in range(STEPS_PER_S):
                t0 = base + k * 100_000_000
                rows.append(
                    {
                        "step": s * STEPS_PER_S + k,
                        "t0_ns": t0,
                        "t1_ns": t0 + 100_000_000,
                        "wait_ns": 2_000_000,
                        "micro": 1,
                        "phases": {"forward": 30_000_000, "backward": 55_000_000},
                    }
                )
            events.append({"seq": self._next(), "kind": "steps", "run": run, "rows": rows})
        rollups = [
            {"sec_ns": base, "uuid": g, "boot_id": self.boot, "n": 10, "util_mean": 97.0}
            for g in self.gpus
        ]
        events.append({"seq": self._next(), "kind": "gpu_rollups", "rows": rollups})
        host = [{"mono_ns": base, "boot_id": self.boot, "cpu_pct": 20.0, "cpu_count": 64}]
        events.append({"seq": self._next(), "kind": "host_samples", "rows": host})
        return {"v": 1, "node": self.node, "events": events}, RANKS * STEPS_PER_S + GPUS + 1


HEADERS = {
    "Content-Encoding": "gzip",
    "Content-Type": "application/json",
    "Authorization": f"Bearer {KEY}",
}


def _body(batch: dict[str, Any]) -> bytes:
    return gzip.compress(orjson.dumps(batch), 6)


async def _post(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    """POST one gzip body; its latency, seconds (waiting for a pooled connection included)."""
    t0 = time.monotonic()
    async with http.post(f"{url}/api/v1/ingest", data=body, headers=HEADERS) as r:
        if r.status != 200:
            raise RuntimeError(f"ingest answered {r.status}: {await r.text()}")
        await r.read()
    return time.monotonic() - t0


def build_bodies(nodes: int, seconds: float) -> list[tuple[bytes, list[tuple[bytes, int]]]]:
    """Per node: its hello (the runs' ``run`` events) and one gzip body per
    second (with its row count), built before anything is timed: every
    batch's sequence numbers, steps and times its own."""
    out = []
    for n in range(nodes):
        node = Node(n)
        hello = _body(node.hello())
        per_second = []
        for _ in range(int(seconds)):
            batch, rows = node.second_batch()
            per_second.append((_body(batch), rows))
        out.append((hello, per_second))
    return out


async def _node(
    http: aiohttp.ClientSession,
    url: str,
    n: int,
    start: float,
    bodies: list[tuple[bytes, int]],
    out: dict[str, list[Any]],
) -> None:
    """Send *bodies* one a second from *start* (spread over the second by *n*);
    a batch that took longer than its second sends the next at once."""
    tick = start + (n % 10) / 10
    for body, rows in bodies:
        await asyncio.sleep(max(0.0, tick - time.monotonic()))
        took = await _post(http, url, body)
        out["latency"].append(took)
        out["rows"].append(rows)
        if took > 1.0:
            out["late"].append(took)
        tick += 1.0


def start_server(
    storage: str, tmp: Path, profile: str | None = None
) -> tuple[subprocess.Popen[bytes], str, Path]:
    (tmp / "keys").write_text(KEY + "\n")
    (tmp / "viewer").write_text(PASSWORD + "\n")
    log = tmp / "serve.log"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'shim'}:{ROOT / 'daemon'}"}
    cmd = [
        sys.executable,
        *(["-m", "cProfile", "-o", profile] if profile else []),
        "-m",
        "gpuprofd",
        "serve",
        "--storage-url",
        storage,
        "--http",
        "127.0.0.1:0",
        "--api-key-file",
        str(tmp / "keys"),
        "--viewer-password-file",
        str(tmp / "viewer"),
        "--log-level",
        "warning",
    ]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # the ready line is logged at info: read the port from the server's sockets
        try:
            conns = psutil.Process(proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            conns = []
        listening = [c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN]
        if listening:
            return proc, f"http://127.0.0.1:{listening[0]}", log
        if proc.poll() is not None:
            raise SystemExit(f"gpuprofd serve exited: {log.read_text()}")
        time.sleep(0.1)
    raise SystemExit(f"gpuprofd serve did not start: {log.read_text()}")


async def _runs_list_time(url: str, n_runs: int) -> float:
    node = f"bench-list-{uuid.uuid4().hex[:8]}"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        seq = 0
        for first in range(0, n_runs, 5000):
            events = []
            for i in range(first, min(n_runs, first + 5000)):
                seq += 1
                events.append(_run_event(seq, str(uuid.uuid4()), i % RANKS, "list-boot"))
            await _post(http, url, _body({"v": 1, "node": node, "events": events}))
        async with http.get(f"{url}/api/v1/session") as r:
            await r.read()
        token = http.cookie_jar.filter_cookies(yarl.URL(url)).get("gpuprof_csrf")
        csrf = token.value if token else ""
        async with http.post(
            f"{url}/api/v1/login", json={"password": PASSWORD}, headers={"X-CSRF-Token": csrf}
        ) as r:
            assert r.status == 200, await r.text()
        times = []
        for _ in range(5):
            t0 = time.monotonic()
            async with http.get(f"{url}/api/v1/runs") as r:
                await r.read()
                assert r.status == 200
            times.append(time.monotonic() - t0)
    return statistics.median(times)


def _cpu(proc: psutil.Process) -> float:
    """User + system CPU seconds of *proc* (its threads included)."""
    return float(sum(proc.cpu_times()[:2]))


def _postgres_cpu(server: psutil.Process) -> dict[int, float]:
    """CPU seconds, per process, of the Postgres backends serving *server*'s
    connections and of Postgres's own background processes (WAL writer,
    checkpointer: no client connection); other clients' backends (other
    work on the box) are left out. Read before and after: a backend ends
    with its connection."""
    ports = {
        c.laddr.port
        for c in server.net_connections(kind="tcp")
        if c.raddr and c.status == psutil.CONN_ESTABLISHED
    }
    out: dict[int, float] = {}
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] not in ("postgres", "postmaster"):
            continue
        try:
            conns = [c for c in proc.net_connections(kind="tcp") if c.raddr]
            if not conns or any(c.raddr.port in ports for c in conns):
                out[proc.pid] = _cpu(proc)
        except psutil.Error:
            continue
    return out


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two :func:`_postgres_cpu` readings (a
    backend started in between counts from zero)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _count(storage: str, sql: str) -> int:
    if storage.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(storage.split("://", 1)[1].replace("//", "/", 1))
        try:
            return int(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()

    async def read() -> int:
        import asyncpg

        dsn, schema = storage.split("?search_path=")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'SET search_path TO "{schema}"')
            return int(await conn.fetchval(sql))
        finally:
            await conn.close()

    return asyncio.run(read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--runs-list", type=int, default=10_000)
    ap.add_argument("--storage", choices=("postgres", "sqlite"), default="postgres")
    ap.add_argument("--postgres", default="postgres://root@127.0.0.1:5432/test")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the server into FILE (pstats)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        storage = (
            f"{args.postgres}?search_path={schema}"
            if args.storage == "postgres"
            else f"sqlite:///{tmp / 'team.db'}"
        )
        proc, url, _log = start_server(storage, tmp, args.profile)
        try:
            ps = psutil.Process(proc.pid)
            out: dict[str, list[Any]] = {"latency": [], "rows": [], "late": []}
            bodies = build_bodies(args.nodes, args.seconds)
            marks: dict[str, float] = {}
            pg0: dict[int, float] = {}

            async def send() -> None:
                # one pool of connections for every node (a keep-alive connection per
                # request in flight), as behind a load balancer in front of replicas
                connector = aiohttp.TCPConnector(limit=min(args.nodes, MAX_CONNECTIONS))
                timeout = aiohttp.ClientTimeout(total=60)
                async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
                    for first in range(0, len(bodies), MAX_CONNECTIONS):  # the runs, untimed
                        part = bodies[first : first + MAX_CONNECTIONS]
                        await asyncio.gather(*(_post(http, url, hello) for hello, _ in part))
                    marks["cpu0"] = sum(ps.cpu_times()[:2])
                    marks["me0"] = _cpu(psutil.Process())
                    pg0.update(_postgres_cpu(ps))
                    marks["t0"] = start = time.monotonic() + 0.1
                    await asyncio.gather(
                        *(_node(http, url, n, start, b, out) for n, (_, b) in enumerate(bodies))
                    )

            loop = new_loop()
            loop.run_until_complete(send())
            loop.close()
            cpu0, me0, t0 = marks["cpu0"], marks["me0"], marks["t0"]
            wall = time.monotonic() - t0
            cpu = sum(ps.cpu_times()[:2]) - cpu0
            senders, pg = _cpu(psutil.Process()) - me0, _used(pg0, _postgres_cpu(ps))
            sent = sum(out["rows"])
            stored = (
                _count(storage, steprows.TOTAL_SQL)
                + _count(storage, "SELECT COUNT(*) FROM gpu_rollups")
                + _count(storage, "SELECT COUNT(*) FROM host_samples")
            )
            lat = sorted(out["latency"])
            p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
            print(
                f"storage {args.storage}, {args.nodes} nodes x {args.seconds:g} s "
                f"({RANKS} ranks x {STEPS_PER_S} steps/s, {GPUS} GPUs each)"
            )
            print(f"  batches {len(lat)}, rows sent {sent}, stored {stored}")
            print(f"  rows stored/s {stored / wall:,.0f} over {wall:.1f} s")
            print(
                f"  batch latency p50 {p(0.5) * 1000:.0f} ms, p99 {p(0.99) * 1000:.0f} ms, "
                f"max {lat[-1] * 1000:.0f} ms; over 1 s: {len(out['late'])}"
            )
            print(
                f"  server CPU {cpu:.1f} s: {cpu / max(1, stored) * 10_000:.2f} s per 10k rows, "
                f"{cpu / max(1, len(lat)) * 1000:.2f} ms per batch"
            )
            print(
                f"  the same {wall:.1f} s: senders' CPU {senders:.1f} s, Postgres's {pg:.1f} s "
                "(this server's backends and Postgres's own)"
            )
            per = 1000 / max(1, len(lat))
            all_in = (cpu + senders + pg) * per
            print(
                f"  CPU per batch: server {cpu * per:.2f} ms, senders {senders * per:.2f} ms, "
                f"Postgres {pg * per:.2f} ms; all in {all_in:.2f} ms "
                f"(one core: {1000 / all_in:,.0f} batches/s); "
                f"load average {os.getloadavg()[0]:.1f}"
            )
            dropped = sent - stored
            # the target: p99 within the second the next batch is due, nothing lost
            kept_up = p(0.99) <= 1.0 and dropped == 0
            print(f"  dropped {dropped}; " + ("kept up" if kept_up else "did NOT keep up"))
            if args.runs_list:
                took = asyncio.run(_runs_list_time(url, args.runs_list))
                total = _count(storage, "SELECT COUNT(*) FROM runs")
                print(f"  runs list with {total} runs stored: {took * 1000:.0f} ms (median of 5)")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if args.storage == "postgres":

                async def drop() -> None:
                    import asyncpg

                    conn = await asyncpg.connect(args.postgres)
                    try:
                        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                    finally:
                        await conn.close()

                asyncio.run(drop())


if __name__ == "__main__":
    main()
