"""gpuprofd.storage.upkeep.kcompact: the pure merge of continuous kernel windows, the plan of
what to merge, the atomic store op, and kernel_drift across a compaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprof.insights.base import RunContext
from gpuprof.insights.kernels import kernel_drift, kernel_stats
from gpuprof.kernels import OTHER_ROW_NAME, KernelAgg
from gpuprofd.core.counters import DropCounter
from gpuprofd.storage import schema
from gpuprofd.storage.reads import queries
from gpuprofd.storage.upkeep import kcompact
from gpuprofd.storage.upkeep.kcompact import (
    StoredWindow,
    merge_rows,
    merge_steps,
    merge_windows,
    plan,
)
from gpuprofd.storage.writes import AtomicCheckError, Part, Store, runsdb
from tests.daemon.helpers import query

S = 1_000_000_000
MS = 1_000_000


def _agg(
    name: str,
    total_ns: int,
    count: int = 1,
    flops: float | None = None,
    kind: str = "kernel",
    cls: str = "compute",
) -> KernelAgg:
    return KernelAgg(name, kind, cls, count, total_ns, total_ns, flops)


# --- the pure merge ---------------------------------------------------------------------------


def test_merge_rows_sums_per_name_kind_and_class() -> None:
    rows = [
        _agg("gemm", 10, 2),
        _agg("gemm", 5, 1),
        _agg("gemm", 7, 1, kind="op"),
        _agg("nccl", 3, 1, cls="comm"),
        _agg("nccl", 4, 2, cls="comm"),
    ]
    merged, cut = merge_rows(rows)
    assert cut == 0
    got = {(r.name, r.kind): (r.count, r.total_ns, r.self_ns, r.cls) for r in merged}
    assert got == {
        ("gemm", "kernel"): (3, 15, 15, "compute"),
        ("gemm", "op"): (1, 7, 7, "compute"),
        ("nccl", "kernel"): (3, 7, 7, "comm"),
    }
    assert [r.name for r in merged] == ["gemm", "nccl", "gemm"]  # most device time first


def test_merge_rows_flops_stay_none_only_when_all_were() -> None:
    both_none, _ = merge_rows([_agg("a", 1, kind="op"), _agg("a", 1, kind="op")])
    some, _ = merge_rows([_agg("a", 1, flops=None, kind="op"), _agg("a", 1, flops=2e9, kind="op")])
    added, _ = merge_rows([_agg("a", 1, flops=1e9, kind="op"), _agg("a", 1, flops=2e9, kind="op")])
    assert both_none[0].flops is None
    assert some[0].flops == 2e9
    assert added[0].flops == 3e9


def test_merge_rows_caps_rows_with_other_and_keeps_every_ns() -> None:
    rows = [_agg(f"k{i}", 1000 + i, 1) for i in range(300)]
    merged, cut = merge_rows(rows, max_rows=256)
    assert len(merged) == 256 and cut == 45
    assert merged[-1].name == OTHER_ROW_NAME and merged[-1].count == 45
    assert sum(r.total_ns for r in merged) == sum(r.total_ns for r in rows)
    assert sum(r.count for r in merged) == 300


def test_merge_steps_lists_the_union_then_a_counted_range() -> None:
    assert merge_steps([[3, 1], [2], [], None]) == [1, 2, 3]
    big = merge_steps([list(range(kcompact.STEPS_LIST_MAX)), [kcompact.STEPS_LIST_MAX + 5]])
    assert big == {
        "n": kcompact.STEPS_LIST_MAX + 1,
        "first": 0,
        "last": kcompact.STEPS_LIST_MAX + 5,
    }
    assert merge_steps([big, [20_000, 20_001]]) == {
        "n": kcompact.STEPS_LIST_MAX + 3,
        "first": 0,
        "last": 20_001,
    }
    assert kcompact.step_count(big) == kcompact.STEPS_LIST_MAX + 1
    assert kcompact.step_count([4, 5]) == 2


def test_merge_windows_spans_first_t0_to_last_t1_and_adds_drops() -> None:
    parts = [StoredWindow(7, 1, 100, 150, [1], 2), StoredWindow(9, 1, 200, 260, [2], 0)]
    rows = {7: [_agg("gemm", 10)], 9: [_agg("gemm", 20), _agg("copy", 1, cls="memcpy")]}
    window, merged = merge_windows(parts, rows)
    assert window == {
        "t0": 100,
        "t1": 260,
        "source": "continuous",
        "steps": [1, 2],
        "rows_dropped": 2,
    }
    assert [(r.name, r.total_ns) for r in merged] == [("gemm", 30), ("copy", 1)]


def test_reader_counts_steps_of_a_range_form_window() -> None:
    windows = [
        (1, 0, 10, "continuous", orjson.dumps({"n": 12_000, "first": 0, "last": 11_999}), 0),
        (2, 10, 20, "continuous", orjson.dumps([5, 6]), 0),
    ]
    (w1, _), (w2, _) = queries.kernel_windows_from_rows(windows, [])
    assert (w1["steps"], w1["n_steps"]) == ([], 12_000)
    assert (w2["steps"], w2["n_steps"]) == ([5, 6], 2)


# --- the plan ------------------------------------------------------------------------------------


def _w(wid: int, run: int, t0_s: float, dur_s: float = 0.5) -> StoredWindow:
    return StoredWindow(wid, run, int(t0_s * S), int((t0_s + dur_s) * S), [wid])


def test_plan_groups_old_windows_per_run_and_minute_and_leaves_recent_ones() -> None:
    now = 1000 * S
    windows = [_w(i, 1, 600 + i) for i in range(400)]  # 1 Hz from t=600 s to t=999 s
    windows += [_w(1000 + i, 2, 600 + i) for i in range(3)]  # another run's three
    groups = plan(windows, now, raw_window_s=100)
    # run 1: ended before t=900 s -> minutes [600,660) ... [840,900) of 60 windows each
    run1 = [g for g in groups if g[0].run_id == 1]
    assert [len(g) for g in run1] == [60] * 5
    assert all(p.t1 < 900 * S for g in run1 for p in g)
    assert all(len({p.t0 // (60 * S) for p in g}) == 1 for g in groups)
    assert [len(g) for g in groups if g[0].run_id == 2] == [3]


def test_plan_leaves_single_windows_and_coarsens_after_the_second_tier() -> None:
    now = 10 * 3600 * S
    # merged minute windows from an hour ago back to 5 h ago: only those > 2 h old go to 10 min
    minutes = [_w(i, 1, i * 60, 59.5) for i in range(5 * 60, 9 * 60)]
    groups = plan(minutes, now, raw_window_s=900)
    assert all(len(g) == 10 for g in groups)
    assert all(p.t1 < now - 2 * 3600 * S for g in groups for p in g)
    assert sum(len(g) for g in groups) == (8 * 60 - 5 * 60)
    assert plan(minutes[:1], now, raw_window_s=900) == []


# --- the atomic store op ------------------------------------------------------------------------


async def _store(tmp_path: Path) -> tuple[Store, Path]:
    db = tmp_path / "k.db"
    schema.prepare(db)
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    return store, db


async def test_write_atomic_undoes_every_part_when_a_count_check_fails(tmp_path: Path) -> None:
    store, db = await _store(tmp_path)
    await store.submit(runsdb.host_sample_op(1, 50.0, 4, None))
    parts = [
        Part("DELETE FROM host_samples WHERE mono_ns = ?", ((1,),), expect_rows=1),
        Part("INSERT INTO host_samples (mono_ns, cpu_pct) VALUES (?, ?)", ((2, 1.0), (3, 1.0))),
        Part("DELETE FROM host_samples WHERE mono_ns = ?", ((99,),), expect_rows=1),  # none
    ]
    with pytest.raises(AtomicCheckError):
        await store.write_atomic(parts)
    assert query(db, "SELECT mono_ns FROM host_samples")[0][0] == 1
    assert len(query(db, "SELECT * FROM host_samples")) == 1
    await store.write_atomic(parts[:2])
    assert [r[0] for r in query(db, "SELECT mono_ns FROM host_samples ORDER BY 1")] == [2, 3]
    await store.close()


async def _put_window(
    store: Store, run_id: int, t0: int, t1: int, rows: list[KernelAgg], steps: list[int]
) -> None:
    window = {"t0": t0, "t1": t1, "source": "continuous", "steps": steps}
    for op in runsdb.kernel_window_ops(run_id, window, rows):
        await store.submit(op)


_TOTALS_SQL = (
    "SELECT kind, name, SUM(count), SUM(total_ns), SUM(self_ns) FROM kernel_stats "
    "GROUP BY 1, 2 ORDER BY 1, 2"
)


def _totals(db: Path) -> list[tuple[Any, ...]]:
    """Each (kind, name)'s summed count, total and self ns over the whole database."""
    return [tuple(r) for r in query(db, _TOTALS_SQL)]


