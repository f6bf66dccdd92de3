from __future__ import annotations

from gpuprof.insights.frames import (
    MIN_SAMPLES,
    StackFrame,
    from_rows,
    gap_sentence,
    top_frames,
)
from gpuprof.insights.steps import dataloader_stall

from .conftest import make_ctx

SAVE = ("/home/u/train.py", 212, "save_checkpoint", "torch.save")
LOG = ("/home/u/train.py", 230, "log_metrics", "")


def frame(site, step, samples, source="main"):
    return StackFrame(source, step, *site, samples)


def test_top_frames_rank_by_samples_merge_steps_and_give_shares():
    got = top_frames([frame(SAVE, 20, 30), frame(SAVE, 40, 44), frame(LOG, 3, 26)])
    assert [(f.line, f.samples, round(f.share, 2)) for f in got] == [
        (212, 74, 0.74),
        (230, 26, 0.26),
    ]
    assert gap_sentence(got) == (
        "74% of the time between steps is in torch.save, called from train.py:212 "
        "(save_checkpoint); 26% in train.py:230 (log_metrics)."
    )


def test_top_frames_leave_out_small_shares_other_sources_steps_and_thin_runs():
    rows = [frame(SAVE, 20, 95), frame(LOG, 21, 5), frame(LOG, 21, 50, source="loader")]
    assert [f.line for f in top_frames(rows)] == [212]  # 5% is under MIN_SHARE
    assert [f.line for f in top_frames(rows, steps={21})] == [230]
    assert [f.function for f in top_frames(rows, source="loader")] == ["log_metrics"]
    assert top_frames([frame(SAVE, 20, MIN_SAMPLES - 1)]) == []
    assert gap_sentence([]) == ""


def test_stored_rows_become_frames():
    rows = [
        {
            "source": "main",
            "step": 4,
            "path": "/a.py",
            "line": 9,
            "func": "f",
            "callee": "",
            "samples": 3,
        }
    ]
    assert from_rows(rows) == (StackFrame("main", 4, "/a.py", 9, "f", "", 3),)


def _checkpoint_ctx(stack_frames=()):
    # 200 steps of 5 ms, ~1 ms between steps, a 40 ms pause before every 20th
    gaps = [40.0 if i % 20 == 19 else 1.0 for i in range(200)]
    return make_ctx([5.0] * 200, gaps, stack_frames=tuple(stack_frames))


def test_periodic_gap_names_the_frame_of_the_slow_gaps():
    # the save's samples in the slow gaps; a logging line in every gap (fast ones too)
    rows = [frame(SAVE, i, 4) for i in range(19, 200, 20)]
    rows += [frame(LOG, i, 1) for i in range(200) if i % 20 != 19]
    ins = dataloader_stall(_checkpoint_ctx(rows))
    assert "every 20 steps" in ins.title and "torch.save from train.py:212" in ins.title
    assert ins.detail.startswith(
        "Every 20 steps, ~40 ms between steps (torch.save from train.py:212); 3.0 ms per step"
    )
    assert "100% of those pauses is in torch.save, called from train.py:212" in ins.detail
    assert ins.evidence["frames"] == [
        {
            "path": SAVE[0],
            "line": 212,
            "function": "save_checkpoint",
            "call": "torch.save",
            "samples": 40,
            "share": 1.0,
        }
    ]


def test_periodic_gap_without_samples_names_no_frame():
    ins = dataloader_stall(_checkpoint_ctx())
    assert "every 20 steps" in ins.title and "(periodic inter-step gap)" in ins.title
    assert "called from" not in ins.detail and ins.evidence["frames"] == []


def test_steady_gap_names_its_top_frames_and_the_fix_points_at_them():
    rows = [frame(SAVE, i, 3) for i in range(1, 200)] + [frame(LOG, i, 1) for i in range(1, 200)]
    ins = dataloader_stall(make_ctx([5.0] * 200, [3.0] * 200, stack_frames=tuple(rows)))
    assert "every" not in ins.title
    assert ins.detail.endswith(
        "75% of the time between steps is in torch.save, called from train.py:212 "
        "(save_checkpoint); 25% in train.py:230 (log_metrics)."
    )
    assert ins.fix.startswith("Make torch.save from train.py:212 cheaper")
    assert [f["line"] for f in ins.evidence["frames"]] == [212, 230]


