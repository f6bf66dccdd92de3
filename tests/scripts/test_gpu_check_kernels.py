"""scripts/gpu_check_kernels.py, the real-GPU check of kernels, FLOPs and MFU: its dry run as CI
runs it (a real subprocess: a tiny GPT trained on the CPU under profile()
with trace options, a real auto-started gpuprofd, gpuprofctl, the report),
and its live mode's refusal on a machine without CUDA."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.scripts.helpers import refused_live, run_report, skip_with_cuda

MODES = ["no gpuprof", "profile(), no tracing", "trace_every_n_steps=20", "continuous_traces_hz=1"]


@pytest.fixture(scope="module")
def dry(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    return run_report("gpu_check_kernels", tmp_path_factory.mktemp("gck"), "--dry-run")


def test_dry_run_exits_0_and_prints_the_report(dry):
    proc, rep, out = dry
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rep["mode"] == "dry-run" and not rep["errors"]
    assert all(rep["plumbing"].values()), rep["plumbing"]
    md = (out / "report.md").read_text()
    assert "Plumbing OK: every part ran." in md and "MISMATCH" not in md
    assert md in proc.stdout
    assert rep["timings_s"]["import_torch"] > 0 and rep["timings_s"]["total_wall"] < 60
    assert rep["daemon_pids_stopped"] and len(rep["daemon_pids_stopped"]) == 1


def test_dry_run_variants_count_steps_and_store_trace_windows(dry):
    _, rep, _ = dry
    assert [v["variant"] for v in rep["variants"]] == ["sdpa", "math"]
    for v in rep["variants"]:
        assert v["steps_run"] == 25
        assert v["gpuprof"]["steps"] == 25 and v["gpuprof"]["runs_json"]["steps"] == 25
        assert v["checks"]["steps_counted"] and v["checks"]["trace_windows_stored"]
        # snapshots of steps 0, 1, 5 and 20 (trace_every_n_steps=20; 25 steps)
        assert v["snapshot_windows"] == 4
        assert {0, 1, 4, 5, 19, 20} <= set(v["traced_steps"])
        assert v["kernels"]["error"] is None
        assert v["gpuprof"]["median_step_ms"] > 0 and v["hand"]["median_step_ms"] > 0
        # gpuprof and this script time the same loop: same order of magnitude
        ratio = v["gpuprof"]["median_step_ms"] / v["hand"]["median_step_ms"]
        assert 0.5 < ratio < 2, ratio
        assert v["hand"]["steps_used"] == 25 - 10 - 2  # warm-up and traced 19, 20 left out
        assert v["flops_per_step"] == pytest.approx(4.404e7, rel=1e-3)
        assert v["rules_fired"] == v["rules_fired_ctl"]
        assert v["match"] is None  # not judged on a CPU
    assert rep["variants"][0]["sdpa_suboptimal_expected"] is False
    assert rep["variants"][1]["sdpa_suboptimal_expected"] is True
    assert rep["runs_in_db"] == 2 + 3 * 2  # two variants, 3 profiled modes x 2 rounds


def test_dry_run_mfu_is_unknown_on_a_cpu_with_the_reason(dry):
    _, rep, out = dry
    for v in rep["variants"]:
        assert v["gpuprof"]["mfu"] is None and v["gpuprof"]["mfu_unknown"] == "no GPU"
        assert v["hand"]["mfu"] is None and v["hand"]["peak_tflops"] is None
        assert "no dense bf16 peak for 'CPU (dry run)'" in v["hand"]["mfu_unknown"]
        assert v["checks"]["mfu_known"] is False
    assert "gpuprof: MFU unknown: no GPU." in (out / "report.md").read_text()


def test_dry_run_overhead_modes_interleaved(dry):
    _, rep, _ = dry
    ov = rep["overhead"]
    assert [m["mode"] for m in ov["modes"]] == MODES
    assert ov["rounds"] == 2 and ov["steps_per_block"] == 25
    by = {m["mode"]: m for m in ov["modes"]}
    for m in ov["modes"]:
        assert len(m["block_s"]) == 2 and m["step_ms"] > 0
    assert by["profile(), no tracing"]["ratio_vs_profile"] == 1.0
    assert by["no gpuprof"]["ratio_vs_no_gpuprof"] == 1.0
    assert by["no gpuprof"]["windows_per_block"] is None
    assert by["profile(), no tracing"]["windows_per_block"] == [0, 0]
    assert by["trace_every_n_steps=20"]["windows_per_block"] == [4, 4]


def test_live_mode_without_cuda_exits_2_with_one_clear_line(tmp_path):
    skip_with_cuda()
    line = refused_live(
        "gpu_check_kernels", tmp_path, "gpu_check_kernels: live mode needs a CUDA GPU: torch "
    )
    assert "sees no CUDA device" in line
