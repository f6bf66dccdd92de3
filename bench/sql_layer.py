"""The cost of gpuprof's own SQL layer against SQLAlchemy Core, on the same
drivers (aiosqlite, asyncpg), for what ingest does most: many step rows in
one transaction.

gpuprof writes its statements once in the SQL both engines run and sends
them straight to the driver (:mod:`gpuprofd.storage.dialect` numbers the
placeholders for Postgres; plain inserts of many rows go through COPY).
This measures, in one run, the time per stored step row of:

- gpuprof's :class:`gpuprofd.storage.writes.store.Store` (its writer, batching,
  savepoints), fed as ingest feeds it;
- SQLAlchemy Core 2 (``insert(table)`` executed with a list of rows, in one
  transaction), on the same table and rows.

Needs SQLAlchemy, which gpuprof itself does not use: ``pip install "sqlalchemy[asyncio]"``.

    python bench/sql_layer.py [--rows 50000] [--postgres postgres://root@127.0.0.1:5432/test]

Prints µs per row and the ratio; not a test (these machines are noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

from gpuprofd.core.counters import DropCounter
from gpuprofd.storage import schema
from gpuprofd.storage.url import parse
from gpuprofd.storage.writes import BATCH_MAX_OPS, Store, runsdb

PHASES = {"forward": 3_000_000, "backward": 4_000_000, "optimizer": 2_000_000}


def step(i: int) -> dict:
    t0 = 1_000_000_000 + i * 10_000_000
    return {
        "i": i,
        "t0": t0,
        "t1": t0 + 9_000_000,
        "wait": 1_000_000,
        "explicit": False,
        "micro": 1,
        "phases": PHASES,
    }


async def gpuprof_store(url: str, n: int) -> float:
    """Seconds for *n* step rows through gpuprof's store, queued as ingest queues them."""
    parsed = parse(url)
    if parsed.path is not None:
        schema.prepare(parsed.path)
    store = Store(parsed, DropCounter(), queue_size=n + 10)
    await store.open()
    store.start()
    try:
        run = await runsdb.insert_run(
            store, {"run_key": uuid.uuid4().hex, "run_name": "b", "status": "running"}
        )
        ops = [runsdb.step_op(run, step(i)) for i in range(n)]
        t = time.perf_counter()
        for op in ops:
            store.submit_nowait(op)
        await store.flush()
        return time.perf_counter() - t
    finally:
        await store.close()


async def sqlalchemy_core(url: str, n: int) -> float:
    """Seconds for the same *n* rows through SQLAlchemy Core on the same driver."""
    import orjson
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    parsed = parse(url)
    if parsed.path is not None:
        schema.prepare(parsed.path)
        engine = create_async_engine(f"sqlite+aiosqlite:///{parsed.path}")
    else:
        assert parsed.dsn is not None
        dsn = parsed.dsn.split("://", 1)[1]
        base, _, query = dsn.partition("?")
        search = dict(p.split("=", 1) for p in query.split("&") if p)
        engine = create_async_engine(
            f"postgresql+asyncpg://{base}",
            connect_args={"server_settings": {"search_path": search.get("search_path", "public")}},
        )
        await gpuprof_store(url, 1)  # makes the schema
    meta = sa.MetaData()
    steps = sa.Table(
        "steps",
        meta,
        *(
            sa.Column(c, sa.BigInteger)
            for c in (
                "run_id",
                "step",
                "t0_ns",
                "t1_ns",
                "wait_ns",
                "explicit",
                "micro",
                "skipped",
                "eval_ns",
            )
        ),
        sa.Column("phases", sa.Text),
        sa.Column("optimizers", sa.Text),
        *(
            sa.Column(c, sa.BigInteger)
            for c in ("mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes", "traced")
        ),
    )
    rows = [
        {
            "run_id": 1,
            "step": m["i"],
            "t0_ns": m["t0"],
            "t1_ns": m["t1"],
            "wait_ns": m["wait"],
            "explicit": 0,
            "micro": 1,
            "phases": orjson.dumps(m["phases"]).decode(),
            "skipped": 0,
            "eval_ns": 0,
            "optimizers": None,
            "mem_allocated_bytes": None,
            "mem_reserved_bytes": None,
            "mem_peak_bytes": None,
            "traced": 0,
        }
        for m in (step(i) for i in range(n))
    ]
    try:
        t = time.perf_counter()
        # the same batches a transaction as gpuprof's writer
        for k in range(0, n, BATCH_MAX_OPS):
            async with engine.begin() as conn:
                await conn.execute(sa.insert(steps), rows[k : k + BATCH_MAX_OPS])
        return time.perf_counter() - t
    finally:
        await engine.dispose()


async def _pg_admin(dsn: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument(
        "--postgres",
        default=os.environ.get("GPUPROF_TEST_POSTGRES", "postgres://root@127.0.0.1:5432/test"),
    )
    a = ap.parse_args()
    try:
        import sqlalchemy  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench/sql_layer.py compares against SQLAlchemy: pip install 'sqlalchemy[asyncio]'"
        ) from None
    print(f"{a.rows:,} step rows, {BATCH_MAX_OPS:,} a transaction; µs per row (best of 3)")
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("sqlite", "postgres"):
            best: dict[str, float] = {}
            for attempt in range(3):
                for name, fn in (("gpuprof", gpuprof_store), ("sqlalchemy", sqlalchemy_core)):
                    if backend == "sqlite":
                        url = f"sqlite:///{Path(tmp) / f'{name}{attempt}.db'}"
                        cleanup = None
                    else:
                        schema_name = f"gpuprof_bench_{uuid.uuid4().hex[:8]}"
                        sep = "&" if "?" in a.postgres else "?"
                        url = f"{a.postgres}{sep}search_path={schema_name}"
                        cleanup = f'DROP SCHEMA IF EXISTS "{schema_name}" CASCADE'
                    try:
                        s = asyncio.run(fn(url, a.rows))
                    finally:
                        if cleanup:
                            asyncio.run(_pg_admin(a.postgres, cleanup))
                    best[name] = min(best.get(name, s), s)
            g, q = best["gpuprof"] / a.rows * 1e6, best["sqlalchemy"] / a.rows * 1e6
            print(
                f"  {backend:<9} gpuprof store {g:6.1f} µs/row   SQLAlchemy Core {q:6.1f} µs/row"
                f"   ratio {q / g:.2f}x"
            )


if __name__ == "__main__":
    main()