def test_steady_gap_without_samples_keeps_todays_wording():
    ins = dataloader_stall(make_ctx([5.0] * 200, [3.0] * 200))
    assert ins.fix.startswith("Find that work") and "of the time between steps" not in ins.detail


def test_no_stall_no_finding_whatever_the_frames():
    rows = [frame(SAVE, i, 3) for i in range(200)]
    assert dataloader_stall(make_ctx([5.0] * 200, [0.1] * 200, stack_frames=tuple(rows))) is None


# --- the loader workers' frames ---------------------------------------------

from gpuprof.insights.base import WorkerPool  # noqa: E402
from gpuprof.insights.steps import cpu_bound_dataloader  # noqa: E402

AUGMENT = ("/home/u/dataset.py", 41, "augment", "")
RESIZE = ("/home/u/dataset.py", 44, "augment", "PIL.Image.Image.resize")
READ = ("/home/u/dataset.py", 12, "__getitem__", "time.sleep")


def _loader_ctx(cores_each: float, stack_frames=(), host_cpu_pct=50.0):
    # a timed DataLoader: 10 ms steps after a 10 ms wait each (50% stall)
    # busy workers are preempted (they want the CPU); sleeping ones switch voluntarily
    invol = 0.5 if cores_each > 0.5 else 0.02
    pool = WorkerPool(0, ((0, cores_each * 10), (1, cores_each * 10)), 10.0, invol)
    return make_ctx(
        [10.0] * 100,
        [10.0] * 100,
        explicit_wait=True,
        worker_pools=(pool,),
        host_cpu_pct=host_cpu_pct,
        cpu_count=8,
        run_cpu_cores=2.0 * cores_each + 1,
        stack_frames=tuple(stack_frames),
    )


def test_cpu_bound_loader_names_the_hot_user_function():
    rows = [frame(AUGMENT, 0, 48, "loader"), frame(RESIZE, 0, 52, "loader")]
    rows += [frame(SAVE, 5, 90)]  # the training thread's frames are not the workers'
    ins = cpu_bound_dataloader(_loader_ctx(0.9, rows))
    assert ins is not None
    assert ins.detail.endswith(
        "The workers spend 52% of their time in PIL.Image.Image.resize, called from "
        "dataset.py:44 (augment); 48% in dataset.py:41 (augment)."
    )
    assert ins.fix.startswith("Make PIL.Image.Image.resize from dataset.py:44 cheaper. ")
    assert [f["line"] for f in ins.evidence["loader_frames"]] == [44, 41]


def test_cpu_bound_loader_without_worker_samples_keeps_its_wording():
    ins = cpu_bound_dataloader(_loader_ctx(0.9))
    assert ins is not None and "of their time" not in ins.detail
    assert ins.evidence["loader_frames"] == []


def test_sleeping_workers_are_not_cpu_bound_and_the_stall_names_the_blocking_call():
    rows = [frame(READ, 0, 95, "loader")]
    ctx = _loader_ctx(0.01, rows)
    assert cpu_bound_dataloader(ctx) is None  # they sat idle: not CPU-bound
    ins = dataloader_stall(ctx)
    assert "sat idle" in ins.detail
    assert ins.detail.endswith(
        "The workers wait 100% of their time in time.sleep, called from dataset.py:12 "
        "(__getitem__)."
    )
    assert ins.fix.startswith("Keep more batches in flight: raise DataLoader num_workers")
    assert "Or make time.sleep from dataset.py:12 wait less" in ins.fix
    assert ins.evidence["loader_frames"][0]["call"] == "time.sleep"


def test_steady_gap_counts_merged_steps_but_not_the_start_up_gap():
    # step 0's gap (building the model) and the steps merged past the shim's bound
    rows = [frame(LOG, 0, 500), frame(SAVE, 1 << 40, 30), frame(SAVE, 5, 10)]
    ins = dataloader_stall(make_ctx([5.0] * 200, [3.0] * 200, stack_frames=tuple(rows)))
    assert [(f["line"], f["samples"]) for f in ins.evidence["frames"]] == [(212, 40)]
