"""The summary's MFU figures and line: the H200 fixture's GPT gives the MFU
its README states; every reason for "unknown" is named; nothing is said on
a CPU run with nothing declared."""

from __future__ import annotations

import json

import pytest

from gpuprof.summary import format_summary, make_summary, mfu_figures, mfu_line

from .insights.conftest import H200, make_ctx


def test_fixture_gpt_mfu_matches_the_hand_computation():
    e = json.loads((H200 / "steps.json").read_text())["trace_sdpa"]
    step_ms = [s * 1e3 for s in e["step_s"]]
    flops = e["flops_per_step_flopcounter"]
    ctx = make_ctx(
        step_ms,
        gpu_model="NVIDIA H200",
        gpu_count=1,
        dtype="bfloat16",
        flops_per_step=flops,
        flops_source="counter",
    )
    fig = mfu_figures(ctx)
    achieved = flops / (ctx.median_step_ms / 1e3) / 1e12
    assert fig["achieved_tflops"] == pytest.approx(achieved, abs=0.01)
    assert fig["mfu"] == pytest.approx(achieved / 989.4, abs=1e-4)
    assert 0.30 < fig["mfu"] < 0.32  # the fixture README: 31 %
    line = mfu_line(fig)
    assert (
        line is not None
        and line.startswith("  MFU 30.")
        and "3.37e+12 FLOP/step from counter" in line
    )
    summary = make_summary(1, ctx, [], "/d")
    assert (summary["mfu"], summary["achieved_tflops"]) == (fig["mfu"], fig["achieved_tflops"])
    assert line in format_summary(summary).splitlines()


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"gpu_model": "NVIDIA H200", "dtype": "bf16"}, "no FLOP count"),
        ({"gpu_model": "NVIDIA B200", "dtype": "bf16", "flops_per_step": 1e12}, "not in gpuprof's"),
        ({"gpu_model": "NVIDIA A10G", "dtype": "bf16", "flops_per_step": 1e12}, "not in gpuprof's"),
        ({"gpu_model": "NVIDIA H200", "flops_per_step": 1e12}, "training dtype unknown"),
        (
            {"gpu_model": "NVIDIA A100-SXM4-80GB", "dtype": "fp8", "flops_per_step": 1e12},
            "no fp8 peak",
        ),
        ({"flops_per_step": 1e12}, "no GPU"),
    ],
)
def test_unknown_mfu_names_its_reason(kw, why):
    fig = mfu_figures(make_ctx([10.0] * 12, gpu_count=1 if "gpu_model" in kw else 0, **kw))
    assert fig["mfu"] is None and why in fig["mfu_unknown"]
    assert mfu_line(fig).startswith("  MFU unknown: ")
    if "flops_per_step" in kw:  # 1e12 FLOP in 10 ms: 100 TFLOP/s whatever the GPU
        assert fig["achieved_tflops"] == 100.0


def test_cpu_run_with_nothing_declared_says_nothing():
    fig = mfu_figures(make_ctx([10.0] * 12))
    assert fig["mfu_unknown"] is None and mfu_line(fig) is None
