"""Forwarding: a node's outbox sent to a team server on this machine.

A real ``python -m gpuprofd serve`` (SQLite file, or ``--storage postgres``)
and, in this process, a node's real store and forwarder
(:mod:`gpuprofd.forward.forwarder`). The node's database is filled as an
8-GPU node at 100 ms steps fills it: each second 8 ranks x 10 steps, 8
per-second GPU rollups, 2 host samples and 8 x 2 run CPU samples (106
events), for ``--minutes`` of training (default 60) with the server away;
then the backlog is sent (``Forwarder.drain``, as ``gpuprofctl drain`` does)
and the server is read back.

Prints, from one run:

- the node's CPU to store those events with forwarding on and off (the
  outbox rows written in the same transactions), per 10k events;
- the backlog's size in the outbox (bytes, and MiB per hour of training);
- the catch-up: wall time, events per second end to end, and the node's
  CPU (reading, encoding, compressing, posting, deleting) per 10k events;
- a check that the server stored every step once.

    python bench/forward.py [--minutes 60] [--storage sqlite|postgres]
                            [--postgres postgres://root@127.0.0.1:5432/test]

The server shares this box's 2 cores with the node: the catch-up time is
an upper bound. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "shim"), str(ROOT / "daemon"), str(ROOT / "bench")]

from server_ingest import KEY, start_server  # noqa: E402

from gpuprofd.core.counters import DropCounter  # noqa: E402
from gpuprofd.forward.config import ApiKey, ForwardConfig  # noqa: E402
from gpuprofd.forward.forwarder import Forwarder  # noqa: E402
from gpuprofd.sampling.rollup import ROLLUP_COLUMNS  # noqa: E402
from gpuprofd.storage import schema  # noqa: E402
from gpuprofd.storage.reader import open_reader  # noqa: E402
from gpuprofd.storage.reads import steprows  # noqa: E402
from gpuprofd.storage.writes import Op, Store, outbox, runsdb  # noqa: E402

RANKS, STEPS_PER_S, GPUS, HOST_HZ = 8, 10, 8, 2
EVENTS_PER_S = RANKS * STEPS_PER_S + GPUS + HOST_HZ + RANKS * HOST_HZ
NS = 1_000_000_000


def _rollup(sec_ns: int, gpu: str, boot: str) -> tuple[Any, ...]:
    row: dict[str, Any] = {c: 1.0 for c in ROLLUP_COLUMNS}
    row.update(sec_ns=sec_ns, uuid=gpu, n=10, boot_id=boot, util_mean=97.5, power_mean_mw=6.1e5)
    return tuple(row[c] for c in ROLLUP_COLUMNS)


def _second(run_ids: list[int], gpus: list[str], boot: str, s: int) -> list[Op]:
    """One second of an 8-GPU node's ops (:data:`EVENTS_PER_S` of them)."""
    base = (s + 10) * NS
    ops = []
    for rank, run_id in enumerate(run_ids):
        for k in range(STEPS_PER_S):
            t0 = base + k * NS // STEPS_PER_S
            msg = {
                "i": s * STEPS_PER_S + k,
                "t0": t0,
                "t1": t0 + 95_000_000,
                "wait": 4_000_000 + rank,
                "explicit": False,
                "micro": 1,
                "phases": {"forward": 30_000_000, "backward": 55_000_000, "optimizer": 8_000_000},
                "optimizers": [],
                "mem": [21474836480, 25769803776, 23622320128],
            }
            ops.append(runsdb.step_op(run_id, msg))
    ops += [runsdb.rollup_op(_rollup(base, g, boot)) for g in gpus]
    for h in range(HOST_HZ):
        mono = base + h * NS // HOST_HZ
        ops.append(
            runsdb.host_sample_op(mono, 23.5, 32, 1048576.0, 12.0, 1 << 34, 1 << 40, 0.0, boot)
        )
        ops += [runsdb.run_cpu_op(run_id, mono, 1.02) for run_id in run_ids]
    return ops


