"""scripts/gpu_check_comm.py, the real-GPU check of comm timing: its dry run as CI runs
it (a real gpuprofd, a real ``torchrun`` of 2 gloo ranks on the CPU training
a DDP under profile() with a torch.profiler window, the database read, the
report), once with gpuprof's default hook and once with the user ``avg``
hook the live check uses on one GPU; its live mode's refusal without CUDA;
and the live-only judging (event/kernel pairing, the ratio, unresolved
records, one rank's clock) on hand-made rows."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.scripts.helpers import load_script, refused_live, run_report, skip_with_cuda

#: The dry run's DDP: 6 x Linear(128, 128), fp32.
PARAM_BYTES = 6 * (128 * 128 + 128) * 4
MS = 1_000_000


def _load():
    return load_script("gpu_check_comm")


def _dry(tmp_path_factory, *args: str) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    return run_report("gpu_check_comm", tmp_path_factory.mktemp("gcc"), "--dry-run", *args)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    return _dry(tmp_path_factory)


def test_dry_run_exits_0_and_prints_the_report(dry):
    proc, rep, out = dry
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rep["mode"] == "dry-run" and not rep["errors"]
    assert all(rep["plumbing"].values()), rep["plumbing"]
    assert (rep["world_size"], rep["backend"], rep["hook"]) == (2, "gloo", "default")
    md = (out / "report.md").read_text()
    assert "Plumbing OK: every part ran." in md and md in proc.stdout
    assert "FAIL" not in md
    # the main run and 2 rounds x (off, on) overhead blocks, per rank
    assert rep["runs_in_db"] == 2 * (1 + 2 * 2)
    assert rep["timings_s"]["total_wall"] < 60


def test_dry_run_stores_every_bucket_with_the_parameters_bytes(dry):
    _, rep, _ = dry
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    for r in rep["ranks"]:
        assert r["steps_stored"] == 60 and r["param_bytes"] == PARAM_BYTES
        b = r["buckets"]
        assert b["per_step"] == 6 and b["indices_once"]
        assert b["steps_complete"] == b["steps_analysed"] == 58 and b["rows_missing"] == 0
        assert r["bytes_per_step"] == [PARAM_BYTES]
        assert r["event_ms"]["median"] > 0
        assert {
            k: r["checks"][k]["verdict"]
            for k in ("buckets", "bytes", "comm_phase", "unresolved", "clock")
        } == dict.fromkeys(("buckets", "bytes", "comm_phase", "unresolved", "clock"), "PASS")
        assert r["unresolved"]["from_notes"] == 0 and r["unresolved"]["timer"]["unresolved"] == 0
        assert 0 < r["comm_phase_ms"]["median"] < r["comm_phase_ms"]["median_step_ms"]


def test_dry_run_window_and_the_skipped_nccl_comparison(dry):
    _, rep, _ = dry
    for r in rep["ranks"]:
        w = r["window"]
        # loop steps 40-47 are gpuprof steps 40-47: 8 steps x 6 buckets
        assert w["gpuprof_steps"] == list(range(40, 48)) and w["rows"] == 48
        assert w["coll_ops"].get("gloo:all_reduce", 0) >= 48
        assert w["kernels"] == 0 and w["pairs"] == 0
        ev = r["checks"]["events_vs_kernels"]
        assert ev["verdict"] == "SKIP" and "no NCCL kernels on a CPU (gloo)" in ev["detail"]
    assert rep["verdicts"]["events_vs_kernels"]["verdict"] == "SKIP"


def test_dry_run_clock_offsets_and_overhead_blocks(dry):
    _, rep, _ = dry
    r0, r1 = rep["ranks"]
    assert r0["clock"]["clock_offset_ns"] == 0 and r0["clock"]["clock_reference_rank"] == 0
    assert r1["clock"]["clock_offset_ns"] is not None
    assert r1["clock"]["clock_uncertainty_ns"] > 0 and r1["clock"]["clock_round_trips"] == 64
    for r in rep["ranks"]:
        ov = r["overhead"]
        assert ov["rounds"] == 2 and ov["block_steps"] == 10
        assert len(ov["block_s"]["off"]) == len(ov["block_s"]["on"]) == 2
        assert ov["ratio"] > 0 and r["checks"]["overhead"]["verdict"] == "SKIP"


def test_dry_run_with_the_user_avg_hook_gpuprof_wraps(tmp_path_factory):
    proc, rep, _ = _dry(
        tmp_path_factory,
        "--hook",
        "avg",
        "--steps",
        "20",
        "--window",
        "10-13",
        "--rounds",
        "1",
        "--block-steps",
        "5",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rep["hook"] == "avg" and all(rep["plumbing"].values()), rep["plumbing"]
    for r in rep["ranks"]:
        assert r["buckets"]["per_step"] == 6 and r["bytes_per_step"] == [PARAM_BYTES]
        assert r["window"]["gpuprof_steps"] == [10, 11, 12, 13] and r["window"]["rows"] == 24
    assert "wrapped by gpuprof" in proc.stdout


def test_live_mode_without_cuda_exits_2_with_one_clear_line(tmp_path):
    skip_with_cuda()
    refused_live("gpu_check_comm", tmp_path, "gpu_check_comm: live mode needs a CUDA GPU: torch ")


# --- live judging on hand-made rows ------------------------------------------------


def _rows(steps, nb, t0, dur_ms, skip=()):
    """Bucket rows: *nb* per step, launched 1 ms apart, each *dur_ms* long."""
    rows = []
    for k, s in enumerate(steps):
        for j in range(nb):
            if (s, j) in skip:
                continue
            start = t0 + (k * 100 + j) * MS
            rows.append(
                {
                    "run_id": 1,
                    "step": s,
                    "bucket": j,
                    "start_ns": start,
                    "end_ns": start + int(dur_ms * MS),
                    "bytes": 100,
                }
            )
    return rows


def _kernels(n, dur_ms):
    return [[i * MS, int(dur_ms * MS), "ncclDevKernel_AllReduce_Sum_f32_RING_LL"] for i in range(n)]


def test_pairing_in_launch_order_step_by_step_and_by_sorted_durations():
    mod = _load()
    rows = _rows([5, 6], 4, 0, 1.0)
    rows[1]["end_ns"] = rows[1]["start_ns"] + 3 * MS  # bucket 1 of step 5 read 3 ms
    kernels = _kernels(8, 1.0)
    pairs, how = mod.pair_window(rows, [5, 6], 4, kernels)
    assert how == "launch order, step by step" and len(pairs) == 8
    assert pairs[1] == (3.0, 1.0, 1) and pairs[0] == (1.0, 1.0, 0)
    # a step short of rows (records left out) drops its own pairs only
    short = [r for r in rows if not (r["step"] == 6 and r["bucket"] == 2)]
    pairs, _ = mod.pair_window(short, [5, 6], 4, kernels)
    assert len(pairs) == 4
    # kernels not nb per step: sorted durations paired
    pairs, how = mod.pair_window(rows, [5, 6], 4, kernels[:5])
    assert how.startswith("sorted durations") and len(pairs) == 5
    assert all(j is None for _, _, j in pairs)


def _worker(world=2, notes=(), kernels=None, rank=1):
    return {
        "rank": rank,
        "world_size": world,
        "backend": "nccl",
        "hook": "default",
        "device": f"cuda:{rank}",
        "param_bytes": 400,
        "main": {
            "window": {
                "steps": [4, 6],
                "t0_ns": 350 * MS,
                "t1_ns": 560 * MS,
                "kernels": _kernels(8, 1.0) if kernels is None else kernels,
                "coll_ops": {"nccl:all_reduce": 8},
            },
            "notes": list(notes),
            "timer": {},
        },
        "overhead": {
            "block_steps": 10,
            "rounds": 2,
            "block_s": {"off": [0.100, 0.101], "on": [0.1005, 0.1012]},
        },
    }


def _db(offset=2_000, unc=15_000, dur_ms=1.2, skip=(), world_rank=1):
    steps = [
        {
            "run_id": 1,
            "step": s,
            "t0_ns": s * 100 * MS - 50 * MS,
            "t1_ns": s * 100 * MS + 50 * MS,
            "phases": json.dumps({"backward": 20 * MS, "comm": 2 * MS}),
        }
        for s in range(8)
    ]
    rows = _rows(range(8), 4, 0, dur_ms, skip)  # step s's buckets start at s * 100 ms
    runs = [
        {
            "id": 1,
            "run_name": "gpu_check_comm:main",
            "rank": world_rank,
            "status": "finished",
            "clock_offset_ns": offset,
            "clock_uncertainty_ns": unc,
            "clock_rtt_ns": unc and 2 * unc,
            "clock_round_trips": 64,
            "clock_reference_rank": 0,
        }
    ]
    return {"runs": runs, "steps": steps, "buckets": rows}


def test_live_judging_passes_a_healthy_rank():
    mod = _load()
    r = mod.assess_rank(_worker(), _db(), live=True)
    assert r["window"]["gpuprof_steps"] == [4, 5] and r["window"]["pairs"] == 8
    assert r["window"]["ratio_median"] == pytest.approx(1.2)
    assert r["window"]["excess_us_median"] == pytest.approx(200.0)
    assert r["window"]["by_bucket"]["3"]["ratio_median"] == pytest.approx(1.2)
    assert {k: v["verdict"] for k, v in r["checks"].items()} == dict.fromkeys(mod.CHECKS, "PASS")
    assert r["overhead"]["ratio"] == pytest.approx(1.0035, abs=1e-3)


def test_live_judging_fails_what_it_should():
    mod = _load()
    # events 3x the kernels; an offset beyond its uncertainty; 3 % slower with timing
    w = _worker()
    w["overhead"]["block_s"]["on"] = [0.103, 0.104]
    r = mod.assess_rank(w, _db(offset=40_000, unc=15_000, dur_ms=3.0), live=True)
    assert r["checks"]["events_vs_kernels"]["verdict"] == "FAIL"
    assert r["checks"]["clock"]["verdict"] == "FAIL"
    assert r["checks"]["overhead"]["verdict"] == "FAIL"
    # no NCCL kernel in the window: nothing compared, a FAIL on a GPU
    r = mod.assess_rank(_worker(kernels=[]), _db(), live=True)
    assert r["checks"]["events_vs_kernels"]["verdict"] == "FAIL"
    assert "no NCCL kernel" in r["checks"]["events_vs_kernels"]["detail"]


def test_unresolved_records_come_from_the_summary_note():
    mod = _load()
    gone = {(6, j) for j in range(4)} | {(7, 2), (7, 3)}  # 6 of 32 records left out
    note = "6 DDP bucket timings left out (CUDA events not complete when their step was sent)"
    r = mod.assess_rank(_worker(notes=[note]), _db(skip=gone), live=True)
    assert r["unresolved"]["from_notes"] == 6 and r["unresolved"]["records"] == 32
    assert r["checks"]["unresolved"]["verdict"] == "FAIL"
    # the missing rows are the unresolved ones: the bucket check itself holds
    assert r["buckets"]["rows_missing"] == 6 and r["checks"]["buckets"]["verdict"] == "PASS"
    # missing rows nobody accounts for
    r = mod.assess_rank(_worker(), _db(skip=gone), live=True)
    assert r["checks"]["buckets"]["verdict"] == "FAIL"


def test_one_rank_has_no_clock_offset_to_judge_and_a_skip_does_not_fail():
    mod = _load()
    w = _worker(world=1, rank=0)
    r = mod.assess_rank(w, _db(offset=None, unc=None, world_rank=0), live=True)
    assert r["checks"]["clock"]["verdict"] == "SKIP"
    assert "world of one rank" in r["checks"]["clock"]["detail"]
    rep = {"mode": "live", "errors": [], "ranks": [r], "world_size": 1, "steps": 8}
    rep["verdicts"] = mod.verdicts(rep)
    assert rep["verdicts"]["clock"]["verdict"] == "SKIP"
    assert rep["verdicts"]["events_vs_kernels"]["verdict"] == "PASS"
