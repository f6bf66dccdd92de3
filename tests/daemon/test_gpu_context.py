"""Stored GPU samples → a run's context → the GPU rules: real SQLite rows in
the shape the sampler stores (fast loop + slow loop), taken from the
recorded H200 trace, read back by the same code gpuprofctl and the daemon use."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import orjson
import pytest

from gpuprof.insights import run_rules
from gpuprof.insights.gpu import GPU_RULES
from gpuprofd import dbread, schema

H200 = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "h200"
UUID = "GPU-69cfecb8-dd0f-d46a-a967-785474cc5ca4"


def _trace() -> tuple[dict, list[dict]]:
    path = H200 / "nvml_trace.jsonl"
    if not path.exists():
        pytest.fail(f"H200 fixture missing at {path}: shared/ must sit beside the repo")
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def _db_with_phase(tmp_path: Path, phase: str, run_uuid: str) -> Path:
    """A database holding one run whose steps span *phase* of the trace, and
    the trace's samples stored as the sampler stores them."""
    header, rows = _trace()
    (span,) = [p for p in header["phases"] if p["phase"] == phase]
    t0, t1 = int(span["t0"] * 1e9), int(span["t1"] * 1e9)
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
    for r in rows:
        ns = int(r["t"] * 1e9)
        conn.execute(
            "INSERT INTO gpu_samples (mono_ns, gpu_index, uuid, util_pct, mem_used_bytes, "
            "mem_total_bytes, power_mw, temp_c, sm_clock_mhz, mem_util_pct, "
            "clock_event_reasons) VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (ns, UUID, r["util_gpu"], r["mem_used"], r["mem_total"], r["power_mW"],
             r["temp_C"], r["sm_MHz"], r["util_mem"], r["reasons"]),
        )  # fmt: skip
        if "pcie_rx_KBps" in r or "gpm_sm_util" in r:  # a slow-loop reading
            kbps = 1000.0  # stored as bytes/s
            conn.execute(
                "INSERT INTO gpu_slow_samples (mono_ns, uuid, pcie_rx_bps, pcie_tx_bps, "
                "gpm_sm_util_pct, gpm_sm_occupancy_pct, gpm_tensor_util_pct, "
                "gpm_dram_bw_util_pct) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (ns, UUID,
                 r["pcie_rx_KBps"] * kbps if "pcie_rx_KBps" in r else None,
                 r["pcie_tx_KBps"] * kbps if "pcie_tx_KBps" in r else None,
                 r.get("gpm_sm_util"), r.get("gpm_sm_occupancy"),
                 r.get("gpm_any_tensor_util"), r.get("gpm_dram_bw_util")),
            )  # fmt: skip
    conn.commit()
    conn.close()
    return db


def _gpu_findings(db: Path) -> tuple[set[str], object]:
    conn = dbread.open_ro(db)
    try:
        ctx = dbread.run_context(conn, dbread.get_run(conn, 1))
    finally:
        conn.close()
    return {i.rule for i in run_rules(ctx)} & set(GPU_RULES), ctx


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("h2d_copy", {"copy_bound_gpu", "pcie_saturation"}),
        ("memory_92pct", {"memory_pressure", "gpu_idle_between_steps"}),
        ("bf16_matmul", {"power_capping"}),
        ("idle", set()),
    ],
)
def test_stored_samples_reach_the_gpu_rules(tmp_path: Path, phase: str, expected: set[str]):
    # torch spells the run's UUID without "GPU-": matched all the same
    fired, ctx = _gpu_findings(_db_with_phase(tmp_path, phase, UUID[4:].upper()))
    assert ctx.gpu is not None
    assert fired == expected


def test_a_run_on_another_gpu_gets_no_gpu_findings(tmp_path: Path):
    db = _db_with_phase(tmp_path, "h2d_copy", "GPU-00000000-0000-0000-0000-000000000000")
    fired, ctx = _gpu_findings(db)
    assert (ctx.gpu, fired) == (None, set())