async def test_compact_once_keeps_exact_totals_and_is_idempotent(tmp_path: Path) -> None:
    store, db = await _store(tmp_path)
    for i in range(130):  # 130 s of 1 Hz windows, two kernels each
        t0 = (600 + i) * S
        rows = [_agg("gemm", 1000 + i, 2), _agg("nccl", 7, 1, cls="comm")]
        await _put_window(store, 1, t0, t0 + 20 * MS, rows, [i])
    await _put_window(store, 1, 600 * S, 601 * S, [_agg("gemm", 5)], [0])  # a snapshot...
    await store.write("UPDATE kernel_windows SET source = 'snapshot' WHERE id = 131")
    before = _totals(db)
    now = 735 * S  # windows ended before t=725 s (raw window 10 s) are merged per minute
    assert await kcompact.compact_once(store, now, raw_window_s=10) == 60 + 60 + 5
    assert await kcompact.compact_once(store, now, raw_window_s=10) == 0  # nothing left to do
    assert _totals(db) == before
    wins = query(db, "SELECT source, t0_ns, t1_ns, steps FROM kernel_windows ORDER BY t0_ns, id")
    cont = [w for w in wins if w["source"] == "continuous"]
    assert len(cont) == 3 + 5 and len(wins) == 9  # three merged, five raw, the snapshot
    assert (cont[0]["t0_ns"], cont[0]["t1_ns"]) == (600 * S, 659 * S + 20 * MS)
    assert orjson.loads(cont[0]["steps"]) == list(range(60))
    assert query(db, "SELECT COUNT(*) FROM kernel_stats")[0][0] == 3 * 2 + 5 * 2 + 1
    # later: the last raw five join their minute's merged window (one merge of six parts)
    assert await kcompact.compact_once(store, 750 * S, raw_window_s=10) == 6
    assert _totals(db) == before
    last = query(
        db,
        "SELECT t0_ns, t1_ns, steps FROM kernel_windows WHERE source = 'continuous' ORDER BY t0_ns",
    )[-1]
    assert (last[0], last[1], orjson.loads(last[2])) == (
        720 * S,
        729 * S + 20 * MS,
        list(range(120, 130)),
    )
    (gemm,) = query(
        db,
        "SELECT count, total_ns FROM kernel_stats WHERE name = 'gemm' AND "
        "window_id = (SELECT id FROM kernel_windows WHERE t0_ns = ? AND "
        "source = 'continuous')",
        (720 * S,),
    )
    assert tuple(gemm) == (20, sum(1000 + i for i in range(120, 130)))
    await store.close()


