"""Stored GPU rollups → a run's context → the GPU rules: the recorded H200
trace played through the real NVML backend, folded into per-second rollups by
the daemon's own code, stored in real SQLite and read back by the code
gpuprofctl and the daemon use."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import orjson
import pytest

from gpuprof.insights import run_rules
from gpuprof.insights.gpu import GPU_RULES, gpu_stats
from gpuprofd.sampling import rollup
from gpuprofd.sampling.nvml import RealNvml
from gpuprofd.sampling.nvml_replay import ReplayPynvml
from gpuprofd.storage import reads, schema
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.reads import queries
from tests.daemon import h200_replay
from tests.daemon import helpers as h

UUID = "GPU-69cfecb8-dd0f-d46a-a967-785474cc5ca4"


def _rollup_rows() -> list[tuple]:
    devices = RealNvml(ReplayPynvml.from_file(h200_replay.trace_path()), name="r").devices()
    r = rollup.SecondRollups(devices)
    rows: list[tuple] = []
    for ns, fast, slow in h200_replay.ticks():
        rows += r.add(ns, fast) + r.add_slow(ns, slow)
    return rows + r.flush()


def _whole_seconds(phase: str) -> tuple[int, int]:
    """The whole seconds inside *phase*, ns: rollups are per second."""
    t0, t1 = h200_replay.phases()[phase]
    return math.ceil(t0) * 10**9, math.floor(t1) * 10**9


def _db_with_phase(tmp_path: Path, phase: str, run_uuid: str) -> Path:
    """A database holding one run whose steps span the whole seconds of
    *phase*, and the trace's rollups as the daemon stores them."""
    t0, t1 = _whole_seconds(phase)
    db = tmp_path / "g.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, start_mono_ns, end_mono_ns, options, "
        "cuda_uuid) VALUES (1, 'k', 'replayed', 'finished', ?, ?, '{}', ?)",
        (t0, t1, run_uuid),
    )
    n = 20
    for i in range(n):  # steps covering the phase, back to back
        a, b = t0 + (t1 - t0) * i // n, t0 + (t1 - t0) * (i + 1) // n
        conn.execute(
            "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases) "
            "VALUES (1, ?, ?, ?, 0, 0, 1, ?)",
            (i, a, b, orjson.dumps({"forward": (b - a) // 2}).decode()),
        )
    h.insert_rollups(conn, _rollup_rows())
    conn.commit()
    conn.close()
    return db


async def _gpu_findings(db: Path) -> tuple[set[str], object]:
    async with open_reader(db) as reader:
        ctx = await reads.run_context(reader, await reads.get_run(reader, 1))
    return {i.rule for i in run_rules(ctx)} & set(GPU_RULES), ctx


#: Verdicts over each phase's whole seconds. They differ from the raw-row
#: replay (tests/gpuprof/insights/test_gpu.py) for memory_92pct only: its
#: first partial second held the 100 % busy allocation; its whole seconds are idle
#: at 0 %, a GPU the run did not use, so gpu_idle_between_steps stays silent.
WHOLE_SECOND_VERDICTS = {
    "idle": set(),
    "bf16_matmul": {"power_capping"},
    "tiny_kernels": set(),
    "h2d_copy": {"copy_bound_gpu", "pcie_saturation"},
    "d2h_copy": {"copy_bound_gpu"},
    "memory_92pct": {"memory_pressure"},
    "loader_stall": {"gpu_idle_between_steps"},
}


@pytest.mark.parametrize(("phase", "expected"), list(WHOLE_SECOND_VERDICTS.items()))
async def test_stored_samples_reach_the_gpu_rules(tmp_path: Path, phase: str, expected: set[str]):
    # torch spells the run's UUID without "GPU-": matched all the same
    fired, ctx = await _gpu_findings(_db_with_phase(tmp_path, phase, UUID[4:].upper()))
    assert ctx.gpu is not None
    assert fired == expected


async def test_a_run_on_another_gpu_gets_no_gpu_findings(tmp_path: Path):
    db = _db_with_phase(tmp_path, "h2d_copy", "GPU-00000000-0000-0000-0000-000000000000")
    fired, ctx = await _gpu_findings(db)
    assert (ctx.gpu, fired) == (None, set())


@pytest.fixture(scope="module")
def rollup_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("rollups") / "r.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    h.insert_rollups(conn, _rollup_rows())
    conn.commit()
    conn.close()
    return db


@pytest.mark.parametrize("phase", list(WHOLE_SECOND_VERDICTS))
def test_merged_rollups_equal_the_raw_samples_of_the_same_seconds(rollup_db: Path, phase: str):
    t0, t1 = _whole_seconds(phase)
    raw = []
    for ns, fast, slow in h200_replay.ticks():
        if t0 <= ns < t1:
            row = rollup.sample_row(fast[0])
            for s in slow:  # a slow reading joins its tick's row, as in the fixture
                row.update({k: v for k, v in rollup.slow_row(s).items() if v is not None})
            raw.append(row)
    from_raw = gpu_stats(raw, max_sm_mhz=1980)  # probe.json's max SM clock
    window = queries.gpu_window(UUID, [{"t0": t0, "t1": t1}])
    assert window is not None and from_raw is not None
    conn = sqlite3.connect(rollup_db)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(rollup.SELECT_SQL, window).fetchall()
        merged_by_sqlite = conn.execute(rollup.MERGED_SQL, window).fetchall()
    finally:
        conn.close()
    assert len(rows) == (t1 - t0) // 10**9
    for merged in (rows, merged_by_sqlite):  # merged in Python, and by SQLite
        stats = queries.gpu_stats_from_rollups(merged)
        assert stats is not None and stats.samples == len(raw) == 100 * len(rows)
        for name, want in vars(from_raw).items():
            got = getattr(stats, name)
            assert got == (None if want is None else pytest.approx(want, rel=1e-9)), name


def _schema_1_db_with_raw_rows(tmp_path: Path, phase: str) -> tuple[Path, int]:
    """A schema-1 database (10 Hz raw rows, no reasons, no slow loop) with one
    run over *phase*; returns it and its raw row count."""
    from tests.daemon.storage.test_schema import SCHEMA_1

    t0, t1 = _whole_seconds(phase)
    db = tmp_path / "v1.db"
    conn = sqlite3.connect(db)
    conn.executescript(SCHEMA_1.split("INSERT INTO")[0])
    conn.execute("INSERT INTO meta VALUES ('app', 'gpuprof'), ('schema_version', '1')")
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, start_mono_ns, end_mono_ns, options, "
        "cuda_uuid) VALUES (1, 'k', 'old', 'finished', ?, ?, '{}', ?)",
        (t0, t1, UUID),
    )
    conn.execute(
        "INSERT INTO steps VALUES (1, 0, ?, ?, 0, 0, 1, ?)",
        (t0, t1, orjson.dumps({"forward": t1 - t0}).decode()),
    )
    n = 0
    for i, (ns, fast, _) in enumerate(h200_replay.ticks()):
        if i % 10 == 0:  # what an old daemon stored: 10 Hz
            s = fast[0]
            conn.execute(
                "INSERT INTO gpu_samples VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?)",
                (
                    ns,
                    s.uuid,
                    s.util_pct,
                    s.mem_used_bytes,
                    s.mem_total_bytes,
                    s.power_mw,
                    s.temp_c,
                    s.sm_clock_mhz,
                ),
            )
            n += 1
    conn.commit()
    conn.close()
    return db, n


async def test_an_old_database_reads_its_raw_samples_as_rollups_both_ways(tmp_path: Path):
    db, n_raw = _schema_1_db_with_raw_rows(tmp_path, "memory_92pct")
    before = db.read_bytes()
    read_only, ctx = await _gpu_findings(db)  # gpuprofctl: TEMP views, the file untouched
    assert db.read_bytes() == before
    assert read_only == {"memory_pressure"}
    assert ctx.gpu is not None and ctx.gpu.mem_used_fraction == pytest.approx(0.92, abs=0.01)
    schema.prepare(db)  # the daemon: raw rows merged into one rollup a second, once
    schema.prepare(db)
    conn = sqlite3.connect(db)
    try:
        rollups, samples = conn.execute("SELECT COUNT(*), SUM(n) FROM gpu_rollups").fetchone()
        (seconds,) = conn.execute(
            "SELECT COUNT(DISTINCT mono_ns - mono_ns % 1000000000) FROM gpu_samples"
        ).fetchone()
    finally:
        conn.close()
    assert (rollups, samples) == (seconds, n_raw) and seconds < n_raw
    upgraded, ctx2 = await _gpu_findings(db)
    assert upgraded == read_only
    assert ctx2.gpu == ctx.gpu


async def test_gpuprofctl_reads_the_runs_own_cpu_like_the_daemon(tmp_path: Path):
    db = _db_with_phase(tmp_path, "idle", UUID)
    conn = sqlite3.connect(db)
    conn.executemany(
        "INSERT INTO run_cpu_samples (run_id, mono_ns, cores) VALUES (?, ?, ?)",
        [(1, 1, 2.0), (1, 2, 4.0), (1, 3, None), (2, 4, 50.0)],  # run 2's is not ours
    )
    conn.commit()
    conn.close()
    _, ctx = await _gpu_findings(db)
    assert ctx.run_cpu_cores == 3.0
    (tmp_path / "none").mkdir()
    _, without = await _gpu_findings(_db_with_phase(tmp_path / "none", "idle", UUID))
    assert without.run_cpu_cores is None


async def test_a_run_after_a_reboot_reads_only_its_own_boots_samples(tmp_path: Path):
    """Monotonic time restarts at boot: the same uptime in two boots is two
    different moments, and each run reads its own boot's rollups and host rows."""
    db = _db_with_phase(tmp_path, "memory_92pct", UUID)  # run 1, boot NULL: 92 % full
    t0, t1 = _whole_seconds("memory_92pct")
    names = list(rollup.ROLLUP_COLUMNS)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET boot_id = 'boot-1'")
    conn.execute("UPDATE gpus SET boot_id = 'boot-1'")
    later = []  # boot 2, same uptime: the GPU one fifth full
    for row in _rollup_rows():
        r = dict(zip(names, row, strict=True))
        r["boot_id"] = "boot-2"
        for k in ("mem_used_min", "mem_used_mean", "mem_used_max"):
            r[k] = None if r[k] is None else r["mem_total_bytes"] // 5
        later.append(tuple(r[c] for c in names))
    h.insert_rollups(conn, later)
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, start_mono_ns, end_mono_ns, options, "
        "cuda_uuid, boot_id) VALUES (2, 'k2', 'after-reboot', 'finished', ?, ?, '{}', ?, "
        "'boot-2')",
        (t0, t1, UUID),
    )
    conn.execute(
        "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases) "
        "VALUES (2, 0, ?, ?, 0, 0, 1, '{}')",
        (t0, t1),
    )
    conn.executemany(
        "INSERT INTO host_samples (mono_ns, cpu_pct, cpu_count, disk_read_bps, boot_id) "
        "VALUES (?, ?, 8, 0, ?)",
        [(t0 + 10**8, 90.0, "boot-1"), (t0 + 10**8, 10.0, "boot-2")],
    )
    conn.commit()
    conn.close()
    async with open_reader(db) as ro:
        before = await reads.run_context(ro, await reads.get_run(ro, 1))
        after = await reads.run_context(ro, await reads.get_run(ro, 2))
    assert before.gpu is not None and after.gpu is not None
    assert before.gpu.mem_used_fraction == pytest.approx(0.92, abs=0.01)
    assert after.gpu.mem_used_fraction == pytest.approx(0.2, abs=0.001)
    assert (before.host_cpu_pct, after.host_cpu_pct) == (90.0, 10.0)
    assert "memory_pressure" not in {i.rule for i in run_rules(after)}


async def test_the_pcie_chart_shows_the_peak_its_finding_reads(tmp_path: Path):
    """The raw tier (a zoomed chart) of the h2d_copy phase: the fast loop stored
    at 10 Hz, the slow loop at 1 Hz. Every slow reading reaches a bucket, and
    the chart's peak is the one pcie_saturation reports."""
    SLOW_OFFSET_NS = 37_000_000
    from gpuprofd.sampling.nvml import normalize_uuid
    from gpuprofd.storage.reads import series
    from gpuprofd.storage.writes.runsdb import gpu_sample_op, gpu_slow_sample_op

    db = _db_with_phase(tmp_path, "h2d_copy", UUID)
    t0, t1 = _whole_seconds("h2d_copy")
    conn = sqlite3.connect(db)
    slow_n = 0
    for i, (ns, fast, slow) in enumerate(h200_replay.ticks()):
        if not t0 <= ns < t1:
            continue
        # the slow loop runs on its own thread: its readings fall between stored fast ones
        ops = ([gpu_sample_op(ns, s) for s in fast] if i % 10 == 0 else []) + [
            gpu_slow_sample_op(ns + SLOW_OFFSET_NS, s) for s in slow
        ]
        slow_n += len(slow)
        for op in ops:
            conn.execute(op.sql, op.params)
    conn.commit()
    conn.close()
    assert slow_n >= 3
    fired, ctx = await _gpu_findings(db)
    assert "pcie_saturation" in fired
    width = (t1 - t0) // 400  # 400 buckets: far narrower than the slow loop's second
    async with open_reader(db) as reader:
        rows = await series.gpu_raw_buckets(reader, normalize_uuid(UUID), t0, t1, width)
    rx = [r["pcie_rx_max_bps"] for r in rows if r["pcie_rx_max_bps"] is not None]
    assert len(rx) == slow_n  # each reading in a bucket of its own
    assert max(rx) == pytest.approx(ctx.gpu.pcie_rx_max_bytes_per_s, rel=1e-6)
    assert all(r["util_mean"] is not None for r in rows)  # only fast buckets: no gaps added


def test_the_columns_the_merge_leaves_out_are_not_read_by_the_stats(rollup_db: Path):
    """MERGED_SQL leaves rollup.STATS_UNREAD NULL: GpuStats from each second
    is the same with those columns as stored, NULL, or changed."""
    conn = sqlite3.connect(rollup_db)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM gpu_rollups ORDER BY sec_ns")]
    finally:
        conn.close()
    assert rows and rollup.STATS_UNREAD < set(rows[0])
    changed = 0
    for row in rows:
        want = rollup.accumulator_from_row(row).stats()
        for other in (None, 12345.0):
            got = rollup.accumulator_from_row({**row, **dict.fromkeys(rollup.STATS_UNREAD, other)})
            assert got.stats() == want
        changed += want is not None
    assert changed > 10
