"""gpuprof.kernels: classification, folding, chrome-trace and torch.profiler aggregation,
checked against the real H200 and A100 traces in tests/fixtures."""

from __future__ import annotations

import copy
import json

import pytest

from gpuprof.kernels import (
    KERNEL_CLASSES,
    MAX_NAME_CHARS,
    MAX_ROWS,
    OTHER_ROW_NAME,
    KernelAgg,
    aggregate_events,
    aggregate_trace,
    class_shares,
    display_name,
    fold,
    fold_counted,
    kernel_class,
    shorten_name,
)

from .trace_fixtures import A100, H200, load_trace

ALL_TRACES = [
    (H200, "trace_math.json.gz"),
    (H200, "trace_sdpa.json.gz"),
    (A100, "ddp2_resnet_rank0.json.gz"),
    (A100, "dlrm8_baseline_rank3.json.gz"),
    (A100, "dlrm8_slower_rank1.json.gz"),
    (A100, "ws128_sampled_rank0.json.gz"),
    (A100, "ws128_sampled_rank1.json.gz"),
]


def _kernels(rows) -> dict[str, KernelAgg]:
    return {r.name: r for r in rows if r.kind == "kernel"}


def _ops(rows) -> dict[str, KernelAgg]:
    return {r.name: r for r in rows if r.kind == "op"}


# --- classes and names ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "category", "cls"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel", "comm"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None, "comm"),
        ("void ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "kernel", "comm"),
        ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", "memcpy"),
        ("Memcpy DtoD (Device -> Device)", None, "memcpy"),
        ("Memset (Device)", "gpu_memset", "memset"),
        ("Memset (Device)", None, "memset"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "kernel", "compute"),
        ("volta_sgemm_128x32_nt", None, "compute"),
        # a name does not make a kernel NCCL unless it starts like one
        ("my_ncclKernel_lookalike", "kernel", "compute"),
        # the category wins over the name
        ("weird copy name", "gpu_memcpy", "memcpy"),
        ("something", "gpu_unknown_activity", "other"),
    ],
)
def test_kernel_class(name, category, cls):
    assert kernel_class(name, category) == cls


def test_shorten_name_keeps_the_head_and_marks_the_cut():
    short = "nvjet_sm90_tst_256x128"
    assert shorten_name(short) == short
    exact = "k" * MAX_NAME_CHARS
    assert shorten_name(exact) == exact
    long = "void at::native::elementwise_kernel<" + "x" * 2000 + ">"
    cut = shorten_name(long)
    assert len(cut) == MAX_NAME_CHARS and cut.endswith("…")
    assert cut[:-1] == long[: MAX_NAME_CHARS - 1]
    assert display_name("void foo<int>(int)") == "foo<int>(int)"
    assert display_name(long, 40) == "at::native::elementwise_kernel"
    softmax = (
        "void (anonymous namespace)::softmax_warp_backward<float, float, float, 10, false, "
        "false>(float*, float const*, float const*, int, int, int, bool const*)"
    )
    assert display_name(softmax) == "softmax_warp_backward"
    assert len(display_name("x" * 100, 40)) == 40


# --- fold ---------------------------------------------------------------------------


def test_fold_merges_by_name_and_kind_most_time_first():
    rows = [
        KernelAgg("a", "kernel", "compute", 2, 100, 100),
        KernelAgg("b", "kernel", "comm", 1, 500, 500),
        KernelAgg("a", "kernel", "compute", 3, 300, 300),
        KernelAgg("a", "op", "compute", 1, 50, 10, 1e9),
        KernelAgg("a", "op", "compute", 1, 70, 20, None),
    ]
    out = fold(rows)
    assert [(r.name, r.kind) for r in out] == [("b", "kernel"), ("a", "kernel"), ("a", "op")]
    assert out[1] == KernelAgg("a", "kernel", "compute", 5, 400, 400)
    assert out[2] == KernelAgg("a", "op", "compute", 2, 120, 30, 1e9)


