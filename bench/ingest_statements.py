"""A team server's ingest, statement by statement, without HTTP: where a batch's CPU goes.

``--nodes`` simulated 8-GPU nodes (``server_ingest.Node``: 80 steps, 8 GPU
rollups and a host sample a second) send ``--seconds`` seconds, replayed in
this one process through the server's own path (``orjson`` and the batch
checks, then :func:`gpuprofd.storage.writes.ingest.apply_batches` in groups
of ``--group``, one transaction at a time, the replica's known GPUs kept and
its collector tuned as a replica's) on a fresh Postgres schema. The bodies are built
before anything is timed; the runs' ``run`` events are applied first.

Prints, per batch: this process's CPU reading and checking the body, and
in ``apply_batches``; then each statement's CPU, that of its own Postgres
backend (``/proc/PID/schedstat``, read before and after it: Linux, the
database on this host) and this process's in it. Each backend's CPU is its
own, so the figures hold on a box shared with other work better than
``server_ingest.py``'s, which counts Postgres's background processes too.

    python bench/ingest_statements.py [--nodes 500] [--seconds 6] [--group 64]
                                      [--postgres postgres://root@127.0.0.1:5432/test]

Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "shim"), str(ROOT / "daemon"), str(ROOT / "bench")]

import asyncpg  # noqa: E402
import asyncpg.connection  # noqa: E402
import orjson  # noqa: E402
from server_ingest import Node  # noqa: E402

from gpuprofd.core.counters import DropCounter  # noqa: E402
from gpuprofd.server.ingest_api import decode  # noqa: E402
from gpuprofd.server.serve import tune_gc  # noqa: E402
from gpuprofd.storage.url import parse  # noqa: E402
from gpuprofd.storage.writes import Store, pgbulk  # noqa: E402
from gpuprofd.storage.writes.ingest import apply_batches  # noqa: E402

#: asyncpg's connection methods the store's statements go through.
_TIMED = ("fetch", "fetchrow", "fetchval", "execute", "executemany", "copy_records_to_table")
#: Per statement (its method and the start of its text): Postgres ns, this process's s, calls.
Stats = dict[str, list[float]]


def _backend_ns(pid: int) -> int:
    """CPU ns the Postgres backend *pid* has run (``/proc/PID/schedstat``)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def time_statements(stats: Stats, on: list[bool]) -> None:
    """Wrap asyncpg's connection methods: while ``on[0]``, each call's
    backend CPU and this process's CPU go into *stats* under its statement."""

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        async def timed(self: Any, *args: Any, **kw: Any) -> Any:
            if not on[0]:
                return await real(self, *args, **kw)
            pid = self.get_server_pid()
            ns, cpu = _backend_ns(pid), time.process_time()
            try:
                return await real(self, *args, **kw)
            finally:
                key = f"{name} {args[0] if args else ''}"[:100].replace("\n", " ")
                got = stats[key]
                got[0] += _backend_ns(pid) - ns
                got[1] += time.process_time() - cpu
                got[2] += 1

        return timed

    for name in _TIMED:
        conn = asyncpg.connection.Connection
        setattr(conn, name, wrap(name, getattr(conn, name)))


async def replay(nodes: int, seconds: int, group: int, dsn: str) -> None:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    simulated = [Node(n) for n in range(nodes)]
    hellos = [orjson.dumps(n.hello()) for n in simulated]
    bodies = [[orjson.dumps(n.second_batch()[0]) for n in simulated] for _ in range(seconds)]
    stats: Stats = collections.defaultdict(lambda: [0.0, 0.0, 0])
    on = [False]
    time_statements(stats, on)
    store = Store(parse(f"{dsn}?search_path={schema}"), DropCounter())
    gpus = pgbulk.StoredGpus()
    try:
        await store.open()
        store.start()
        for first in range(0, nodes, group):
            await apply_batches(store, [decode(b) for b in hellos[first : first + group]], gpus)
        reading = applying = 0.0
        on[0] = True
        for second in bodies:
            for first in range(0, nodes, group):
                t0 = time.process_time()
                batches = [decode(b) for b in second[first : first + group]]
                t1 = time.process_time()
                got = await apply_batches(store, batches, gpus)
                applying += time.process_time() - t1
                reading += t1 - t0
                bad = [r for r in got if isinstance(r, Exception)]
                assert not bad, bad[0]
        on[0] = False
    finally:
        await store.close()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
    n = nodes * seconds
    print(f"{nodes} nodes x {seconds} s in groups of {group}: per batch (us)")
    print(f"  reading and checking {reading / n * 1e6:.0f}, apply_batches {applying / n * 1e6:.0f}")
    print("  Postgres  this process  calls  statement")
    for key, (ns, cpu, calls) in sorted(stats.items(), key=lambda kv: -kv[1][0]):
        print(f"  {ns / 1e3 / n:8.1f}  {cpu / n * 1e6:12.1f}  {calls:5d}  {key}")
    print(f"  load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--postgres", default="postgres://root@127.0.0.1:5432/test")
    args = ap.parse_args()
    tune_gc()  # as gpuprofd serve does
    asyncio.run(replay(args.nodes, args.seconds, args.group, args.postgres))


if __name__ == "__main__":
    main()
