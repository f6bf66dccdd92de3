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