def test_fold_caps_rows_with_one_other_row_per_kind():
    kernels = [KernelAgg(f"k{i}", "kernel", "compute", 1, 1000 + i, 1000 + i) for i in range(300)]
    ops = [KernelAgg(f"op{i}", "op", "compute", 2, 10 + i, 5, 100.0) for i in range(20)]
    comm = [KernelAgg("nccl_small", "kernel", "comm", 1, 1, 1)]
    rows = kernels + ops + comm
    out, dropped = fold_counted(rows)
    assert len(out) == MAX_ROWS
    assert dropped == len(rows) - (MAX_ROWS - 2)
    others = {r.kind: r for r in out if r.name == OTHER_ROW_NAME}
    assert set(others) == {"kernel", "op"}
    # the cut kernel rows mixed compute and comm: class "other"; the cut ops were all compute
    assert others["kernel"].cls == "other" and others["op"].cls == "compute"
    # nothing lost: totals, counts and FLOPs survive the cut
    for kind in ("kernel", "op"):
        assert sum(r.total_ns for r in out if r.kind == kind) == sum(
            r.total_ns for r in rows if r.kind == kind
        )
        assert sum(r.count for r in out if r.kind == kind) == sum(
            r.count for r in rows if r.kind == kind
        )
    assert others["op"].flops == 100.0 * 20
    # the kept rows are the largest
    kept = [r for r in out if r.kind == "kernel" and r.name != OTHER_ROW_NAME]
    assert min(r.total_ns for r in kept) > max(
        r.total_ns for r in rows if r.kind == "kernel" and r not in kept
    )
    assert fold(rows, max_rows=400) == sorted(fold(rows, max_rows=400), key=lambda r: -r.total_ns)
    assert fold_counted(rows, max_rows=400)[1] == 0


def test_class_shares():
    rows = [
        KernelAgg("g", "kernel", "compute", 1, 600, 600),
        KernelAgg("n", "kernel", "comm", 1, 300, 300),
        KernelAgg("m", "kernel", "memcpy", 1, 100, 100),
        KernelAgg("aten::mm", "op", "compute", 1, 10_000, 10_000),  # ops are not kernel time
    ]
    shares = class_shares(rows)
    assert set(shares) == set(KERNEL_CLASSES)
    assert shares == {"compute": 0.6, "comm": 0.3, "memcpy": 0.1, "memset": 0.0, "other": 0.0}
    assert class_shares([]) == dict.fromkeys(KERNEL_CLASSES, 0.0)


# --- chrome traces: every fixture ------------------------------------------------------


