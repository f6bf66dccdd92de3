"""Schema versions: a database written by schema 1 is upgraded in place by
the daemon and read as it is (read-only) by gpuprofctl."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import reads, schema
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.reads import samplerows

#: Schema 1 exactly as gpuprof 0.1 (the spine, commit 8c3194b) wrote it, plus rows.
#: The tables schema 22 replaced, as schema 21 (and before) wrote them: one
#: wide GPU rollup row per second with its UUID and boot, one row per bucket.
SCHEMA_21_TABLES = """
CREATE TABLE IF NOT EXISTS gpu_rollups (  -- one row per GPU per second, the whole run
    sec_ns INTEGER, uuid TEXT, n INTEGER,     -- n: fast samples with a utilization reading
    util_min REAL, util_mean REAL, util_max REAL, idle_n INTEGER,
    mem_used_min INTEGER, mem_used_mean REAL, mem_used_max INTEGER, mem_total_bytes INTEGER,
    power_min_mw REAL, power_mean_mw REAL, power_max_mw REAL,
    temp_min_c REAL, temp_mean_c REAL, temp_max_c REAL,
    sm_min_mhz REAL, sm_mean_mhz REAL, sm_max_mhz REAL, sm_active_max_mhz REAL,
    sm_limit_mhz REAL,                        -- the GPU's max SM clock (NVML), MHz
    mem_util_mean REAL,
    reasons_n INTEGER, reasons_any INTEGER,
    capped_n INTEGER, capped_sm_mean_mhz REAL, thermal_n INTEGER, thermal_sm_mean_mhz REAL,
    slow_n INTEGER,                           -- slow-loop samples folded in (<= 1 Hz)
    pcie_rx_max_bps REAL, pcie_tx_max_bps REAL,
    gpm_sm_util_mean REAL, gpm_sm_occupancy_mean REAL, gpm_tensor_util_mean REAL,
    gpm_dram_bw_util_mean REAL,
    boot_id TEXT
);  -- uuid: normalized (sampling.nvml.normalize_uuid): a run's UUID finds its rows by index
CREATE INDEX IF NOT EXISTS gpu_rollups_uuid_t ON gpu_rollups (uuid, sec_ns);
CREATE TABLE IF NOT EXISTS comm_buckets (  -- one DDP gradient bucket's all-reduce in one step;
    -- pruned to each run's last COMM_STEPS_KEPT steps + every COMM_KEEP_EVERY-th (module doc)
    run_id INTEGER NOT NULL, step INTEGER NOT NULL,  -- step: the steps row's step index
    bucket INTEGER,                  -- DDP's bucket index (GradBucket.index())
    start_ns INTEGER, end_ns INTEGER,  -- launched / completed, the rank's monotonic ns
    bytes INTEGER                    -- the bucket's flattened gradients
);
CREATE INDEX IF NOT EXISTS comm_buckets_run_step ON comm_buckets (run_id, step);
"""


def as_schema_21(conn: sqlite3.Connection) -> None:
    """Today's tables in *conn* as schema 21 had them (empty); the version is the caller's."""
    conn.executescript(
        "DROP VIEW gpu_rollups; DROP TABLE gpu_seconds; DROP TABLE gpus; DROP TABLE comm_steps;"
        + SCHEMA_21_TABLES
    )


SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    run_key TEXT UNIQUE NOT NULL,
    run_name TEXT NOT NULL,
    status TEXT NOT NULL,            -- running | finished | failed | lost
    host TEXT, pid INTEGER, pid_ns TEXT, rank INTEGER, local_rank INTEGER, world_size INTEGER,
    auto INTEGER,
    start_wall_ns INTEGER, start_mono_ns INTEGER,
    end_wall_ns INTEGER, end_mono_ns INTEGER,
    options TEXT,                    -- json
    cuda_uuid TEXT, gpu_model TEXT, gpu_count INTEGER, cpu_count INTEGER,
    dropped_events INTEGER DEFAULT 0,  -- dropped inside the training process
    received_events INTEGER DEFAULT 0,
    sent_events INTEGER,
    error TEXT,
    median_step_ms REAL,
    summary TEXT                     -- json, set when the run ends
);
CREATE INDEX IF NOT EXISTS runs_name ON runs (run_name, id);
CREATE TABLE IF NOT EXISTS steps (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL,
    t0_ns INTEGER, t1_ns INTEGER, wait_ns INTEGER,
    explicit INTEGER, micro INTEGER,
    phases TEXT                      -- json: phase name -> ns
);
CREATE INDEX IF NOT EXISTS steps_run_t0 ON steps (run_id, t0_ns);
CREATE TABLE IF NOT EXISTS insights (
    run_id INTEGER NOT NULL, rule TEXT, severity TEXT, title TEXT, detail TEXT,
    fix TEXT, evidence TEXT, created_wall_ns INTEGER
);
CREATE INDEX IF NOT EXISTS insights_run ON insights (run_id);
CREATE TABLE IF NOT EXISTS host_samples (
    mono_ns INTEGER, cpu_pct REAL, cpu_count INTEGER, disk_read_bps REAL
);
CREATE INDEX IF NOT EXISTS host_samples_t ON host_samples (mono_ns);
CREATE TABLE IF NOT EXISTS run_cpu_samples (run_id INTEGER, mono_ns INTEGER, cores REAL);
CREATE INDEX IF NOT EXISTS run_cpu_samples_run ON run_cpu_samples (run_id, mono_ns);
CREATE TABLE IF NOT EXISTS gpu_samples (
    mono_ns INTEGER, gpu_index INTEGER, uuid TEXT, util_pct REAL,
    mem_used_bytes INTEGER, mem_total_bytes INTEGER, power_mw INTEGER,
    temp_c INTEGER, sm_clock_mhz INTEGER
);
CREATE INDEX IF NOT EXISTS gpu_samples_t ON gpu_samples (mono_ns);
CREATE TABLE IF NOT EXISTS drops (reason TEXT PRIMARY KEY, count INTEGER);
INSERT INTO meta VALUES ('app', 'gpuprof'), ('schema_version', '1');
INSERT INTO runs (id, run_key, run_name, status, start_mono_ns, end_mono_ns, options)
    VALUES (1, 'k', 'old', 'finished', 0, 100000000, '{}');
INSERT INTO steps VALUES (1, 0, 1000, 11000000, 0, 0, 1, '{"forward": 5000000}');
INSERT INTO host_samples VALUES (5000000, 40.0, 8, 2000000.0);
"""
#: host_samples columns added in schema 3, NULL for rows written before.
HOST_3 = ("disk_read_iops", "page_cache_bytes", "mem_total_bytes", "swap_in_bps")


