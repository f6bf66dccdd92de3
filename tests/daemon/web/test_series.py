"""The pure parts of the series: clocks, bucket geometry, merging step
rollups and host buckets, which blocks a pass rolls; a database from before
the rollups."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuprofd.storage import schema
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.upkeep import hostrollup
from gpuprofd.storage.upkeep.steprollup import MAX_BLOCKS_PER_PASS, STEP_BLOCK, blocks_to_roll
from gpuprofd.web.api import host_buckets, step_buckets
from gpuprofd.web.series import (
    CHART_PHASES,
    T_HALF_ULP_NS,
    Buckets,
    RunClock,
    host_series,
    merge_host_buckets,
    merge_step_rollups,
    steps_series,
)

CLOCK = RunClock(wall_ns=1_796_000_000_123_456_789, mono_ns=5_000_000_000)


def test_clock_converts_both_ways() -> None:
    assert CLOCK.to_s(5_000_000_000) == pytest.approx(1_796_000_000.123456789)
    assert CLOCK.to_s(6_500_000_000) == pytest.approx(1_796_000_001.623456789)
    mono = 7_123_400_000
    assert abs(CLOCK.to_mono(CLOCK.to_s(mono)) - mono) < 1000  # float seconds: < 1 µs off
    # a time rounded to the wire's 0.1 ms is covered by the half-digit margin
    assert abs(CLOCK.to_mono(round(CLOCK.to_s(mono), 4)) - mono) <= T_HALF_ULP_NS


def test_two_buckets_per_pixel_cover_the_window() -> None:
    b = Buckets.for_width(0, 86_400 * 10**9, 1000)
    assert (b.count, b.width_ns) == (2000, 43_200_000_000)
    assert b.count * b.width_ns >= b.hi_ns - b.lo_ns
    tiny = Buckets.for_width(100, 100, 10)  # an empty window still has a width
    assert tiny.width_ns == 1 and tiny.hi_ns == 101


def _block(t0: int, first: int, n: int, lo: int, hi: int, mean: float) -> dict:
    return {
        "t0_ns": t0,
        "first_step": first,
        "n": n,
        "iter_min_ns": lo,
        "iter_max_ns": hi,
        "iter_sum_ns": mean * n,
        **{f"{p}_sum_ns": mean * n / len(CHART_PHASES) for p in CHART_PHASES},
        "eval_n": 1,
        "skipped_n": 0,
        "mem_alloc_max": None,
        "mem_reserved_max": 7,
    }


def test_merging_rollups_keeps_extremes_and_weights_means() -> None:
    b = Buckets(lo_ns=0, hi_ns=2000, count=2, width_ns=1000)
    rows = [
        _block(0, 0, 100, 10, 20, 15.0),
        _block(500, 100, 300, 9, 900, 11.0),  # same bucket: a slow step in it
        _block(1500, 400, 100, 12, 13, 12.5),
    ]
    merged = merge_step_rollups(rows, b)
    assert [m["n"] for m in merged] == [400, 100]
    first = merged[0]
    assert (first["iter_min"], first["iter_max"]) == (9, 900)
    assert first["iter_mean"] == pytest.approx((15.0 * 100 + 11.0 * 300) / 400)
    assert first["eval_n"] == 2 and first["mem_reserved"] == 7 and first["mem_alloc"] is None
    out = steps_series(merged, RunClock(0, 0))
    assert out["first_step"] == [0, 400] and out["step_ms"]["max"][0] == pytest.approx(0.0009)
    stacked = sum(out["phases_ms"][p][0] for p in CHART_PHASES)
    assert stacked == pytest.approx(out["step_ms"]["mean"][0])


@pytest.mark.parametrize(
    ("status", "rolled", "top", "want"),
    [
        ("running", None, None, None),
        ("running", None, STEP_BLOCK - 1, None),  # the first block still filling
        ("running", None, STEP_BLOCK, (0, 1)),
        ("running", 4, 5 * STEP_BLOCK + 10, None),  # block 5 not complete
        ("finished", 4, 5 * STEP_BLOCK + 10, (5, 6)),  # ended: its partial block too
        ("finished", 5, 5 * STEP_BLOCK + 10, None),
        ("lost", None, 10**9, (0, MAX_BLOCKS_PER_PASS)),  # bounded per pass
    ],
)
def test_blocks_a_pass_rolls(
    status: str, rolled: int | None, top: int | None, want: tuple[int, int] | None
) -> None:
    assert blocks_to_roll(status, rolled, top) == want


async def test_a_database_from_before_the_tier_reads_its_steps_raw(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE step_rollups")  # as schema 8 had it
    conn.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status) VALUES (1, 'k', 'r', 'finished')"
    )
    conn.executemany(
        "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns) VALUES (1, ?, ?, ?, 0)",
        [(i, i * 1000, i * 1000 + 900) for i in range(50)],
    )
    conn.commit()
    conn.close()
    async with open_reader(db) as reader:
        rows, tier = await step_buckets(reader, 1, Buckets.for_width(0, 50_000, 10))
    assert tier == "raw" and sum(r["n"] for r in rows) == 50


B = hostrollup.HOST_BLOCK_NS


@pytest.mark.parametrize(
    ("status", "start", "end", "newest", "rolled", "want"),
    [
        ("running", None, None, 50 * B, None, None),  # no start: nothing to place blocks in
        ("running", 10 * B, None, None, None, None),  # no host samples of its boot
        ("running", 10 * B + 1, None, 12 * B, None, (11, 12)),  # whole blocks inside the run
        ("running", 10 * B, None, 12 * B - 1, None, (10, 11)),  # block 11 not complete
        ("running", 10 * B, None, 12 * B, 11, None),
        ("finished", 10 * B, 13 * B + 5, 99 * B, 10, (11, 13)),  # not its partial last block
        ("finished", 10 * B, 13 * B, 12 * B + 3, 10, (11, 12)),  # samples still to come
        ("lost", 0, None, 10**6 * B, None, (0, hostrollup.MAX_BLOCKS_PER_PASS)),  # bounded
    ],
)
def test_host_blocks_a_pass_rolls(
    status: str,
    start: int | None,
    end: int | None,
    newest: int | None,
    rolled: int | None,
    want: tuple[int, int] | None,
) -> None:
    assert hostrollup.blocks_to_roll(status, start, end, newest, rolled) == want


def _host(b: int, t: int, n: int, lo: float, hi: float, total: float, k: int | None = None) -> dict:
    row = {"b": b, "t": t, "n": n, "cpu_count": 8}
    for m in ("run_cores", "other_cores", "disk_read_bps", "page_cache_bytes"):
        row.update(
            {f"{m}_min": lo, f"{m}_max": hi, f"{m}_sum": total, f"{m}_n": n if k is None else k}
        )
    return row


def test_merging_host_buckets_keeps_extremes_and_exact_means() -> None:
    rollups = [_host(0, 100, 20, 1.0, 2.0, 30.0), _host(1, 300, 20, 1.0, 1.0, 20.0)]
    head = [_host(0, 50, 4, 0.5, 1.0, 3.0)]  # samples before the first block
    tail = [_host(2, 500, 2, 7.0, 9.0, 16.0), _host(1, 390, 1, None, None, 0.0, 0)]  # nulls
    merged = merge_host_buckets(head, rollups, tail)
    assert [(m["b"], m["t"], m["n"]) for m in merged] == [(0, 50, 24), (1, 300, 21), (2, 500, 2)]
    out = host_series(merged, RunClock(0, 0))
    assert out["run_cores"]["min"] == [0.5, 1.0, 7.0]
    assert out["run_cores"]["max"] == [2.0, 1.0, 9.0]
    assert out["run_cores"]["mean"] == pytest.approx([33.0 / 24, 1.0, 8.0])  # by samples
    empty = host_series([_host(0, 0, 3, None, None, 0.0, 0)], RunClock(0, 0))
    assert empty["disk_read_bps"] == {"min": [None], "mean": [None], "max": [None]}


async def test_a_database_from_before_the_host_tier_reads_its_samples(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE host_rollups")  # as schema 14 had it
    conn.execute("UPDATE meta SET value = '14' WHERE key = 'schema_version'")
    conn.executemany(
        "INSERT INTO host_samples (mono_ns, cpu_pct, cpu_count) VALUES (?, 50.0, 2)",
        [(k * B // 4,) for k in range(400)],
    )
    conn.commit()
    conn.close()
    run = {"id": 1, "boot_id": None}
    async with open_reader(db) as reader:
        rows, tier = await host_buckets(reader, run, Buckets.for_width(0, 100 * B, 10))
    assert tier == "raw" and sum(r["n"] for r in rows) == 400


def test_a_slow_reading_joins_the_fast_bucket_nearest_it() -> None:
    from gpuprofd.storage.reads.series import join_slow_buckets

    fast = [{"b": b, "util_mean": 50.0} for b in (0, 3, 6, 9)]
    slow = [
        {"b": 1, "pcie_rx_max_bps": 10.0, "gpm_tensor_util_mean": 20.0},
        {"b": 5, "pcie_rx_max_bps": 30.0, "gpm_tensor_util_mean": None},
        {"b": 8, "pcie_rx_max_bps": 40.0, "gpm_tensor_util_mean": 60.0},
        {"b": 100, "pcie_rx_max_bps": 5.0, "gpm_tensor_util_mean": 80.0},  # past the last
    ]
    rows = join_slow_buckets(fast, slow)
    assert [r["b"] for r in rows] == [0, 3, 6, 9]
    assert [r["pcie_rx_max_bps"] for r in rows] == [10.0, None, 30.0, 40.0]
    # two readings in one bucket: the peak stays, the ratios average
    assert [r["gpm_tensor_util_mean"] for r in rows] == [20.0, None, None, 70.0]
    assert rows[1]["pcie_tx_max_bps"] is None and rows[1]["util_mean"] == 50.0
    assert join_slow_buckets([], slow) == []