@pytest.mark.parametrize(("folder", "name"), ALL_TRACES)
def test_every_fixture_trace_aggregates_sensibly(folder, name):
    trace = load_trace(folder, name)
    device_us = sum(
        e["dur"]
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    (whole,) = aggregate_trace(trace)
    assert 0 < len(whole.rows) <= MAX_ROWS
    # every kernel, copy and fill is counted once, (other) row included (µs -> ns rounding)
    assert whole.kernel_ns == pytest.approx(device_us * 1000, rel=1e-6)
    assert all(r.count > 0 and r.total_ns >= 0 and r.self_ns <= r.total_ns for r in whole.rows)
    assert sum(class_shares(whole.rows).values()) == pytest.approx(1.0)
    assert whole.t0_us < whole.t1_us
    steps = aggregate_trace(trace, window="step")
    if whole.steps:
        assert [w.steps for w in steps] == [(s,) for s in whole.steps]
        assert sum(w.kernel_ns for w in steps) <= whole.kernel_ns
        assert all(w.kernel_ns > 0 for w in steps)
    else:  # no ProfilerStep annotations (the H200 traces): one window either way
        assert steps == [whole]


def test_window_mode_is_checked():
    with pytest.raises(ValueError, match="window"):
        aggregate_trace({"traceEvents": []}, window="second")


def test_empty_trace_gives_one_empty_window():
    (w,) = aggregate_trace({"traceEvents": []})
    assert w.rows == () and w.steps == () and w.kernel_ns == 0


# --- A100: NCCL share, steps, memcpy ------------------------------------------------------


def test_dlrm_baseline_nccl_share_and_steps():
    """README: SendRecv + AllReduce NCCL kernels ~36 % of kernel time, steps #1009-#1014 of
    75-81 ms. Measured: 36.60 % of the ``kernel`` category (32.60 % of all device time,
    copies and fills included)."""
    trace = load_trace(A100, "dlrm8_baseline_rank3.json.gz")
    (whole,) = aggregate_trace(trace)
    k = _kernels(whole.rows)
    comm = {n: r for n, r in k.items() if r.cls == "comm"}
    assert set(comm) == {
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
    }
    kernel_time = sum(r.total_ns for r in k.values() if r.cls in ("compute", "comm"))
    assert sum(r.total_ns for r in comm.values()) / kernel_time == pytest.approx(0.3660, abs=0.001)
    shares = class_shares(whole.rows)
    assert shares["comm"] == pytest.approx(0.3260, abs=0.001)
    assert shares["memcpy"] == pytest.approx(0.1067, abs=0.001)
    assert shares["memset"] == pytest.approx(0.0025, abs=0.0005)
    top = next(r for r in whole.rows if r.kind == "kernel")
    assert top.name.startswith("ncclKernel_SendRecv") and top.count == 42
    # operators take the class of their kernels' time
    assert _ops(whole.rows)["record_param_comms"].cls == "comm"
    assert _ops(whole.rows)["aten::mm"].cls == "compute"
    assert top.total_ns / whole.kernel_ns == pytest.approx(0.2605, abs=0.001)
    h2d = k["Memcpy HtoD (Pinned -> Device)"]
    assert (h2d.cls, h2d.count) == ("memcpy", 150)
    assert k["ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"].total_ns == 32_880_000
    assert whole.steps == (1009, 1010, 1011, 1012, 1013, 1014)

    steps = aggregate_trace(trace, window="step")
    walls = [w.wall_us / 1000 for w in steps]
    assert walls == pytest.approx([75.473, 76.940, 76.212, 76.727, 78.473, 81.120], abs=0.001)
    # kernels follow their launch into the step: every step launches the same 1,575
    assert [sum(r.count for r in w.rows if r.kind == "kernel") for w in steps] == [1575] * 6
    assert [round(w.kernel_ns / 1e6, 1) for w in steps] == [68.6, 78.3, 90.2, 85.2, 91.7, 87.6]


def test_dlrm_slower_run_all_reduce_grew_about_3x():
    """README: the slower run's NCCL AllReduce time is ~3x the baseline's (measured 2.80x)."""
    base = _kernels(aggregate_trace(load_trace(A100, "dlrm8_baseline_rank3.json.gz"))[0].rows)
    slow = _kernels(aggregate_trace(load_trace(A100, "dlrm8_slower_rank1.json.gz"))[0].rows)
    name = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
    assert slow[name].total_ns == 92_082_000
    assert slow[name].total_ns / base[name].total_ns == pytest.approx(2.80, abs=0.01)


def test_nccl_dev_kernel_names_are_comm():
    """Newer NCCL (2.19+) names its kernels ncclDevKernel_*: rename the ResNet trace's
    AllReduce kernels that way and the comm share (28.38 %) must not move."""
    trace = load_trace(A100, "ddp2_resnet_rank0.json.gz")
    (before,) = aggregate_trace(trace)
    renamed = copy.deepcopy(trace)
    new_name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    n = 0
    for e in renamed["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_AllReduce"):
            e["name"] = new_name
            n += 1
    assert n == 15
    (after,) = aggregate_trace(renamed)
    assert class_shares(before.rows)["comm"] == pytest.approx(0.2838, abs=0.001)
    assert class_shares(after.rows)["comm"] == class_shares(before.rows)["comm"]
    row = _kernels(after.rows)[new_name]
    assert (row.cls, row.count, row.total_ns) == ("comm", 15, 46_762_159)


# --- H200: hand-written vs fused attention ---------------------------------------------------


def test_math_attention_top_kernels():
    """README: the hand-written attention's top kernels are copies, masked_fill, mul, bmm and
    softmax. Measured over the trace's 2 steps (50.19 ms of device time)."""
    (w,) = aggregate_trace(load_trace(H200, "trace_math.json.gz"))
    assert w.kernel_ns == 50_185_516
    kernels = [r for r in w.rows if r.kind == "kernel"]
    top = [(r.name, round(r.total_ns / w.kernel_ns, 4), r.count) for r in kernels[:6]]
    assert "direct_copy_kernel_cuda" in top[0][0] and top[0][1:] == (0.1506, 102)
    assert "masked_fill_kernel" in top[1][0] and top[1][1:] == (0.1173, 16)
    assert "bfloat16_copy_kernel_cuda" in top[2][0] and top[2][1:] == (0.0763, 118)
    assert top[3] == ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 0.0638, 42)
    assert "softmax_warp_backward" in top[4][0] and top[4][1:] == (0.0587, 8)
    assert "MulFunctor" in top[5][0] and top[5][1:] == (0.0587, 8)
    assert class_shares(w.rows)["memcpy"] == pytest.approx(0.0405, abs=0.0005)  # 16 DtoD copies
    assert not any("sdpa" in r.name or "flash" in r.name for r in kernels)