def _old_db(tmp_path: Path) -> Path:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_1)
    conn.close()
    return path


async def test_gpuprofctl_reads_a_schema_1_database_without_changing_it(tmp_path: Path) -> None:
    path = _old_db(tmp_path)
    before = path.read_bytes()
    async with open_reader(path) as reader:
        steps = (await reads.run_context(reader, await reads.get_run(reader, 1))).step_ms
    assert steps == ((11_000_000 - 1000) / 1e6,)
    assert path.read_bytes() == before


def test_the_daemon_upgrades_schema_1_in_place_and_keeps_the_rows(tmp_path: Path) -> None:
    path = _old_db(tmp_path)
    schema.prepare(path)
    schema.prepare(path)  # idempotent
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        row = conn.execute("SELECT micro, skipped, eval_ns, optimizers FROM steps").fetchone()
        trailing = conn.execute("SELECT trailing_eval_ns FROM runs").fetchone()
    finally:
        conn.close()
    assert version == (str(schema.SCHEMA_VERSION),)
    assert row == (1, 0, 0, None)
    assert trailing == (0,)


def test_a_newer_schema_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = _old_db(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseError, match="newer gpuprof"):
        schema.prepare(path)


async def test_old_host_samples_read_as_not_available_both_ways(tmp_path: Path) -> None:
    path = _old_db(tmp_path)
    async with open_reader(path) as reader:  # read-only: a TEMP view adds the columns
        run = await reads.get_run(reader, 1)
        ctx = await reads.run_context(reader, run)
        got = await samplerows.read(reader, samplerows.HOST, None, 0, 10**9)
        ro = dict(zip(got.names, got.rows()[0], strict=True))
    assert ctx.host_disk_read_bps == 2_000_000.0
    assert (ro["disk_read_bps"], *(ro[c] for c in HOST_3)) == (2_000_000.0, None, None, None, None)
    schema.prepare(path)  # the daemon's upgrade: the columns are added, NULL
    conn = sqlite3.connect(path)
    try:
        upgraded = conn.execute(f"SELECT {', '.join(HOST_3)} FROM host_samples").fetchone()
    finally:
        conn.close()
    assert upgraded == (None, None, None, None)


def test_upgraded_and_new_databases_have_the_same_columns(tmp_path: Path) -> None:
    old, new = _old_db(tmp_path), tmp_path / "new.db"
    schema.prepare(old)
    schema.prepare(new)

    def columns(path: Path) -> dict[str, list[str]]:
        conn = sqlite3.connect(path)
        try:
            sql = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            tables = [r[0] for r in conn.execute(sql)]
            info = {t: conn.execute(f"PRAGMA table_info({t})").fetchall() for t in tables}
            return {t: sorted(r[1] for r in rows) for t, rows in info.items()}
        finally:
            conn.close()

    assert columns(old) == columns(new)
    assert set(HOST_3) <= set(columns(new)["host_samples"])


async def test_an_old_database_has_no_groups_and_its_runs_no_group(tmp_path: Path) -> None:
    path = _old_db(tmp_path)
    before = path.read_bytes()
    async with open_reader(path) as reader:
        assert await reads.runs_overview(reader, "any") == []
        assert (await reads.group_context(reader, "any")).ranks == ()
        (run,) = await reads.runs_overview(reader)
    assert run["group_id"] is None and run["local_world_size"] is None
    assert path.read_bytes() == before


