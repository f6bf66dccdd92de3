"""Kernel rules and KernelStats, on windows built from the real H200 and A100 traces."""

from __future__ import annotations

import json
import statistics

import pytest

from gpuprof.insights import build_context, registered_rules, run_rules
from gpuprof.insights.aggregates import KernelStats
from gpuprof.insights.kernels import (
    DRIFT_GROWTH,
    GEMM_RE,
    LAUNCH_GAP_MIN,
    RECOMPUTE_RATIO_MIN,
    TINY_KERNEL_US,
    gradient_checkpointing_detected,
    has_fused_attention,
    kernel_drift,
    kernel_drifts,
    kernel_launch_overhead,
    kernel_stats,
    sdpa_suboptimal,
    softmax_kernels,
)
from gpuprof.kernels import KernelAgg, aggregate_trace
from tests.gpuprof.trace_fixtures import A100, H200, load_trace

from .conftest import make_ctx

ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
KERNEL_RULES = (
    "sdpa_suboptimal",
    "kernel_drift",
    "kernel_launch_overhead",
    "gradient_checkpointing_detected",
)


def _stored(folder, name, window=None, steps=None, source="snapshot"):
    """The trace's windows as the daemon stores them (optionally naming their steps)."""
    out = []
    for w in aggregate_trace(load_trace(folder, name), window=window):
        window_dict, rows = w.as_stored(source)
        if steps is not None:
            window_dict["steps"] = list(steps)
        out.append((window_dict, rows))
    return out


def _stats(folder, name, **kw) -> KernelStats:
    st = kernel_stats(_stored(folder, name, **kw))
    assert st is not None
    return st


def _steps_json() -> dict:
    path = H200 / "steps.json"
    if not path.exists():
        pytest.fail(f"H200 fixture missing at {path}: tests/fixtures/ is part of the repository")
    return json.loads(path.read_text())


def test_rules_are_registered():
    assert set(KERNEL_RULES) <= set(registered_rules())


def test_rules_are_silent_without_kernels():
    ctx = make_ctx([10.0] * 10, phase_ms={"forward": 300.0, "backward": 900.0})
    for name in KERNEL_RULES:
        assert registered_rules()[name](ctx) is None, name


# --- kernel_stats ------------------------------------------------------------------------------


def test_kernel_stats_of_the_math_trace():
    st = _stats(H200, "trace_math.json.gz")
    assert (st.windows, st.source, st.device_ns) == (1, "snapshot", 50_185_516)
    top = st.top
    assert len(top) == 10
    assert "direct_copy_kernel_cuda" in top[0].name
    assert (round(top[0].share, 4), top[0].count, round(top[0].mean_us, 1)) == (0.1506, 102, 74.1)
    assert "masked_fill_kernel" in top[1].name and round(top[1].mean_us, 1) == 367.9
    assert st.class_share["compute"] == pytest.approx(0.9574, abs=0.0005)
    assert st.class_share["memcpy"] == pytest.approx(0.0405, abs=0.0005)
    assert st.median_kernel_us == pytest.approx(32.4, abs=0.05)
    # no step annotations in the H200 traces: no per-step figures
    assert st.series_unit == "window" and st.kernels_per_step is None
    assert st.device_series == pytest.approx((50.185516,))
    ops = {o.name: o for o in st.ops}
    assert ops["aten::bmm"].self_ns == 3_918_151
    assert st.op_flops is None  # the chrome export carries no FLOPs


def test_kernel_stats_row_shapes_and_sources_agree():
    """KernelAgg rows, kernel_stats row mappings and wire rows give the same stats;
    continuous windows win over snapshots (they would double count)."""
    ((window, rows),) = _stored(H200, "trace_sdpa.json.gz", steps=[0, 1])
    as_agg = kernel_stats([(window, rows)])
    as_maps = kernel_stats([(window, [r.__dict__ for r in rows])])
    as_wire = kernel_stats([(window, [r.to_wire() for r in rows])])
    assert as_agg == as_maps == as_wire
    assert as_agg.kernels_per_step == 312 and as_agg.device_ms_per_step == (9.33925,)
    snap = dict(window, source="snapshot")
    cont = dict(window, source="continuous", t0=window["t1"], t1=window["t1"] + 10**7)
    tiny = [KernelAgg("k", "kernel", "compute", 1, 1000, 1000)]
    both = kernel_stats([(snap, rows), (cont, tiny)])
    assert both.source == "continuous" and both.device_ns == 1000 and both.windows == 1
    assert kernel_stats([]) is None
    assert kernel_stats([(window, [r for r in rows if r.kind == "op"])]) is None