def test_sdpa_trace_runs_attention_in_cudnn_kernels():
    (w,) = aggregate_trace(load_trace(H200, "trace_sdpa.json.gz"))
    assert w.kernel_ns == 18_678_500  # 9.34 ms per step (2 steps) vs 25.09 for math attention
    k = _kernels(w.rows)
    cudnn = {n: r for n, r in k.items() if n.startswith("cudnn_generated_fort_native_sdpa")}
    assert len(cudnn) == 2 and all(r.count == 8 for r in cudnn.values())  # fprop + bprop x 4 x 2
    assert sum(r.total_ns for r in cudnn.values()) / w.kernel_ns == pytest.approx(0.0911, abs=0.001)
    top = next(r for r in w.rows if r.kind == "kernel")
    assert top.name == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


def test_trace_ops_match_torch_key_averages():
    """Operator rows from the chrome trace equal what ``prof.key_averages()`` said in the
    same profiling session (steps.json): counts, total and self device time."""
    (w,) = aggregate_trace(load_trace(H200, "trace_math.json.gz"))
    ops = _ops(w.rows)
    ka = {
        r["name"]: r
        for r in json.loads((H200 / "steps.json").read_text())["trace_math"]["key_averages_top"]
    }
    names = [
        "aten::mm",
        "aten::bmm",
        "aten::_softmax",
        "aten::_softmax_backward_data",
        "aten::copy_",
        "aten::masked_fill_",
        "aten::native_layer_norm_backward",
    ]
    for name in names:
        assert ops[name].count == ka[name]["count"], name
        assert ops[name].total_ns / 1e3 == pytest.approx(ka[name]["device_time_total_us"], abs=0.01)
        assert ops[name].self_ns / 1e3 == pytest.approx(
            ka[name]["self_device_time_total_us"], abs=0.01
        )
    # total != self: its own softmax_warp_backward kernels plus its child aten::mul's kernels
    mul = next(r for r in w.rows if r.kind == "kernel" and "MulFunctor<float>" in r.name)
    back = ops["aten::_softmax_backward_data"]
    assert back.total_ns == back.self_ns + mul.total_ns
    # the torch 2.11 export carries no FLOPs even with with_flops=1
    assert all(r.flops is None for r in w.rows)


def test_trace_ops_by_time_when_external_ids_do_not_match():
    """The A100 DLRM trace's launches carry External ids no operator has: kernels are
    charged to the innermost operator running on the launching thread."""
    (w,) = aggregate_trace(load_trace(A100, "dlrm8_baseline_rank3.json.gz"))
    ops = _ops(w.rows)
    assert ops["aten::mm"].count == 1092 and ops["aten::mm"].self_ns == 42_140_000
    assert ops["aten::bmm"].self_ns == 16_653_000


