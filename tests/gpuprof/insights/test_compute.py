from __future__ import annotations

import pytest

from gpuprof.insights.compute import flops_mismatch, low_mfu, run_mfu

from .conftest import make_ctx


def _gpt_ctx(record: dict, **kw):
    return make_ctx(
        [s * 1e3 for s in record["step_s"]],
        gpu_model="NVIDIA H200",
        gpu_count=1,
        flops_per_step=float(record["flops_per_step_flopcounter"]),
        dtype="bf16",
        **kw,
    )


def test_low_mfu_fires_on_h200_hand_written_attention(h200_steps):
    ctx = _gpt_ctx(h200_steps["trace_math"])
    m = run_mfu(ctx)
    # fixture README: 27.02 ms median, 3.30e12 FLOP → ~122 TFLOP/s, ~12 % of 989
    assert m.achieved_tflops == pytest.approx(122, rel=0.03)
    assert m.mfu == pytest.approx(0.123, abs=0.005)
    ins = low_mfu(ctx)
    assert ins is not None and ins.severity == "MED"
    assert "of 989 TFLOP/s bf16 peak" in ins.title


def test_low_mfu_silent_on_h200_fused_sdpa(h200_steps):
    ctx = _gpt_ctx(h200_steps["trace_sdpa"])
    assert run_mfu(ctx).mfu == pytest.approx(0.307, abs=0.005)  # 304 TFLOP/s
    assert low_mfu(ctx) is None


def test_low_mfu_high_below_ten_percent():
    ctx = make_ctx(
        [100.0] * 10,
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_count=1,
        flops_per_step=5e12,
        dtype="torch.bfloat16",
    )
    assert run_mfu(ctx).mfu == pytest.approx(50 / 989.4, rel=1e-6)
    assert low_mfu(ctx).severity == "HIGH"


@pytest.mark.parametrize(
    "kw",
    [
        {"gpu_model": None, "gpu_count": 0},  # CPU run
        {"gpu_model": "NVIDIA GeForce GT 710", "gpu_count": 1},  # not in the table
        {"gpu_model": "NVIDIA H200", "gpu_count": 1, "flops_per_step": None},
        {"gpu_model": "NVIDIA H200", "gpu_count": 1, "dtype": None},
    ],
)
def test_mfu_unknown_is_silent_not_guessed(kw):
    base = {"flops_per_step": 1e9, "dtype": "bf16"}
    base.update(kw)
    ctx = make_ctx([100.0] * 10, **base)
    assert run_mfu(ctx) is None
    assert low_mfu(ctx) is None


# --- flops_mismatch ----------------------------------------------------------


def test_flops_mismatch_fires_on_a_wrong_tokens_per_step():
    # the fresh-user case: tokens_per_step 10x too large, one step counted
    ctx = make_ctx([10.0] * 10, flops_per_step=2.164e10, flops_source="arch", flops_counted=2.01e9)
    ins = flops_mismatch(ctx)
    assert ins is not None and ins.evidence["off"] == pytest.approx(9.766, abs=1e-3)
    assert "tokens_per_step" in ins.fix


def test_flops_mismatch_silent_when_they_agree_or_nothing_was_declared():
    # the fixture GPT: arch 3.2985e12 vs FlopCounterMode 3.367e12 on SDPA (-2 %)
    agree = make_ctx(
        [10.0] * 10, flops_per_step=3.2985e12, flops_source="arch", flops_counted=3.367e12
    )
    assert flops_mismatch(agree) is None
    counted_only = make_ctx(
        [10.0] * 10, flops_per_step=2.01e9, flops_source="counter", flops_counted=2.01e9
    )
    assert flops_mismatch(counted_only) is None
    never_counted = make_ctx([10.0] * 10, flops_per_step=2.0e10, flops_source="user")
    assert flops_mismatch(never_counted) is None
