"""scripts/gpu_check.py, the real-GPU check: its replay mode on the recorded
H200 trace (a real subprocess, as CI runs it), its live mode's refusal on a
machine without a GPU, a dry run of its live plumbing (load child, sampler,
phase windows, report) with NVML replayed and the load on the CPU, and the
live phase windowing on hand-made samples."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuprofd.sampling.nvml import GpuSample, GpuSlowSample
from tests.h200_expected import EXPECTED
from tests.scripts.helpers import ROOT, load_script, refused_live, run_report, run_script

TRACE = ROOT / "tests" / "fixtures" / "h200" / "nvml_trace.jsonl"
LIVE_PHASES = ["idle", "bf16_matmul", "h2d_copy", "memory_92pct", "loader_stall"]


def _trace_rows(phase: str) -> list[dict]:
    rows = [json.loads(ln) for ln in TRACE.read_text().splitlines()[1:]]
    return [r for r in rows if r["phase"] == phase][1:]


@pytest.fixture(scope="module")
def replay_report(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    if not TRACE.exists():
        pytest.fail(f"H200 fixture missing at {TRACE}: tests/fixtures/ is part of the repository")
    return run_report(
        "gpu_check",
        tmp_path_factory.mktemp("gpu_check"),
        "--replay",
        str(TRACE),
        "--sampler-s",
        "1",
        timeout=90,
    )


def test_replay_exits_0_with_every_phase_matching(replay_report):
    proc, rep, out = replay_report
    assert proc.returncode == 0, proc.stderr
    assert rep["mode"] == "replay" and rep["all_match"] is True
    assert [p["name"] for p in rep["phases"]] == list(EXPECTED)
    for p in rep["phases"]:
        assert p["fired"] == sorted(EXPECTED[p["name"]]), p["name"]
        assert p["match"] and not p["missing"] and not p["unexpected"]
        assert p["samples"] == len(_trace_rows(p["name"]))
    md = (out / "report.md").read_text()
    assert "All verdicts match the replay" in md
    assert "| memory_92pct |" in md and "| loader_stall |" in md
    assert md in proc.stdout  # the summary is printed too


def test_replay_memory_phase_fires_memory_pressure_at_the_fixtures_92_percent(replay_report):
    _, rep, _ = replay_report
    mem = next(p for p in rep["phases"] if p["name"] == "memory_92pct")
    rows = _trace_rows("memory_92pct")
    frac = max(r["mem_used"] for r in rows) / rows[0]["mem_total"]  # 138.8 of 150.75 GB
    assert 0.92 < frac < 0.921
    assert mem["evidence"]["memory_pressure"]["mem_used_fraction"] == pytest.approx(frac, abs=1e-4)
    assert mem["readings"]["mem_used_max_pct"] == pytest.approx(100 * frac, abs=0.01)
    assert mem["readings"]["mem_total_gb"] == pytest.approx(150.75, abs=0.01)


def test_replay_copy_and_compute_readings(replay_report):
    _, rep, _ = replay_report
    by = {p["name"]: p for p in rep["phases"]}
    h2d = by["h2d_copy"]
    rx_max = max(r["pcie_rx_KBps"] for r in _trace_rows("h2d_copy") if "pcie_rx_KBps" in r)
    assert h2d["readings"]["pcie_rx_max_gbps"] == pytest.approx(rx_max * 1000 / 1e9, abs=0.01)
    assert h2d["readings"]["pcie_rx_mean_gbps"] == pytest.approx(58.8, abs=0.1)  # README
    assert h2d["readings"]["gpm_sm_util_pct"] == 0.0 and h2d["readings"]["util_mean_pct"] > 90
    mm = by["bf16_matmul"]
    ev = mm["evidence"]["power_capping"]
    assert rep["device"]["max_sm_mhz"] == 1980  # probe.json: the reference, as in the daemon
    assert ev["sm_mhz_ref"] == 1980 and 0.2 < ev["est_throughput_loss"] < 0.3
    assert mm["readings"]["reasons_seen"] == "0x4"
    assert mm["readings"]["gpm_tensor_util_pct"] == pytest.approx(88, abs=1)  # README: 88 %


def test_replay_reports_the_samplers_rate_cpu_share_and_call_costs(replay_report):
    _, rep, _ = replay_report
    fast, slow = rep["sampler"]["fast"], rep["sampler"]["slow"]
    assert fast["requested_hz"] == 100 and slow["requested_hz"] == 1
    assert fast["ticks"] > 10 and fast["achieved_hz"] > 10  # a loaded CI box still ticks
    assert slow["ticks"] >= 1
    assert 0 <= fast["thread_cpu_pct_of_core"] < 100 and fast["missed_ticks"] >= 0
    costs = rep["nvml_call_costs"]
    assert costs["utilization"]["median_us"] > 0 and costs["backend_fast_sample"]["calls"] == 200
    # the trace has no violation counters: reported as unavailable, not 0
    assert "NotSupported" in costs["violation_status_power"]["error"]


def test_live_mode_without_a_gpu_exits_2_with_one_clear_line(tmp_path):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML: live mode would run")
    refused_live(
        "gpu_check", tmp_path, "gpu_check: live mode needs an NVIDIA GPU with CUDA and NVML"
    )


def test_dry_run_drives_the_live_plumbing_end_to_end(tmp_path):
    """Live mode's code with NVML replayed and the load on the CPU: every phase
    reported by the load child, sampled, windowed and judged; GPU verdicts are
    meaningless here, so only the shape and the figures are checked."""
    proc = run_script("gpu_check", "--dry-run", "--phase-s", "0.8", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr  # plumbing judged, not the verdicts
    md = (tmp_path / "report.md").read_text()
    assert "Plumbing OK: every phase ran and was sampled." in md and "MISMATCH" not in md
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["mode"] == "dry-run" and rep["backend"] == "replay"
    assert [p["name"] for p in rep["phases"]] == LIVE_PHASES
    for p in rep["phases"]:
        assert p["samples"] > 0, p["name"]
        assert p["expected"] == sorted(EXPECTED[p["name"]])
        lo, hi = p["window_s"]
        # at least the phase less the skip (a busy host only lengthens a phase)
        assert hi - lo >= 0.8 - rep["skip_s"] - 0.3
    loads = {p["name"]: p["load"] for p in rep["phases"]}
    assert rep["skip_s"] == 0.5 and loads["bf16_matmul"]["iters"] > 0
    assert loads["h2d_copy"]["iters"] > 0 and loads["loader_stall"]["bursts"] >= 1
    assert rep["timings_s"]["import_torch"] > 0
    assert rep["sampler"]["fast"]["ticks"] > 50
    assert rep["sampler"]["fast_samples"] == rep["sampler"]["fast"]["ticks"]
    for name in LIVE_PHASES:
        assert f"phase {name} done" in proc.stderr


# --- the live phase window, on hand-made samples ------------------------------


def _module():
    return load_script("gpu_check")


def _fast(util: float) -> GpuSample:
    return GpuSample(0, "GPU-x", util, 10, 100, 300_000, 50, 1980, 5.0, 0)


def _slow(rx_bps: float) -> GpuSlowSample:
    return GpuSlowSample(0, "GPU-x", None, None, rx_bps, 0.0, 0.0, 0.0, 0.0, 0.0, None, None)


def test_phase_rows_skip_the_lagging_start_and_straddling_slow_samples():
    gc = _module()
    ms = 1_000_000
    # fast samples every 10 ms over 0..3 s; the phase runs 1..3 s, skip 0.5 s
    fast = [(t * 10 * ms, _fast(99.0 if t < 150 else 1.0)) for t in range(300)]
    # slow samples at 0.6, 1.2, 1.8, 2.4 s, each measuring the interval since
    # the previous one: only 1.8-2.4 s lies inside the judged [1.5, 3) s;
    # 1.2-1.8 s straddles the skipped start, the earlier ones precede the phase.
    slow = [
        (600 * ms, _slow(1e9)),
        (1200 * ms, _slow(60e9)),
        (1800 * ms, _slow(50e9)),
        (2400 * ms, _slow(2e9)),
    ]
    rows, joined = gc.phase_rows(fast, slow, 1000 * ms, 3000 * ms, 500 * ms)
    assert len(rows) == 150 and all(r["util_gpu"] == 1.0 for r in rows)
    assert joined == 1
    with_rx = [r for r in rows if "pcie_rx_KBps" in r]
    assert [r["pcie_rx_KBps"] for r in with_rx] == [2e6]  # 2 GB/s in KB/s
    assert rows.index(with_rx[0]) == 90  # joined to the fast row taken at 2.4 s
    # no skip: the 1.8 s sample (1.2-1.8) counts too, and the util lag is kept
    rows, joined = gc.phase_rows(fast, slow, 1000 * ms, 3000 * ms, 0)
    assert len(rows) == 200 and joined == 2 and rows[0]["util_gpu"] == 99.0
    res = gc.judge("h2d_copy", rows, "NVIDIA H200", joined, None)
    assert res.readings["pcie_rx_max_gbps"] == 50.0 and "pcie_saturation" in res.fired