def test_trace_flops_args_are_read_when_present():
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#3",
            "ts": 0,
            "dur": 100,
            "pid": 1,
            "tid": 1,
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "ts": 10,
            "dur": 20,
            "pid": 1,
            "tid": 1,
            "args": {"External id": 7, "flops": 2048},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 12,
            "dur": 5,
            "pid": 1,
            "tid": 1,
            "args": {"External id": 7, "correlation": 99},
        },
        # the GPU runs it after the step's CPU span ended: still step 3's
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm_k",
            "ts": 150,
            "dur": 40,
            "pid": 0,
            "tid": 7,
            "args": {"External id": 7, "correlation": 99},
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#4",
            "ts": 100,
            "dur": 100,
            "pid": 1,
            "tid": 1,
        },
    ]
    w3, w4 = aggregate_trace({"traceEvents": ev}, window="step")
    assert (w3.steps, w4.steps) == ((3,), (4,))
    gemm = KernelAgg("gemm_k", "kernel", "compute", 1, 40_000, 40_000)
    assert _kernels(w3.rows)["gemm_k"] == gemm
    assert _ops(w3.rows)["aten::mm"] == KernelAgg(
        "aten::mm", "op", "compute", 1, 40_000, 40_000, 2048.0
    )
    assert w4.rows == ()
    window, rows = w3.as_stored()
    assert window == {"t0": 0, "t1": 100_000, "source": "snapshot", "steps": [3], "rows_dropped": 0}
    assert rows == list(w3.rows)


# --- torch.profiler's in-process events ---------------------------------------------------------


def test_aggregate_events_on_a_real_cpu_profile():
    """A CPU-only torch.profiler run: no kernels; FLOP-carrying operators with torch's counts."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    model = torch.nn.Linear(64, 32)
    x = torch.randn(16, 64)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for i in range(3):
            with record_function(f"ProfilerStep#{i}"):
                model(x).relu().sum().backward()
    for source in (prof.key_averages(), prof.events()):
        rows = aggregate_events(source)
        assert [r for r in rows if r.kind == "kernel"] == []
        ops = _ops(rows)
        # forward addmm: 2 * 16 * 64 * 32 FLOP per call, 3 calls
        assert ops["aten::addmm"].count == 3
        assert ops["aten::addmm"].flops == 3 * 2 * 16 * 64 * 32
        assert ops["aten::addmm"].total_ns == 0  # CPU run: no device time
        assert not any(n.startswith("ProfilerStep") for n in ops)
        # only FLOP-carrying operators survive on a CPU run
        assert all(r.flops for r in ops.values())


def test_aggregate_events_on_torch_events_built_from_the_fixture():
    """The fixture's kernels as torch's own FunctionEvent objects (device events, as
    ``prof.events()`` holds them): ``aggregate_events`` on them and on their
    ``key_averages()`` gives the trace parser's kernel rows."""
    pytest.importorskip("torch")
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEvent

    trace = load_trace(H200, "trace_math.json.gz")
    events = []
    for i, e in enumerate(trace["traceEvents"]):
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            events.append(
                FunctionEvent(
                    id=i,
                    name=e["name"],
                    thread=0,
                    start_us=e["ts"],
                    end_us=e["ts"] + e["dur"],
                    device_type=DeviceType.CUDA,
                    use_device="cuda",
                    stack=[],
                )
            )
    events.append(
        FunctionEvent(
            id=-1,
            name="ProfilerStep#0",
            thread=0,
            start_us=0,
            end_us=1,
            use_device="cuda",
            is_user_annotation=True,
            stack=[],
        )
    )
    (w,) = aggregate_trace(trace)
    expected = {r.name: r for r in w.rows if r.kind == "kernel"}
    event_list = EventList(events, use_device="cuda")
    event_list._build_tree()  # what torch.profiler does before handing out events()
    for source in (events, event_list.key_averages()):
        got = _kernels(aggregate_events(source))
        assert set(got) == set(expected)
        for name, row in expected.items():
            assert (got[name].count, got[name].cls) == (row.count, row.cls), name
            # FunctionEvent keeps µs floats; the trace parser rounds each event to ns
            assert got[name].total_ns == pytest.approx(row.total_ns, abs=row.count)
        assert _ops(aggregate_events(source)) == {}


