"""End to end: a real ``python -m gpuprofd`` with a 2 s raw window compacts
the continuous kernel windows it received into one per minute, with every
count and ns kept."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from gpuprofd.storage.reads import queries
from tests.daemon import helpers as h

S = 1_000_000_000
MINUTE = 60 * S


def _kernels(
    run_key: str, t0: int, t1: int, rows: list[list[Any]], steps: list[int], source: str
) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "kernels",
        "run_key": run_key,
        "t0": t0,
        "t1": t1,
        "source": source,
        "steps": steps,
        "rows": rows,
        "rows_dropped": 0,
    }


def _rows(i: int) -> list[list[Any]]:
    """Window *i*'s rows: a GEMM growing by 1 µs a window, a steady AllReduce,
    an operator with FLOPs in even windows only."""
    return [
        [
            "ampere_sgemm_128x64_tn",
            "kernel",
            "compute",
            10,
            4_000_000 + 1_000 * i,
            4_000_000 + 1_000 * i,
            None,
        ],
        [
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "kernel",
            "comm",
            2,
            1_500_000 + i,
            1_500_000 + i,
            None,
        ],
        ["aten::mm", "op", "compute", 10, 4_200_000, 100, 3.2e12 if i % 2 == 0 else None],
    ]


def test_daemon_compacts_continuous_windows_keeping_exact_totals(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "k.db"
    _, client = daemons.start_ready(sock_dir, db, "--raw-window", "2")
    hi = client.request(h.hello("k-cont", my_pid))
    assert hi is not None and hi["ok"] is True
    run_id = hi["run_id"]
    n = 150
    start = time.monotonic_ns() - (n + 5) * S  # 1 Hz windows that ended 5-155 s ago
    want: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0, None])
    slots: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        t0 = start + i * S
        rows = _rows(i)
        client.push(_kernels("k-cont", t0, t0 + 30_000_000, rows, [10 + i], "continuous"))
        slots[t0 // MINUTE].append(i)
        for name, kind, _cls, count, total, self_ns, flops in rows:
            w = want[(kind, name)]
            w[0] += count
            w[1] += total
            w[2] += self_ns
            if flops is not None:
                w[3] = (w[3] or 0.0) + flops
    snap_rows = [["flash_fwd_kernel", "kernel", "compute", 3, 900, 900, None]]
    client.push(_kernels("k-cont", start, start + S, snap_rows, [10], "snapshot"))
    # compaction runs every 2 s: one continuous window per minute slot is left
    h.poll_db(
        db,
        "SELECT COUNT(*) FROM kernel_windows WHERE source = 'continuous'",
        (),
        len(slots),
        timeout_s=30,
    )
    h.poll_db(db, "SELECT COUNT(*) FROM kernel_windows WHERE source = 'snapshot'", (), 1)

    windows = h.query(db, queries.KERNEL_WINDOWS_SQL, (run_id,))
    stats = h.query(db, queries.KERNEL_STATS_SQL, (run_id,))
    loaded = queries.kernel_windows_from_rows(windows, stats)
    cont = [(w, rows) for w, rows in loaded if w["source"] == "continuous"]
    got: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0, None])
    for _, rows in cont:
        for r in rows:
            g = got[(r.kind, r.name)]
            g[0] += r.count
            g[1] += r.total_ns
            g[2] += r.self_ns
            if r.flops is not None:
                g[3] = (g[3] or 0.0) + r.flops
    assert dict(got) == dict(want)
    # each merged window spans its slot's first t0 to its last t1 and lists its steps
    by_slot = {w["t0"] // MINUTE: w for w, _ in cont}
    for slot, idx in slots.items():
        w = by_slot[slot]
        assert w["t0"] == start + idx[0] * S
        assert w["t1"] == start + idx[-1] * S + 30_000_000
        assert w["steps"] == [10 + i for i in idx] and w["n_steps"] == len(idx)
        assert len([r for r in cont if r[0] is w][0][1]) == 3  # one row per (name, kind, cls)
    ((snap, snap_stats),) = [(w, rows) for w, rows in loaded if w["source"] == "snapshot"]
    assert snap["steps"] == [10] and [r.to_wire() for r in snap_stats] == snap_rows
    (n_stats,) = h.query(db, "SELECT COUNT(*) FROM kernel_stats WHERE run_id = ?", (run_id,))[0]
    assert n_stats == 3 * len(slots) + 1
    # the stored steps are plain JSON lists
    for w in windows:
        assert isinstance(orjson.loads(w["steps"]), list)