# --- kernel_drift across a compaction ------------------------------------------------------------


def _continuous_run(n: int, grows: bool) -> list[tuple[dict[str, Any], list[KernelAgg]]]:
    """*n* 1 Hz windows of one traced step each (from step 100: past warm-up):
    gemm 10 ms per step; AllReduce 5 ms per step, 9 ms in the second half when *grows*."""
    out = []
    for i in range(n):
        ar = 9 * MS if grows and i >= n // 2 else 5 * MS
        rows = [_agg("gemm", 10 * MS, 4), _agg("ncclDevKernel_AllReduce", ar, 1, cls="comm")]
        out.append(
            (
                {
                    "id": i + 1,
                    "t0": i * S,
                    "t1": i * S + 30 * MS,
                    "source": "continuous",
                    "steps": [100 + i],
                },
                rows,
            )
        )
    return out


def _ctx(stats: Any) -> RunContext:
    return RunContext(run_name="t", status="finished", step_ms=(), wait_ms=(), kernels=stats)


def _compacted(
    windows: list[tuple[dict[str, Any], list[KernelAgg]]], now_ns: int, raw_window_s: float
) -> list[tuple[dict[str, Any], list[KernelAgg]]]:
    """What the daemon would store after compacting *windows* at *now_ns*."""
    stored = [StoredWindow(w["id"], 1, w["t0"], w["t1"], w["steps"]) for w, _ in windows]
    rows = {w["id"]: r for w, r in windows}
    groups = plan(stored, now_ns, raw_window_s)
    gone = {p.id for g in groups for p in g}
    out = [(w, r) for w, r in windows if w["id"] not in gone]
    for g in groups:
        window, merged = merge_windows(g, rows)
        out.append(({**window, "id": g[0].id, "n_steps": len(window["steps"])}, merged))
    return sorted(out, key=lambda wr: wr[0]["t0"])


def test_kernel_drift_fires_before_and_after_compaction() -> None:
    """600 s of windows: AllReduce 5 -> 9 ms per step at t=300 s. Compacted at
    t=600 s with a 60 s raw window: 9 minute windows then 60 raw ones. Halves by
    window count would compare mostly-late windows with late ones (no drift);
    split by steps it still fires with the same ms."""
    raw = _continuous_run(600, grows=True)
    before = kernel_drift(_ctx(kernel_stats(raw)))
    packed = _compacted(raw, 600 * S, raw_window_s=60)
    assert len(packed) == 9 + 60
    stats = kernel_stats(packed)
    assert stats is not None and stats.series_unit == "step"
    after = kernel_drift(_ctx(stats))
    assert before is not None and after is not None
    for ins in (before, after):
        assert ins.evidence["kernel"] == "ncclDevKernel_AllReduce"
        assert ins.evidence["first_half_ms"] == pytest.approx(5.0)
        assert ins.evidence["second_half_ms"] == pytest.approx(9.0)
    assert stats.device_ns == kernel_stats(raw).device_ns


def test_kernel_drift_silent_on_a_steady_run_after_compaction() -> None:
    packed = _compacted(_continuous_run(600, grows=False), 600 * S, raw_window_s=60)
    stats = kernel_stats(packed)
    assert stats is not None and stats.windows == 69
    assert kernel_drift(_ctx(stats)) is None