def _schema_5_db(tmp_path: Path) -> Path:
    """A schema-5 database (gpuprof before comm timing) with a 2-rank group:
    today's schema less what schema 6 added."""
    path = tmp_path / "v5.db"
    schema.prepare(path)
    conn = sqlite3.connect(path)
    as_schema_21(conn)
    conn.execute("DROP TABLE comm_buckets")
    for column in schema._RUNS_6:
        conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    for rank in (0, 1):
        conn.execute(
            "INSERT INTO runs (id, run_key, run_name, status, host, rank, local_rank, world_size,"
            " start_mono_ns, end_mono_ns, options, group_id, local_world_size) "
            "VALUES (?, ?, 'ddp', 'finished', 'h', ?, ?, 2, 0, 10000000000, '{}', 'job', 2)",
            (rank + 1, f"k{rank}", rank, rank),
        )
        for i in range(10):
            phases = '{"forward": 3000000, "backward": 5000000}'
            conn.execute(
                "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases)"
                " VALUES (?, ?, ?, ?, 0, 0, 1, ?)",
                (rank + 1, i, i * 10_000_000, i * 10_000_000 + 9_000_000, phases),
            )
    conn.commit()
    conn.close()
    return path


async def test_a_schema_5_database_reads_with_no_comm_data(tmp_path: Path) -> None:
    path = _schema_5_db(tmp_path)
    before = path.read_bytes()
    async with open_reader(path) as reader:
        ctx = await reads.group_context(reader, "job")
        runs = await reads.runs_overview(reader, "job")
        run_ctx = await reads.run_context(reader, await reads.get_run(reader, 1))
        assert (await reader.fetchone("SELECT COUNT(*) FROM comm_steps"))[0] == 0
    assert [r.rank for r in ctx.ranks] == [0, 1]
    assert all(
        len(r.step_ms) == 10 and r.comm_ms == () and r.bucket_start_ns == () for r in ctx.ranks
    )
    assert all(r["clock_offset_ns"] is None and r["agg"]["comm_steps"] == 0 for r in runs)
    assert reads.missing_ranks(runs) == []
    assert run_ctx.comm is None
    assert path.read_bytes() == before


def test_the_daemon_upgrades_schema_5_to_comm_timing(tmp_path: Path) -> None:
    path, new = _schema_5_db(tmp_path), tmp_path / "new.db"
    schema.prepare(path)
    schema.prepare(new)
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        clock = conn.execute(f"SELECT {', '.join(schema._RUNS_6)} FROM runs").fetchall()
        table = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'comm_steps'").fetchone()
    finally:
        conn.close()
    assert version == (str(schema.SCHEMA_VERSION),) and clock == [(None,) * 5] * 2
    assert "PRIMARY KEY (run_id, step, start_ns)" in table[0]


def _schema_6_db(tmp_path: Path) -> Path:
    """A schema-6 database (comm timing, before stored group findings): the
    schema-5 group with bucket rows; today's schema less what schema 7 added."""
    path = _schema_5_db(tmp_path)
    schema.prepare(path)  # to today's, then back to 6
    conn = sqlite3.connect(path)
    as_schema_21(conn)
    conn.execute("DROP TABLE group_insights")
    conn.execute("DROP INDEX steps_run_step")
    conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    conn.executemany(
        "INSERT INTO comm_buckets VALUES (?, ?, 0, ?, ?, 1000)",
        [
            (run, i, i * 10_000_000 + 8_000_000, i * 10_000_000 + 8_500_000)
            for run in (1, 2)
            for i in range(10)
        ],
    )
    conn.commit()
    conn.close()
    return path


async def test_a_schema_6_database_reads_with_no_stored_group_findings(tmp_path: Path) -> None:
    path = _schema_6_db(tmp_path)
    before = path.read_bytes()
    async with open_reader(path) as reader:
        assert await reads.stored_group_insights(reader, "job") is None
        found = await reads.group_findings(reader, "job")
        ctx = await reads.group_context(reader, "job")
    assert (found["ranks"], found["ended"]) == (2, True)
    assert all(len(r.step_ms) == 10 and len(r.bucket_start_ns) == 10 for r in ctx.ranks)
    assert path.read_bytes() == before


async def test_the_daemon_upgrades_schema_6_to_stored_group_findings(tmp_path: Path) -> None:
    path, new = _schema_6_db(tmp_path), tmp_path / "new.db"
    schema.prepare(path)
    schema.prepare(new)
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        n = conn.execute("SELECT SUM(buckets) FROM comm_steps").fetchone()[0]
    finally:
        conn.close()
    assert version == (str(schema.SCHEMA_VERSION),) and n == 20
    assert {"group_insights", "group_insights_group", "steps_run_step"} <= names
    async with open_reader(path) as reader:
        assert await reads.stored_group_insights(reader, "job") is None