def test_build_context_takes_kernel_windows_and_the_declared_arch():
    windows = _stored(A100, "dlrm8_baseline_rank3.json.gz", window="step")
    t0 = windows[0][0]["t0"]
    steps = [{"t0": w["t0"], "t1": w["t1"], "wait": 0, "phases": {}} for w, _ in windows]
    run = {
        "run_name": "dlrm",
        "status": "finished",
        "start_mono_ns": t0,
        "options": {"arch": {"checkpointing": True}},
    }
    ctx = build_context(run, steps, kernel_windows=windows)
    assert ctx.kernels == kernel_stats(windows)
    assert ctx.kernels.windows == 6 and ctx.kernels.series_unit == "step"
    assert ctx.kernels.kernels_per_step == 1575
    assert ctx.checkpointing_declared is True
    assert build_context(run, steps).kernels is None
    for options, declared in (
        ({}, None),
        ({"arch": {}}, None),
        ({"arch": "gpt"}, None),
        ({"arch": {"checkpointing": False}}, False),
    ):
        assert build_context(dict(run, options=options), steps).checkpointing_declared is declared


# --- sdpa_suboptimal ------------------------------------------------------------------------------


def test_sdpa_suboptimal_fires_on_hand_written_attention():
    st = _stats(H200, "trace_math.json.gz")
    assert not has_fused_attention(st)
    soft = softmax_kernels(st)
    assert len(soft) == 2
    assert "softmax_warp_backward" in soft[0].name and "softmax_warp_forward" in soft[1].name
    insight = sdpa_suboptimal(make_ctx([27.0] * 20, kernels=st))
    assert insight is not None and insight.severity == "HIGH"
    assert insight.evidence["softmax_share"] == pytest.approx(0.1036, abs=0.0005)
    assert insight.evidence["gemm_share"] == pytest.approx(0.2293, abs=0.0005)
    assert "10.4%" in insight.title
    assert "scaled_dot_product_attention" in insight.fix
    assert any(i.rule == "sdpa_suboptimal" for i in run_rules(make_ctx([27.0] * 20, kernels=st)))


def test_sdpa_suboptimal_silent_on_the_sdpa_trace():
    """Attention ran in cuDNN kernels; the only softmax is the loss's log-softmax."""
    st = _stats(H200, "trace_sdpa.json.gz")
    assert has_fused_attention(st)
    assert softmax_kernels(st) == []
    log_softmax = [k for k in st.kernels if "SoftMax" in k.name]
    assert len(log_softmax) == 2 and sum(k.share for k in log_softmax) > 0.03  # excluded as log
    assert st.share_of(GEMM_RE) == pytest.approx(0.4078, abs=0.0005)
    assert sdpa_suboptimal(make_ctx([11.0] * 20, kernels=st)) is None


def test_sdpa_suboptimal_silent_once_any_fused_attention_ran():
    ((window, rows),) = _stored(H200, "trace_math.json.gz")
    flash = KernelAgg(
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>",
        "kernel",
        "compute",
        8,
        1_000_000,
        1_000_000,
    )
    assert (
        sdpa_suboptimal(make_ctx([27.0], kernels=kernel_stats([(window, [*rows, flash])]))) is None
    )
    op = KernelAgg("aten::_scaled_dot_product_flash_attention", "op", "compute", 8, 10, 10)
    assert sdpa_suboptimal(make_ctx([27.0], kernels=kernel_stats([(window, [*rows, op])]))) is None


def test_sdpa_suboptimal_needs_matmuls_beside_the_softmax():
    window = {"t0": 0, "t1": 10**7, "source": "snapshot", "steps": [1]}
    rows = [
        KernelAgg(
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, "
            "false, false>(float*)",
            "kernel",
            "compute",
            1,
            500,
            500,
        ),
        KernelAgg("elementwise_add", "kernel", "compute", 1, 9_500, 9_500),
    ]
    assert sdpa_suboptimal(make_ctx([1.0], kernels=kernel_stats([(window, rows)]))) is None
    rows.append(KernelAgg("sm90_xmma_gemm_bf16", "kernel", "compute", 1, 5_000, 5_000))
    assert sdpa_suboptimal(make_ctx([1.0], kernels=kernel_stats([(window, rows)]))) is not None
    # a log-softmax in softmax_warp_forward (5th template argument true) is not attention
    rows[0] = KernelAgg(
        rows[0].name.replace("10, false", "10, true"), "kernel", "compute", 1, 500, 500
    )
    assert sdpa_suboptimal(make_ctx([1.0], kernels=kernel_stats([(window, rows)]))) is None


