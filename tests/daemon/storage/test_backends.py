"""The store on each backend: the same writes and reads on a SQLite file and
on the real Postgres (a fresh schema per test), the schema made once from one
definition, versions checked, and a Postgres lost and back."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from typing import Any

import orjson
import pytest

from gpuprofd.core.counters import DropCounter
from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import reads, schema
from gpuprofd.storage.dialect import POSTGRES
from gpuprofd.storage.url import parse, redact
from gpuprofd.storage.writes import Op, Part, runsdb
from gpuprofd.storage.writes import store as store_mod
from tests.daemon.helpers import PHASES, open_store


def run_row(key: str = "k1", name: str = "exp") -> dict[str, Any]:
    return {
        "run_key": key,
        "run_name": name,
        "status": "running",
        "host": "h",
        "pid": 1,
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "auto": 1,
        "start_wall_ns": 1,
        "start_mono_ns": 2,
        "options": {"flops_per_step": 5e12},
        "cpu_count": 2,
    }


def step_msg(i: int, **extra: Any) -> dict[str, Any]:
    t0 = 1_000_000_000 + i * 10_000_000
    return {
        "i": i,
        "t0": t0,
        "t1": t0 + 9_000_000,
        "wait": 1_000_000,
        "explicit": False,
        "micro": 1,
        "phases": dict(PHASES),
        **extra,
    }


async def test_writes_read_back_the_same_on_each_backend(storage_url: str) -> None:
    drops = DropCounter()
    async with open_store(storage_url, drops) as store:
        first = await runsdb.insert_run(store, run_row("k1"))
        second = await runsdb.insert_run(store, run_row("k2", "other"))
        assert (first, second) == (1, 2)  # ids from RETURNING on both engines
        for i in range(1000):
            assert store.submit_nowait(runsdb.step_op(first, step_msg(i)))
        comm = [[0, 10, 20, 4096], [1, 15, 30, 8192]]
        assert store.submit_nowait(runsdb.step_op(first, step_msg(1000, comm=comm)))
        kernels = {
            "t0": 5,
            "t1": 6,
            "source": "snapshot",
            "steps": [3],
            "rows": [
                ["gemm", "kernel", "compute", 4, 4000, 4000, 1e9],
                ["nccl", "kernel", "comm", 1, 500, 500, 0.0],
            ],
        }
        assert store.submit_all_nowait(runsdb.kernels_ops(first, kernels))
        for cpu_s in (1.5, 2.5):  # an upsert: one row, the later reading
            reading = type(
                "W",
                (),
                {
                    "run_id": first,
                    "loader_seq": 0,
                    "worker_id": 0,
                    "pid": 77,
                    "first_mono_ns": 1,
                    "last_mono_ns": 9,
                    "cpu_s": cpu_s,
                    "ctx_voluntary": 10,
                    "ctx_involuntary": int(cpu_s * 100),
                },
            )
            assert store.submit_nowait(runsdb.worker_cpu_op(reading))
        await runsdb.add_drops(store, {"queue_full": 2})
        await runsdb.add_drops(store, {"queue_full": 3})
        await runsdb.update_run(store, first, status="finished", median_step_ms=9.0)
        await store.flush()

        steps = await store.fetchall(
            "SELECT step, t1_ns - t0_ns AS ns FROM steps WHERE run_id = ? ORDER BY step", (first,)
        )
        assert len(steps) == 1001 and steps[0]["ns"] == 9_000_000 and steps[-1]["step"] == 1000
        buckets = await reads.comm_buckets(store, first, 1000, 1000)
        assert [(r[1], r[4]) for r in buckets] == [(0, 4096), (1, 8192)]
        stats = await store.fetchall(
            "SELECT s.name, s.total_ns, w.source FROM kernel_stats s "
            "JOIN kernel_windows w ON w.id = s.window_id WHERE s.run_id = ? ORDER BY s.name",
            (first,),
        )
        assert [(r["name"], r["total_ns"], r["source"]) for r in stats] == [
            ("gemm", 4000, "snapshot"),
            ("nccl", 500, "snapshot"),
        ]
        (worker,) = await store.fetchall(
            "SELECT cpu_s, ctx_voluntary, ctx_involuntary FROM worker_cpu WHERE pid = 77"
        )
        assert (worker["cpu_s"], worker["ctx_voluntary"], worker["ctx_involuntary"]) == (
            2.5,
            10,
            250,
        )
        (dropped,) = await store.fetchall("SELECT count FROM drops WHERE reason = 'queue_full'")
        assert dropped["count"] == 5
        run = await store.fetchone("SELECT status, median_step_ms FROM runs WHERE id = ?", (first,))
        assert (run["status"], run["median_step_ms"]) == ("finished", 9.0)
        # A run's insights keep their order (rowid on both engines).
        assert drops.snapshot() == {}


async def test_a_bad_row_in_a_batch_is_dropped_and_counted_and_the_rest_kept(
    storage_url: str,
) -> None:
    drops = DropCounter()
    async with open_store(storage_url, drops) as store:
        run = await runsdb.insert_run(store, run_row())
        ops = [runsdb.step_op(run, step_msg(i)) for i in range(20)]
        ops[7] = Op(ops[7].sql, (None, *ops[7].params[1:]))  # run_id NOT NULL
        for op in ops:
            store.submit_nowait(op)
        await store.flush()
        (n,) = await store.fetchall("SELECT COUNT(*) AS n FROM steps")
        assert n["n"] == 19
        assert drops.snapshot().get("store_error") == 1


async def test_an_atomic_op_is_all_or_nothing(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run = await runsdb.insert_run(store, run_row())
        ok = [Part("UPDATE runs SET error = ? WHERE id = ?", (("a", run),), expect_rows=1)]
        await store.write_atomic(ok)
        bad = [
            Part("UPDATE runs SET error = ? WHERE id = ?", (("b", run),), expect_rows=1),
            Part("UPDATE runs SET error = ? WHERE id = ?", (("c", run + 99),), expect_rows=1),
        ]
        with pytest.raises(store_mod.AtomicCheckError, match="0 rows changed, expected 1"):
            await store.write_atomic(bad)
        row = await store.fetchone("SELECT error FROM runs WHERE id = ?", (run,))
        assert row["error"] == "a"


async def test_json_options_merge_the_same_on_each_backend(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run = await runsdb.insert_run(store, run_row())
        msg = {"dtype": "bf16", "dtype_source": "autocast", "flops_counted": 3e12, "flops_step": 3}
        for op in runsdb.model_info_ops(run, msg, store.dialect):
            store.submit_nowait(op)
        # a second dtype never replaces the first
        for op in runsdb.model_info_ops(run, {"dtype": "fp32"}, store.dialect):
            store.submit_nowait(op)
        await store.flush()
        row = await store.fetchone("SELECT options FROM runs WHERE id = ?", (run,))
        opts = orjson.loads(row["options"])
        assert opts["dtype"] == "bf16" and opts["dtype_source"] == "autocast"
        # the user's declared FLOPs win over the counted ones
        assert opts["flops_per_step"] == 5e12 and opts["flops_counted"] == 3e12
        assert opts["flops_source"] == "user"


async def test_a_schema_newer_than_the_code_is_refused_with_both_versions(
    storage_url: str,
) -> None:
    async with open_store(storage_url) as store:
        await store.write("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(DatabaseError, match=rf"schema 99 > {schema.SCHEMA_VERSION}"):
        async with open_store(storage_url):
            pass


async def test_postgres_tables_come_from_the_one_schema(pg_url: str) -> None:
    """Every table and column of the SQLite schema, with 64-bit integers."""
    async with open_store(pg_url) as store:
        rows = await store.fetchall(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = ANY (current_schemas(false))"
        )
    cols = {(r["table_name"], r["column_name"]): r["data_type"] for r in rows}
    assert cols[("steps", "t0_ns")] == "bigint"
    assert cols[("gpu_rollups", "util_mean")] == "double precision"
    assert cols[("runs", "run_name")] == "text"
    # the same table set as SQLite's schema
    import re

    sqlite_tables = set(re.findall(r"CREATE (?:TABLE|VIEW) IF NOT EXISTS (\w+)", schema.SCHEMA_SQL))
    assert {t for t, _ in cols} == sqlite_tables


async def test_two_stores_opening_a_new_postgres_schema_at_once_both_work(pg_url: str) -> None:
    async def one() -> int:
        async with open_store(pg_url) as store:
            return await runsdb.insert_run(store, run_row(key=f"k{id(store)}"))

    ids = await asyncio.gather(one(), one())
    assert sorted(ids) == [1, 2]


def test_placeholders_are_numbered_outside_strings() -> None:
    sql = "SELECT '?' , x FROM t WHERE a = ? AND b IS NOT DISTINCT FROM ? AND c = ?1"
    assert POSTGRES.sql(sql) == (
        "SELECT '?' , x FROM t WHERE a = $1 AND b IS NOT DISTINCT FROM $2 AND c = $1"
    )


def test_a_password_is_never_shown() -> None:
    url = parse("postgres://bob:s3cret@db.example:5433/runs?search_path=x")
    assert url.display == "postgres://bob:***@db.example:5433/runs?search_path=x"
    assert "s3cret" not in repr(url) and "s3cret" not in redact(url.dsn or "")


def test_a_daemon_on_a_down_postgres_says_so_in_one_line(tmp_path: Any) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuprofd",
            "--storage-url",
            "postgres://bob:s3cret@127.0.0.1:9/nothing",
            "--socket-dir",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(
        "gpuprofd: error: cannot connect to Postgres at postgres://bob:***@127.0.0.1:9/nothing"
    )
    assert "s3cret" not in out.stderr and "Traceback" not in out.stderr


class Proxy:
    """A TCP forwarder to Postgres that can be cut and restored: a server
    lost and back, with real sockets."""

    def __init__(self, port: int) -> None:
        self.target_port = port
        self.server: asyncio.Server | None = None
        self.port = 0
        self.links: set[asyncio.StreamWriter] = set()
        self.flowing = asyncio.Event()
        """Cleared: bytes are held, connections stay open (a silent server)."""
        self.flowing.set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._link, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()
        for w in list(self.links):
            w.transport.abort()
        self.links.clear()

    async def _link(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.links |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    await self.flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(r, uw), pipe(ur, w))


async def _through_proxy(pg_url: str) -> tuple[Proxy, str]:
    """A started :class:`Proxy` to the server of *pg_url*, and the URL through it."""
    from urllib.parse import urlsplit

    parts = urlsplit(pg_url)
    port = parts.port or 5432
    proxy = Proxy(port)
    await proxy.start()
    return proxy, pg_url.replace(f"{parts.hostname}:{port}", f"127.0.0.1:{proxy.port}")


async def test_a_lost_postgres_is_retried_and_runs_resume_when_it_returns(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(store_mod, "RETRY_MAX_S", 0.2)
    monkeypatch.setattr(store_mod, "RETRY_BUDGET_S", 1.0)

    proxy, via = await _through_proxy(pg_url)
    drops = DropCounter()
    async with open_store(via, drops) as store:
        run = await runsdb.insert_run(store, run_row())
        store.submit_nowait(runsdb.step_op(run, step_msg(0)))
        await store.flush()
        await proxy.cut()
        # Lost for longer than one batch's retry budget: that batch is counted, not stored.
        store.submit_nowait(runsdb.step_op(run, step_msg(1)))
        await asyncio.sleep(1.6)
        assert drops.snapshot().get("store_unavailable") == 1
        assert store.take_lost(run) == 1 and store.take_lost(run) == 0  # the run's, once
        # Lost briefly: the batch waits and lands once the server is back.
        store.submit_nowait(runsdb.step_op(run, step_msg(2)))
        await asyncio.sleep(0.3)
        await proxy.start()  # same port
        await store.flush()
        rows = await store.fetchall("SELECT step FROM steps ORDER BY step")
        assert [r["step"] for r in rows] == [0, 2]
        assert drops.snapshot().get("store_unavailable") == 1
    await proxy.cut()


async def test_retention_runs_the_same_on_each_backend(storage_url: str) -> None:
    """Comm pruning and kernel-window compaction: their SQL on both engines."""
    from gpuprofd.storage.upkeep import commprune, kcompact

    async with open_store(storage_url) as store:
        run = await runsdb.insert_run(store, run_row())
        for i in range(100):
            comm = [[0, 10, 20, 4096], [1, 15, 30, 8192]]
            store.submit_nowait(runsdb.step_op(run, step_msg(i, comm=comm)))
        s = 1_000_000_000
        for w in range(60):  # a minute of 1 Hz continuous windows, long past the raw window
            window = {
                "t0": w * s,
                "t1": w * s + s // 2,
                "source": "continuous",
                "steps": [w],
                "rows": [
                    ["gemm", "kernel", "compute", 2, 1000 + w, 1000 + w, 1e6],
                    ["copy", "kernel", "memcpy", 1, 10, 10, 0.0],
                ],
            }
            store.submit_all_nowait(runsdb.kernels_ops(run, window))
        await store.flush()

        pruner = commprune.CommPruner(steps_kept=10, keep_every=5, max_rows=40)
        assert await pruner.prune_round(store) >= 2  # several bounded passes
        kept = await store.fetchall("SELECT DISTINCT step FROM comm_steps ORDER BY step")
        assert [r["step"] for r in kept] == sorted(set(range(0, 90, 5)) | set(range(90, 100)))

        merged = await kcompact.compact_once(store, 3600 * s, raw_window_s=60.0)
        assert merged > 0
        (n,) = await store.fetchall("SELECT COUNT(*) AS n FROM kernel_windows")
        assert 0 < n["n"] < 60
        (total,) = await store.fetchall(
            "SELECT CAST(SUM(total_ns) AS BIGINT) AS ns, CAST(SUM(count) AS BIGINT) AS k "
            "FROM kernel_stats WHERE name = 'gemm'"
        )
        assert (total["ns"], total["k"]) == (sum(1000 + w for w in range(60)), 120)


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///tmp/a.db", "/tmp/a.db"),
        ("sqlite:////tmp/a.db", "/tmp/a.db"),
        ("sqlite://rel/a.db", "rel/a.db"),
        ("plain/a.db", "plain/a.db"),
    ],
)
def test_sqlite_urls_name_the_file(url: str, path: str) -> None:
    assert str(parse(url).path) == path


def test_an_unknown_scheme_is_refused_without_its_password() -> None:
    from gpuprofd.core.errors import BadInputError

    with pytest.raises(BadInputError, match=r"unknown storage URL scheme 'mysql'") as err:
        parse("mysql://u:pw@h/db")
    assert "pw" not in str(err.value)


async def test_an_older_postgres_schema_is_upgraded_in_place(pg_url: str) -> None:
    async with open_store(pg_url) as store:
        run = await runsdb.insert_run(store, run_row())
        await store.write("ALTER TABLE runs DROP COLUMN store_dropped_events")
        await store.write("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    async with open_store(pg_url) as store:
        (version,) = await store.fetchall("SELECT value FROM meta WHERE key = 'schema_version'")
        row = await store.fetchone(
            "SELECT run_name, store_dropped_events FROM runs WHERE id = ?", (run,)
        )
    assert version["value"] == str(schema.SCHEMA_VERSION)
    assert (row["run_name"], row["store_dropped_events"]) == ("exp", 0)


@pytest.mark.parametrize(
    ("path", "first"),
    [
        ("gp_a", "gp_a"),
        ("gp_a, public", "gp_a"),
        ("GP_Mixed", "gp_mixed"),
        ('"GP_Mixed", public', "GP_Mixed"),
        ('"a""b"', 'a"b'),
        ('"$user", public', None),
    ],
)
def test_the_schema_tables_go_into_is_read_as_postgres_reads_it(path: str, first: str) -> None:
    from gpuprofd.storage.postgres import _first_schema

    assert _first_schema(path) == first


async def test_tables_go_into_the_first_schema_named_even_with_public_after_it(
    pg_url: str,
) -> None:
    url = pg_url + ",public"
    schema_name = pg_url.rsplit("=", 1)[1]
    async with open_store(url) as store:
        rows = await store.fetchall(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'runs'"
        )
    assert schema_name in {r["table_schema"] for r in rows}


async def test_values_of_the_wrong_type_are_a_counted_bad_row_not_a_lost_server(
    storage_url: str,
) -> None:
    """asyncpg refuses a value it cannot encode (DataError): that row is
    dropped and counted, the rest stored, and no retry as if the server were gone."""
    drops = DropCounter()
    async with open_store(storage_url, drops) as store:
        run = await runsdb.insert_run(store, run_row())
        ops = [runsdb.host_sample_op(i, 50.0, 4, None) for i in range(10)]
        ops[3] = Op(ops[3].sql, ("not a number", *ops[3].params[1:]))
        ops[5] = Op(ops[5].sql, (float("nan"), *ops[5].params[1:]))
        for op in ops:
            store.submit_nowait(op)
        await store.flush()
        (n,) = await store.fetchall("SELECT COUNT(*) AS n FROM host_samples")
        assert run == 1
    # SQLite keeps what it is given; Postgres refuses both bad values
    bad = 0 if storage_url.startswith("sqlite") else 2
    assert n["n"] == 10 - bad
    assert drops.snapshot().get("store_error", 0) == bad
    assert "store_unavailable" not in drops.snapshot()


@pytest.mark.parametrize(
    "url",
    [
        "postgres://root@127.0.0.1:5432/test?search_path=x&password=s3cret",
        "postgres://root:s3cret@127.0.0.1:5432/test?sslpassword=s3cret",
    ],
)
def test_a_password_in_the_query_is_hidden_too(url: str) -> None:
    shown = parse(url).display
    assert "s3cret" not in shown and "***" in shown and "127.0.0.1:5432" in shown


@pytest.mark.parametrize(
    "url",
    [
        "postgres://root:s3c/ret@127.0.0.1:1/test",
        "postgres://root:s3c#ret@127.0.0.1:1/test",
        "postgres://root@127.0.0.1:abc/test",
        "postgres://root@127.0.0.1:99999/test",
        "postgres://root@[::1/test",
    ],
)
def test_an_unreadable_postgres_url_is_refused_without_repeating_it(url: str) -> None:
    from gpuprofd.core.errors import BadInputError

    with pytest.raises(BadInputError, match="could not be read") as err:
        parse(url)
    assert "s3c" not in str(err.value) and "ret" not in str(err.value).replace("write", "")


async def test_a_postgres_that_stops_answering_is_a_lost_server_not_a_hang(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition (the server silent, connections open): each statement
    times out, the batch is retried then counted, and closing ends in bounded time."""

    from gpuprofd.storage import postgres

    monkeypatch.setattr(postgres, "COMMAND_TIMEOUT_S", 0.5)
    monkeypatch.setattr(postgres, "CLOSE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(store_mod, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(store_mod, "RETRY_MAX_S", 0.2)
    monkeypatch.setattr(store_mod, "RETRY_BUDGET_S", 1.0)
    monkeypatch.setattr(store_mod, "CLOSE_FLUSH_S", 1.0)
    proxy, via = await _through_proxy(pg_url)
    drops = DropCounter()
    loop = asyncio.get_running_loop()
    async with open_store(via, drops) as store:
        run = await runsdb.insert_run(store, run_row())
        proxy.flowing.clear()
        store.submit_nowait(runsdb.step_op(run, step_msg(0)))
        deadline = loop.time() + 20
        while "store_unavailable" not in drops.snapshot() and loop.time() < deadline:
            await asyncio.sleep(0.1)
        assert drops.snapshot().get("store_unavailable") == 1
        closing = loop.time()
    assert loop.time() - closing < 10  # the daemon can exit
    proxy.flowing.set()
    await proxy.cut()


async def test_loader_settings_are_stored_the_same_on_each_backend(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run = await runsdb.insert_run(store, run_row())
        first = [
            {
                "num_workers": 0,
                "persistent_workers": False,
                "pin_memory": False,
                "prefetch_factor": None,
            }
        ]
        both = [
            *first,
            {
                "num_workers": 4,
                "persistent_workers": True,
                "pin_memory": True,
                "prefetch_factor": 2,
            },
        ]
        for configs in (first, both):  # the shim sends the whole list each time
            store.submit_nowait(runsdb.loaders_op(run, {"loaders": configs}, store.dialect))
        await store.flush()
        row = await store.fetchone("SELECT options FROM runs WHERE id = ?", (run,))
        opts = orjson.loads(row["options"])
        assert opts["loaders"] == both
        assert opts["flops_per_step"] == 5e12  # the rest of the options kept


async def test_rows_as_tuples_read_the_same_on_each_backend(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        for k in range(5):
            store.submit_nowait(runsdb.run_cpu_op(1, 1000 + k, None if k == 2 else k / 4))
        await store.flush()
        sql = "SELECT mono_ns, cores FROM run_cpu_samples WHERE run_id = ? ORDER BY mono_ns"
        tuples = await store.fetchtuples(sql, (1,))
        rows = await store.fetchall(sql, (1,))
    assert [tuple(r) for r in tuples] == [tuple(r) for r in rows]
    assert [tuple(r) for r in tuples] == [
        (1000, 0.0),
        (1001, 0.25),
        (1002, None),
        (1003, 0.75),
        (1004, 1.0),
    ]