async def _fill(db: Path, seconds: int, forwarding: bool) -> tuple[float, int]:
    """Store *seconds* of the node in *db*; (CPU seconds, events)."""
    schema.prepare(db)
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    store.forwarding = forwarding
    boot = uuid.uuid4().hex
    gpus = [f"GPU-{uuid.uuid4()}" for _ in range(GPUS)]
    run_ids = []
    for rank in range(RANKS):
        row = {
            "run_key": uuid.uuid4().hex,
            "run_uuid": str(uuid.uuid4()),
            "run_name": f"bench-rank{rank}",
            "status": "running",
            "host": "bench-node",
            "pid": 1000 + rank,
            "rank": rank,
            "local_rank": rank,
            "world_size": RANKS,
            "auto": 1,
            "start_wall_ns": time.time_ns(),
            "start_mono_ns": 10 * NS,
            "boot_id": boot,
            "group_id": boot,
        }
        run_ids.append(await runsdb.insert_run(store, row))
    cpu0 = time.process_time()
    events = 0
    for s in range(seconds):
        ops = _second(run_ids, gpus, boot, s)
        for op in ops:
            await store.submit(op)
        events += len(ops)
    await store.flush()
    cpu = time.process_time() - cpu0
    await store.close()
    return cpu, events


async def _catch_up(db: Path, url: str) -> dict[str, Any]:
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    try:
        before = await outbox.state(store)
        fwd = Forwarder(store, ForwardConfig(url, ApiKey(text=KEY)), host="bench-node")
        cpu0, t0 = time.process_time(), time.monotonic()
        settled = await fwd.drain()
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        after = await outbox.state(store)
        return {
            "before": before,
            "after": after,
            "settled": settled,
            "wall_s": wall,
            "cpu_s": cpu,
            "batches": fwd.status.sent_batches,
        }
    finally:
        await store.close()


def _server_steps(storage: str) -> tuple[int, int]:
    """(steps stored, distinct (run, step)) on the server."""

    async def read() -> tuple[int, int]:
        n = distinct = 0
        async with open_reader(storage) as reader:  # the server packs older steps
            for (run_id,) in await reader.fetchall("SELECT id FROM runs"):
                rows = await steprows.rows(reader, run_id)
                n += len(rows)
                distinct += len({r[0] for r in rows})
        return n, distinct

    return asyncio.run(read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--storage", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--postgres", default="postgres://root@127.0.0.1:5432/test")
    args = ap.parse_args()
    seconds = max(1, int(args.minutes * 60))
    with tempfile.TemporaryDirectory(prefix="gpuprof-bench-forward-") as tmp_name:
        tmp = Path(tmp_name)
        off_cpu, off_events = asyncio.run(_fill(tmp / "off.db", min(seconds, 300), False))
        print(f"node, {args.minutes:g} min of an 8-GPU node ({EVENTS_PER_S} events/s)")
        on_cpu, events = asyncio.run(_fill(tmp / "node.db", seconds, True))
        on_per_10k = on_cpu / events * 1e4
        off_per_10k = off_cpu / off_events * 1e4
        print(
            f"  storing: {on_per_10k * 1e3:.0f} ms CPU per 10k events with forwarding, "
            f"{off_per_10k * 1e3:.0f} ms without: the outbox adds "
            f"{(on_per_10k - off_per_10k) * 1e3:.0f} ms ({on_per_10k / off_per_10k:.2f}x)"
        )
        if args.storage == "postgres":  # a schema of its own (the server makes it)
            storage = f"{args.postgres}?search_path=bench_fwd_{uuid.uuid4().hex[:8]}"
        else:
            storage = f"sqlite:///{tmp / 'team.db'}"
        proc, url, _log = start_server(storage, tmp)
        try:
            got = asyncio.run(_catch_up(tmp / "node.db", url))
        finally:
            proc.terminate()
            proc.wait(30)
        before = got["before"]
        mib = before.bytes / 2**20
        print(
            f"  backlog: {before.events} events, {mib:.1f} MiB in the outbox "
            f"({mib / (seconds / 3600):.0f} MiB per hour of training)"
        )
        rate = got["settled"] / got["wall_s"]
        print(
            f"  catch-up to {args.storage}: {got['wall_s']:.1f} s in {got['batches']} batches, "
            f"{rate:,.0f} events/s end to end ({rate / EVENTS_PER_S:.0f}x the node's rate); "
            f"node CPU {got['cpu_s'] / got['settled'] * 1e4 * 1e3:.0f} ms per 10k events"
        )
        steps, distinct = _server_steps(storage)
        expected = seconds * RANKS * STEPS_PER_S
        print(
            f"  server: {steps} steps stored ({distinct} distinct, {expected} sent); "
            f"outbox left: {got['after'].events} events"
        )


if __name__ == "__main__":
    main()