# --- kernel_drift ---------------------------------------------------------------------------------


def _dlrm_baseline_then_slower():
    return _stored(A100, "dlrm8_baseline_rank3.json.gz", window="step") + _stored(
        A100, "dlrm8_slower_rank1.json.gz", window="step"
    )


def test_kernel_drift_fires_on_baseline_then_slower_dlrm():
    """Six baseline steps then six steps of the slower run: AllReduce went from 5.48 to 15.35
    ms per step (+9.87 ms, 2.8x). The slower run also copies device-to-device 4,645 times
    (+15.0 ms per step), the largest growth, so the title names that and the evidence both."""
    st = kernel_stats(_dlrm_baseline_then_slower())
    assert st.windows == 12 and st.series_unit == "step"
    drifts = {d.name: d for d in kernel_drifts(st)}
    ar = drifts[ALL_REDUCE]
    assert (round(ar.first_ms, 2), round(ar.second_ms, 2)) == (5.48, 15.35)
    assert ar.added_ms == pytest.approx(9.87, abs=0.01) and ar.growth > DRIFT_GROWTH
    assert ar.cls == "comm"
    # SendRecv grew 25 %: not drift
    assert not any("SendRecv" in n for n in drifts)
    insight = kernel_drift(make_ctx([80.0] * 12, kernels=st))
    # +15.0 ms on 83.6 ms of kernels per step in the first half: 18 %, under the 20 % of HIGH
    assert insight is not None and insight.severity == "MED"
    assert insight.evidence["first_half_device_ms"] == pytest.approx(83.59, abs=0.01)
    assert insight.evidence["kernel"] == "Memcpy DtoD (Device -> Device)"
    assert insight.evidence["added_ms"] == pytest.approx(15.03, abs=0.01)
    assert (
        "ncclKernel_AllReduce_RING_LL_Sum_float" in insight.detail and "+9.9 ms" in insight.detail
    )
    grown = {g["kernel"]: g for g in insight.evidence["grown"]}
    assert grown[ALL_REDUCE]["added_ms"] == pytest.approx(9.87, abs=0.01)
    assert "ms per step" in insight.title


def test_kernel_drift_names_all_reduce_when_it_grew_most():
    """Without the slower run's extra copies, the AllReduce growth is the finding."""
    windows = [
        (w, [r for r in rows if not r.name.startswith("Memcpy DtoD")])
        for w, rows in _dlrm_baseline_then_slower()
    ]
    insight = kernel_drift(make_ctx([80.0] * 12, kernels=kernel_stats(windows)))
    assert insight is not None
    assert insight.evidence["kernel"] == ALL_REDUCE and insight.evidence["class"] == "comm"
    assert "straggler" in insight.fix
    assert "+9.9 ms per step" in insight.title


def test_kernel_drift_silent_on_steady_windows():
    """The baseline's six steps alone: SendRecv varies 12.8-27.9 ms per step (+41 % between
    halves), under the 50 % bar; nothing else moves."""
    st = kernel_stats(_stored(A100, "dlrm8_baseline_rank3.json.gz", window="step"))
    sr = next(v for n, v in st.series.items() if "SendRecv" in n)
    assert statistics.mean(sr[3:]) / statistics.mean(sr[:3]) == pytest.approx(1.41, abs=0.01)
    assert kernel_drifts(st) == []
    assert kernel_drift(make_ctx([77.0] * 6, kernels=st)) is None


def test_kernel_drift_needs_enough_windows_and_a_first_half():
    slow = _stored(A100, "dlrm8_slower_rank1.json.gz", window="step")
    base = _stored(A100, "dlrm8_baseline_rank3.json.gz", window="step")
    # 3 windows: too few halves to compare
    assert kernel_drift(make_ctx([1.0], kernels=kernel_stats(base[:2] + slow[:1]))) is None
    # a kernel absent from the first half is not drift
    new = KernelAgg("eval_only_kernel", "kernel", "compute", 5, 50_000_000, 50_000_000)
    windows = [(w, list(rows) + ([new] if i >= 3 else [])) for i, (w, rows) in enumerate(base)]
    assert kernel_drift(make_ctx([1.0], kernels=kernel_stats(windows))) is None


# --- kernel_launch_overhead -----------------------------------------------------------------------


def _tiny_kernel_windows(n_steps=6, kernels_per_step=400, kernel_ns=3_000, wall_ns=2_000_000):
    """Steps of many 3 µs elementwise kernels (what the H200 'tiny_kernels' phase ran)."""
    out = []
    for i in range(n_steps):
        t0 = i * wall_ns
        rows = [
            KernelAgg(
                "void at::native::vectorized_elementwise_kernel<4, AddFunctor>",
                "kernel",
                "compute",
                kernels_per_step,
                kernels_per_step * kernel_ns,
                kernels_per_step * kernel_ns,
            ),
        ]
        out.append(({"t0": t0, "t1": t0 + wall_ns, "source": "snapshot", "steps": [i]}, rows))
    return out