def test_aggregate_events_op_classes_and_device_time():
    """CPU operators carry their kernels' device time (µs -> ns) and class; collectives
    are ``comm`` by name even where torch lists no kernels (``key_averages()``)."""
    pytest.importorskip("torch")
    from torch.autograd.profiler_util import FunctionEvent

    mm = FunctionEvent(
        id=1,
        name="aten::mm",
        thread=1,
        start_us=0,
        end_us=50,
        use_device="cuda",
        flops=2e9,
        stack=[],
    )
    mm.append_kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 0, 75.5)
    copy = FunctionEvent(
        id=2, name="aten::copy_", thread=1, start_us=60, end_us=70, use_device="cuda", stack=[]
    )
    copy.append_kernel("Memcpy HtoD (Pinned -> Device)", 0, 12.0)
    allreduce = FunctionEvent(
        id=3, name="c10d::allreduce_", thread=1, start_us=80, end_us=90, use_device="cuda", stack=[]
    )
    allreduce.append_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 0, 300.0)
    # gloo on CUDA tensors: its range's device time is copies to and from the
    # host, and it is a collective all the same
    gloo = FunctionEvent(
        id=4, name="gloo:all_reduce", thread=1, start_us=95, end_us=99, use_device="cuda", stack=[]
    )
    gloo.append_kernel("Memcpy DtoH (Device -> Pageable)", 0, 40.0)
    ops = _ops(aggregate_events([mm, copy, allreduce, gloo]))
    assert ops["gloo:all_reduce"].cls == "comm"
    assert ops["aten::mm"] == KernelAgg("aten::mm", "op", "compute", 1, 75_500, 75_500, 2e9)
    assert ops["aten::copy_"].cls == "memcpy" and ops["aten::copy_"].total_ns == 12_000
    assert ops["c10d::allreduce_"].cls == "comm" and ops["c10d::allreduce_"].self_ns == 300_000


