"""The "GPU-hours" page's answer time over 10,000 runs, on SQLite and Postgres.

Builds, on each backend (a temporary SQLite file; a fresh Postgres schema,
dropped after), a team's database of N ended runs (default 10,000) spread
over 60 days: 20 users, 30 projects, 50 nodes, 1-8 GPUs each, 0-4 findings
with gains (two of them claiming the same lost time, as a stall and the GPU
idle it causes do). Then it times:

- making the rollup rows of every run (``run_costs``, what a server does
  once per run as each ends), in runs per second;
- the page's answer: the rollups by user and by project for the last 30
  days (what the page asks), median and worst of 20, ms; the target is
  under 200 ms;
- ``by=finding`` over the same period, median of 20, ms.

    python bench/rollups.py [--runs 10000] [--postgres postgres://root@127.0.0.1:5432/test]
                            [--backend sqlite|postgres|both]

Prints the figures; not a test (these machines are noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from gpuprof.insights.gains import fix_all
from gpuprofd.core.counters import DropCounter
from gpuprofd.storage import schema
from gpuprofd.storage.url import parse
from gpuprofd.storage.writes import Store, costs
from gpuprofd.views.rollups import team_rollup

DAY_NS = 86400 * 10**9
RULES = (
    "dataloader_stall",
    "gpu_idle_between_steps",
    "slow_collectives",
    "low_mfu",
    "kernel_launch_overhead",
    "cpu_contention",
)
COLUMNS = (
    "run_key, run_name, status, host, node_id, user_name, project, gpu_count, "
    "start_wall_ns, start_mono_ns, end_wall_ns, auto, options, summary, run_uuid"
)


def _summary(rng: random.Random, run_s: float) -> str:
    found: list[dict[str, Any]] = [
        {"rule": "estimated_cost", "evidence": {"usd_per_hour": 4.0}, "fix": ""}
    ]
    for rule in rng.sample(RULES, rng.randint(0, 4)):
        part = "loader_wait" if rule in RULES[:2] else rule
        s = run_s * rng.uniform(0.01, 0.2)
        found.append(
            {"rule": rule, "gain_run_s": s, "gain_ms_per_iteration": s, "fix": f"fix {rule}",
             "gain_parts_ms": {part: s}, "gain_iteration_ms": run_s, "gain_usd": None}
        )  # fmt: skip
    block = fix_all(found) or {}
    return orjson.dumps({"insights": found, "gains": block}).decode()


def _rows(n: int, now_ns: int) -> list[tuple[Any, ...]]:
    rng = random.Random(26)
    rows = []
    for i in range(n):
        end = now_ns - rng.randrange(60 * DAY_NS)
        hours = rng.uniform(0.1, 24.0)
        start = end - int(hours * 3600e9)
        node = f"node-{rng.randrange(50):02d}"
        rows.append(
            (f"k{i}", f"run-{i}", "finished", node, node, f"user{rng.randrange(20)}",
             f"project-{rng.randrange(30)}", rng.choice((1, 2, 4, 8)), start, 0, end, 1, "{}",
             _summary(rng, hours * 3600), str(uuid.uuid4()))
        )  # fmt: skip
    return rows


async def _case(url: str, n: int) -> dict[str, float]:
    parsed = parse(url)
    if parsed.path is not None:
        schema.prepare(parsed.path)
    store = Store(parsed, DropCounter())
    await store.open()
    store.start()
    try:
        now = time.time_ns()
        rows = _rows(n, now)
        marks = ", ".join("?" * len(rows[0]))
        sql = f"INSERT INTO runs ({COLUMNS}) VALUES ({marks})"
        for i in range(0, n, 1000):
            chunk = rows[i : i + 1000]
            await store.transaction(lambda txn, c=chunk: txn.executemany(sql, c), "bench runs")
        t0 = time.perf_counter()
        made = await costs.refresh_all(store)
        build_s = time.perf_counter() - t0
        assert made == n, made
        page, finding = [], []
        for _ in range(20):
            t0 = time.perf_counter()
            await team_rollup(store, "user", "30d", now_ns=now)
            await team_rollup(store, "project", "30d", now_ns=now)
            page.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            await team_rollup(store, "finding", "30d", now_ns=now)
            finding.append((time.perf_counter() - t0) * 1e3)
        return {
            "runs_per_s": n / build_s,
            "page_ms_median": statistics.median(page),
            "page_ms_max": max(page),
            "finding_ms_median": statistics.median(finding),
        }
    finally:
        await store.close()


async def _admin(pg: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--postgres", default="postgres://root@127.0.0.1:5432/test")
    ap.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    args = ap.parse_args()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.backend in ("sqlite", "both"):
            cases.append(("sqlite", f"sqlite:///{Path(tmp) / 'team.db'}"))
        name = f"bench_{uuid.uuid4().hex[:10]}"
        if args.backend in ("postgres", "both"):
            await _admin(args.postgres, f'CREATE SCHEMA "{name}"')
            cases.append(("postgres", f"{args.postgres}?search_path={name}"))
        try:
            for backend, url in cases:
                got = await _case(url, args.runs)
                print(
                    f"{backend:8s} {args.runs} runs: rows made {got['runs_per_s']:,.0f} runs/s; "
                    f"page (by user + by project, 30 d) median {got['page_ms_median']:.1f} ms, "
                    f"worst {got['page_ms_max']:.1f} ms (target < 200 ms: "
                    f"{got['page_ms_median'] / 200:.2f} of it); by finding median "
                    f"{got['finding_ms_median']:.1f} ms"
                )
        finally:
            if args.backend in ("postgres", "both"):
                await _admin(args.postgres, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


if __name__ == "__main__":
    asyncio.run(main())