def test_launch_overhead_fires_on_many_tiny_kernels():
    st = kernel_stats(_tiny_kernel_windows())
    insight = kernel_launch_overhead(make_ctx([2.0] * 10, kernels=st))
    assert insight is not None
    ev = insight.evidence
    assert ev["kernel_ms_per_step"] == 1.2 and ev["step_ms"] == 2.0
    assert ev["gap"] == 0.4 and ev["median_kernel_us"] == 3.0 and ev["kernels_per_step"] == 400
    assert ev["idle_per_launch_us"] == 2.0
    assert "40%" in insight.title and "torch.compile" in insight.fix
    # with no step times in the context, the windows' own wall time per step is used
    assert kernel_launch_overhead(make_ctx([], kernels=st)) is not None


def test_launch_overhead_silent_on_the_sdpa_gpt():
    """The fused-SDPA GPT: median step 11.06 ms (steps.json), 9.34 ms of kernels per step
    (the trace's 2 steps): the step is 15.6 % over its kernel time, but the median launch
    runs 15.0 µs: the GPU is busy with real kernels, not waiting on tiny ones."""
    step_ms = [s * 1e3 for s in _steps_json()["trace_sdpa"]["step_s"]]
    st = _stats(H200, "trace_sdpa.json.gz", steps=[0, 1])
    gap = 1 - st.device_ms_per_step[0] / statistics.median(step_ms[3:])
    assert gap == pytest.approx(0.156, abs=0.002) and gap > LAUNCH_GAP_MIN
    assert (
        st.median_kernel_us == pytest.approx(15.0, abs=0.05)
        and st.median_kernel_us > TINY_KERNEL_US
    )
    assert kernel_launch_overhead(make_ctx(step_ms, kernels=st)) is None


def test_launch_overhead_silent_when_the_gap_is_not_launches():
    """The A100 ResNet: 222 ms steps, 51-62 ms of kernels, 1,258 launches: 136 µs idle per
    launch is a loader or host work, not launch cost."""
    st = _stats(A100, "ddp2_resnet_rank0.json.gz", window="step")
    assert st.kernels_per_step == 1258
    assert kernel_launch_overhead(make_ctx([], kernels=st)) is None
    # the same gap made of tiny kernels, but 150 µs idle each: not launch-bound either
    slow = kernel_stats(_tiny_kernel_windows(kernels_per_step=100, wall_ns=15_300_000))
    assert kernel_launch_overhead(make_ctx([15.3] * 10, kernels=slow)) is None
    # a GPU busy 95 % of the step: silent
    busy = kernel_stats(_tiny_kernel_windows(wall_ns=1_260_000))
    assert kernel_launch_overhead(make_ctx([1.26] * 10, kernels=busy)) is None
    # few launches per step: silent
    few = kernel_stats(_tiny_kernel_windows(kernels_per_step=50, wall_ns=200_000))
    assert kernel_launch_overhead(make_ctx([0.2] * 10, kernels=few)) is None


# --- gradient_checkpointing_detected --------------------------------------------------------------


def _phases(model: str) -> dict[str, float]:
    ph = _steps_json()[model]["phases"]
    return {
        "forward": sum(p["forward_ms"] for p in ph),
        "backward": sum(p["backward_ms"] for p in ph),
    }


def test_checkpointing_silent_on_the_h200_gpt_without_checkpointing():
    """steps.json: backward/forward 1.85 (SDPA) and 1.48 (hand-written attention)."""
    for model, ratio in (("trace_sdpa", 1.85), ("trace_math", 1.48)):
        phases = _phases(model)
        assert phases["backward"] / phases["forward"] == pytest.approx(ratio, abs=0.005)
        for declared in (False, None):
            ctx = make_ctx([11.0] * 20, phase_ms=phases, checkpointing_declared=declared)
            assert gradient_checkpointing_detected(ctx) is None