_GOOD_KERNEL = {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 10, "dur": 2}
_MALFORMED_EVENTS = [
    {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 1},  # no dur
    {"ph": "X", "name": "ProfilerStep#2", "cat": "user_annotation", "ts": 1, "dur": None},
    {"ph": "X", "name": "k1", "cat": "kernel", "ts": "abc", "dur": 1},
    {"ph": "X", "name": "k2", "cat": "kernel", "ts": 1, "dur": "x"},
    {"ph": "X", "name": "k3", "cat": "kernel", "ts": 1, "dur": float("nan")},
    {"ph": "X", "name": "k4", "cat": "kernel", "ts": 1, "dur": float("inf")},
    {"ph": "X", "name": "k5", "cat": "kernel", "ts": float("nan"), "dur": 1},
    {"ph": "X", "name": "k6", "cat": "kernel", "ts": 1, "dur": -5},
    {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": "x", "dur": 1},
    {"ph": "X", "name": "k7", "cat": "kernel", "ts": 1, "dur": 1, "args": [1]},
    {
        "ph": "X",
        "name": "l",
        "cat": "cuda_runtime",
        "ts": 1,
        "dur": 1,
        "args": {"correlation": [1]},
    },
    {
        "ph": "X",
        "name": "aten::bmm",
        "cat": "cpu_op",
        "ts": 1,
        "dur": 1,
        "args": {"External id": [1], "flops": float("inf")},
    },
]


@pytest.mark.parametrize("bad", _MALFORMED_EVENTS, ids=range(len(_MALFORMED_EVENTS)))
@pytest.mark.parametrize("mode", [None, "step"])
def test_malformed_trace_events_are_counted_and_skipped(bad, mode):
    (win,) = aggregate_trace({"traceEvents": [bad, _GOOD_KERNEL]}, mode)
    assert win.bad_events == 1
    assert [(r.name, r.total_ns) for r in win.rows] == [("gemm", 2000)]
    assert (win.t0_us, win.t1_us) == (10.0, 12.0)


@pytest.mark.parametrize(
    "trace", [None, 5, "hello", {"traceEvents": None}, {"traceEvents": {"a": 1}}, b"{}"]
)
def test_not_a_chrome_trace_is_a_clear_error(trace):
    with pytest.raises(ValueError, match="chrome trace"):
        aggregate_trace(trace)


def test_aggregate_events_rows_always_pass_the_protocol():
    """Malformed events (NaN / infinite / negative times, FLOPs or counts, self time
    above total, unprintable names) are left out or cleaned: every row it returns is
    one the daemon accepts, and nothing raises."""
    from types import SimpleNamespace as Ev

    from gpuprof.protocol import _kernel_row

    nan, inf = float("nan"), float("inf")
    op = {"device_type": "CPU", "count": 1, "self_device_time_total": 1.0}
    events = [
        Ev(key="aten::mm", **{**op, "device_time_total": 1.0, "flops": nan}),
        Ev(key="aten::bmm", **{**op, "device_time_total": 0.0, "flops": -5}),
        Ev(key="aten::add", **{**op, "device_time_total": -1.0, "flops": 10}),
        Ev(key="aten::sub", **{**op, "device_time_total": 1.0, "self_device_time_total": 5.0}),
        Ev(key="k_nan", device_type="CUDA", count=1, device_time_total=nan),
        Ev(key="k_inf", device_type="CUDA", count=1, device_time_total=inf),
        Ev(key="k_neg", device_type="CUDA", count=-3, device_time_total=5.0),
        Ev(key="k\x00\n\u202ebad", device_type="CUDA", count=1, device_time_total=1.0),
        Ev(key="gemm", device_type="CUDA", count=2, device_time_total=4.0),
    ]
    rows = aggregate_events(events)
    assert all(_kernel_row(r.to_wire()) for r in rows), [r.to_wire() for r in rows]
    got = {r.name: (r.count, r.total_ns, r.self_ns, r.flops) for r in rows}
    assert got == {
        "gemm": (2, 4000, 4000, None),
        "k   bad": (1, 1000, 1000, None),
        "aten::mm": (1, 1000, 1000, None),
        "aten::sub": (1, 1000, 1000, None),
    }


def _step_trace(steps: int, per_step: int) -> list[dict]:
    events = []
    for s in range(steps):
        base = s * 1000.0 * per_step
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "ts": base,
                "dur": 1000.0 * per_step - 1,
            }
        )
        for j in range(per_step):
            ext = s * per_step + j
            events.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": f"aten::op{j % 20}",
                    "ts": base + j * 1000.0,
                    "dur": 500.0,
                    "args": {"External id": ext},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"k{j % 20}",
                    "ts": base + j * 1000.0 + 100,
                    "dur": 50.0,
                    "args": {"External id": ext},
                }
            )
    return events


def test_step_windows_of_a_long_trace_take_linear_time(monkeypatch):
    """Every operator used to be scanned once per window (quadratic: 1,500 steps
    of 200 operators took minutes). Ten times the steps must visit about ten
    times the operators, not a hundred: visits counted, not timed (a count
    holds on a busy machine)."""
    import gpuprof.kernels as kernels

    visits = [0]

    class Counted(list):
        def __iter__(self):
            for o in list.__iter__(self):
                visits[0] += 1
                yield o

        def __getitem__(self, i):
            visits[0] += 1
            return list.__getitem__(self, i)

    real = kernels._ops_by_thread

    def counted(cpu_ops):
        ops, threads, by_ext = real(cpu_ops)
        return Counted(ops), threads, by_ext

    monkeypatch.setattr(kernels, "_ops_by_thread", counted)

    def visited(steps: int) -> int:
        visits[0] = 0
        wins = aggregate_trace({"traceEvents": _step_trace(steps, 40)}, "step")
        assert len(wins) == steps
        assert {r.name: r.count for r in wins[-1].rows if r.kind == "op"}["aten::op0"] == 2
        return visits[0]

    small, large = visited(100), visited(1000)
    assert small > 0
    ratio = large / small
    assert ratio < 15, ratio  # linear: ~10; the quadratic scan: ~100