def test_checkpointing_undeclared_recompute_fires():
    phases = _phases("trace_sdpa")
    recompute = {"forward": phases["forward"], "backward": phases["forward"] * 3.0}
    ctx = make_ctx([11.0] * 20, phase_ms=recompute, checkpointing_declared=False)
    insight = gradient_checkpointing_detected(ctx)
    assert insight is not None and insight.severity == "MED"
    assert insight.evidence["backward_forward_ratio"] == 3.0
    assert "3.0x" in insight.title and "checkpointing=True" in insight.fix
    # just under the bar: silent
    under = {"forward": 100.0, "backward": 100.0 * RECOMPUTE_RATIO_MIN - 1}
    assert (
        gradient_checkpointing_detected(
            make_ctx([1.0], phase_ms=under, checkpointing_declared=False)
        )
        is None
    )
    # not declared either way: silent
    assert gradient_checkpointing_detected(make_ctx([11.0] * 20, phase_ms=recompute)) is None


def test_checkpointing_declared_but_not_recomputing_fires():
    ctx = make_ctx([11.0] * 20, phase_ms=_phases("trace_sdpa"), checkpointing_declared=True)
    insight = gradient_checkpointing_detected(ctx)
    assert insight is not None and insight.severity == "LOW"
    assert insight.evidence["backward_forward_ratio"] == pytest.approx(1.846, abs=0.001)
    assert "declared" in insight.title


def test_checkpointing_silent_when_collectives_fill_the_backward():
    """DDP all-reduces land in the backward phase: with 28 % of kernel time in NCCL (the
    A100 ResNet) the ratio says nothing."""
    st = _stats(A100, "ddp2_resnet_rank0.json.gz")
    assert st.class_share["comm"] == pytest.approx(0.2838, abs=0.001)
    ctx = make_ctx(
        [220.0] * 3,
        phase_ms={"forward": 100.0, "backward": 300.0},
        checkpointing_declared=False,
        kernels=st,
    )
    assert gradient_checkpointing_detected(ctx) is None


def test_kernel_stats_per_step_figures_and_op_flops():
    gemm = KernelAgg("sm90_xmma_gemm", "kernel", "compute", 10, 800_000, 800_000)
    nccl = KernelAgg(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "kernel", "comm", 2, 200_000, 200_000
    )
    mm = KernelAgg("aten::mm", "op", "compute", 10, 800_000, 800_000, 3e12)
    ar = KernelAgg("c10d::allreduce_", "op", "comm", 2, 200_000, 200_000, None)
    windows = [
        ({"t0": 0, "t1": 4_000_000, "source": "continuous", "steps": [1, 2]}, [gemm, nccl, mm, ar]),
        ({"t0": 4_000_000, "t1": 6_000_000, "source": "continuous", "steps": [3]}, [gemm, mm]),
    ]
    st = kernel_stats(windows)
    assert st.device_ms_per_step == (0.5, 0.8) and st.wall_ms_per_step == (2.0, 2.0)
    assert st.kernels_per_step == 8.0  # median of 6 (12 launches, 2 steps) and 10
    assert st.series["sm90_xmma_gemm"] == (0.4, 0.8) and st.device_series == (0.5, 0.8)
    assert st.class_share["comm"] == pytest.approx(0.2 / 1.8)
    # 10 launches of 80 µs, 2 of 100 µs
    assert st.median_kernel_us == 80.0
    assert st.op_flops == 6e12 and st.op_flops_per_step == 2e12
    assert {o.name: o.cls for o in st.ops} == {"aten::mm": "compute", "c10d::allreduce_": "comm"}
    assert [k.name for k in st.top] == ["sm90_xmma_gemm", nccl.name]


def test_kernel_drift_leaves_warm_up_snapshots_out():
    """trace_every_n_steps=200 snapshots steps 0, 1, 5, 200, 400, 600. A kernel that
    did not run in the warm-up steps 0 and 1 (autotuning ran other candidates, an
    optimizer's state was being created) is not a kernel that slowed down later; the
    baseline's steps are steady, so nothing drifts once the warm-up windows are out."""
    base = _stored(A100, "dlrm8_baseline_rank3.json.gz", window="step")
    top = max((r for r in base[0][1] if r.kind == "kernel"), key=lambda r: r.total_ns).name
    windows = []
    for i, ((w, rows), step) in enumerate(zip(base, [0, 1, 5, 200, 400, 600], strict=True)):
        keep = [r for r in rows if i >= 2 or r.name != top]
        windows.append(({**w, "steps": [step]}, keep))
    st = kernel_stats(windows)
    assert kernel_drift(make_ctx([80.0] * 6, kernels=st)) is None
    # the same windows later in the run (steps >= 10): the kernel's growth is drift
    later = [({**w, "steps": [w["steps"][0] + 1000]}, rows) for w, rows in windows]
    insight = kernel_drift(make_ctx([80.0] * 6, kernels=kernel_stats(later)))
    assert insight is not None and insight.evidence["kernel"] == top
