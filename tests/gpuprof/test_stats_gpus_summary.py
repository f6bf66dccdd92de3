from __future__ import annotations

import pytest

from gpuprof.gpus import find_gpu, normalize_dtype, peak_tflops
from gpuprof.insights import Insight
from gpuprof.stats import median, percentile
from gpuprof.summary import format_summary, make_summary

from .insights.conftest import make_ctx


def test_percentile_matches_numpy_linear():
    vals = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert median(vals) == 3.0
    assert percentile(vals, 90) == pytest.approx(7.6)
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        median([])


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "fp8", 1513.0),
        ("NVIDIA H200", "float32", 67.0),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100-SXM4-40GB", "fp8", None),
        ("Tesla K80", "fp32", None),
    ],
)
def test_peak_table(name, dtype, peak):
    assert peak_tflops(name, dtype) == peak


def test_price_rows_and_dtype_names():
    assert find_gpu("NVIDIA A100-SXM4-80GB").usd_per_hour == 5.12
    assert find_gpu("NVIDIA A100-SXM4-40GB").usd_per_hour == 4.10
    assert normalize_dtype("torch.float16") == "fp16"
    assert normalize_dtype("int8") is None


def test_summary_block_matches_the_quickstart_shape():
    ctx = make_ctx([100.0, 80.0, 80.0], [10.0, 40.0, 40.0], run_name="digits-mlp")
    ins = Insight("dataloader_stall", "HIGH", "33% of step time waiting", "d", "fix it")
    text = format_summary(make_summary(1, ctx, [ins.to_dict()], "/data/my runs/gpuprof.db"))
    lines = text.splitlines()
    # iterations 110, 120, 120 ms: the mean and the median agree within 10 %
    assert lines[1] == "gpuprof · digits-mlp  (3 steps, 116.7 ms/iteration, 8.6 steps/s)"
    assert lines[3] == "  [HIGH] 33% of step time waiting"
    assert lines[4] == "  Full report: gpuprofctl insights '/data/my runs/gpuprof.db' 1"
    assert "Fix: fix it" in format_summary(make_summary(1, ctx, [ins.to_dict()], "/d"), True)


def test_a_run_stored_in_postgres_names_its_report_by_url():
    ctx = make_ctx([100.0, 80.0, 80.0], [10.0, 40.0, 40.0], run_name="r")
    url = "postgres://gp:***@db/runs?search_path=team"
    text = format_summary(make_summary(7, ctx, [], url))
    assert f"  Full report: gpuprofctl insights --storage-url '{url}' 7" in text.splitlines()


def test_failed_run_is_marked():
    ctx = make_ctx([], [], status="failed")
    assert "[FAILED]" in format_summary(make_summary(3, ctx, [], "/d"))
    assert "Ended by" not in format_summary(make_summary(3, ctx, [], "/d"))


def test_a_failed_runs_error_is_shown_first_line_only():
    ctx = make_ctx([10.0] * 4, status="failed")
    summary = make_summary(3, ctx, [], "/d", error="ValueError: loss is NaN\nat step 120")
    assert summary["error"] == "ValueError: loss is NaN\nat step 120"
    lines = format_summary(summary).splitlines()
    assert lines[1].endswith("[FAILED]") and lines[2] == "  Ended by: ValueError: loss is NaN"


def test_skipped_updates_and_eval_time_get_one_line_only_when_present():
    ctx = make_ctx([10.0] * 4, skipped_updates=2, eval_ms=12_345.0)
    summary = make_summary(1, ctx, [], "/d")
    assert (summary["skipped_updates"], summary["eval_s"]) == (2, 12.345)
    lines = format_summary(summary).splitlines()
    assert lines[2] == (
        "  2 skipped updates (inf/NaN gradients); 12.3 s in evaluation, outside steps"
    )
    plain = format_summary(make_summary(1, make_ctx([10.0] * 4), [], "/d")).splitlines()
    assert plain[2] == "  Insights (0):"


@pytest.mark.parametrize(
    ("eval_ms", "said"),
    [(4.0, "4 ms"), (0.6, "1 ms"), (999.0, "999 ms"), (999.6, "1.0 s"), (1_500.0, "1.5 s")],
)
def test_a_short_evaluation_is_said_in_ms_not_as_0_s(eval_ms: float, said: str):
    summary = make_summary(1, make_ctx([10.0] * 4, eval_ms=eval_ms), [], "/d")
    assert summary["eval_s"] == round(eval_ms / 1e3, 3)  # the JSON keeps seconds
    assert f"  {said} in evaluation, outside steps" in format_summary(summary).splitlines()


def test_two_optimizers_get_a_line_with_their_updates_and_time():
    ctx = make_ctx([10.0] * 4, optimizers=(("Adam#0", 4, 1, 1234.5, 5), ("SGD#1", 8, 0, 20.0, 4)))
    summary = make_summary(1, ctx, [], "/d")
    assert summary["optimizers"] == [  # step_ms: per step it stepped in; total_ms: the run's
        {"name": "Adam#0", "updates": 4, "skipped": 1, "step_ms": 246.9, "total_ms": 1234.5},
        {"name": "SGD#1", "updates": 8, "skipped": 0, "step_ms": 5.0, "total_ms": 20.0},
    ]
    line = "  Optimizers: Adam#0 4 updates, 1.23 s in step(); SGD#1 8 updates, 0.02 s in step()"
    assert line in format_summary(summary).splitlines()
    one = make_ctx([10.0] * 4, optimizers=(("Adam#0", 4, 0, 5.0, 4),))
    assert "Optimizers:" not in format_summary(make_summary(1, one, [], "/d"))
    # a summary stored before total_ms: its step_ms was the run's total
    old = {
        **summary,
        "optimizers": [{**o, "step_ms": o["total_ms"]} for o in summary["optimizers"]],
    }
    for o in old["optimizers"]:
        del o["total_ms"]
    assert line in format_summary(old).splitlines()


def test_micro_batches_line_only_above_one():
    accum = make_summary(1, make_ctx([10.0] * 4, micro_batches=(1, 4, 4, 4)), [], "/d")
    assert accum["micro_batches_per_step"] == 4.0  # the first step is start-up, as in runs
    assert "  Micro-batches per step: 4 (gradient accumulation)" in format_summary(accum)
    uneven = make_summary(1, make_ctx([10.0] * 4, micro_batches=(4, 4, 4, 3)), [], "/d")
    assert "  Micro-batches per step: 3.67 (gradient accumulation)" in format_summary(uneven)
    plain = make_summary(1, make_ctx([10.0] * 4, micro_batches=(1, 1, 1, 1)), [], "/d")
    assert plain["micro_batches_per_step"] == 1.0
    assert "Micro-batches" not in format_summary(plain)
    assert make_summary(1, make_ctx([]), [], "/d")["micro_batches_per_step"] is None


def test_memory_line_shows_torch_peaks_beside_nvml_used():
    from gpuprof.insights.gpu import gpu_stats

    gpu = gpu_stats(
        [
            {"util_gpu": 90, "mem_used": 30 * 10**9, "mem_total": 80 * 10**9},
            {"util_gpu": 90, "mem_used": 31_500_000_000, "mem_total": 80 * 10**9},
        ]
    )
    ctx = make_ctx(
        [10.0] * 4,
        gpu=gpu,
        torch_peak_allocated_bytes=25_120_000_000,
        torch_peak_reserved_bytes=28 * 10**9,
    )
    summary = make_summary(1, ctx, [], "/d")
    assert summary["memory"] == {
        "torch_peak_allocated_bytes": 25_120_000_000,
        "torch_peak_reserved_bytes": 28 * 10**9,
        "nvml_peak_used_bytes": 31_500_000_000,
        "nvml_total_bytes": 80 * 10**9,
    }
    line = (
        "  GPU memory at peak: torch allocated 25.12 GB, reserved 28.00 GB, "
        "NVML used 31.50 of 80.00 GB"
    )
    assert line in format_summary(summary).splitlines()


def test_memory_line_shows_what_is_known_and_nothing_on_a_cpu_run():
    torch_only = make_summary(
        1,
        make_ctx([10.0] * 4, torch_peak_allocated_bytes=10**9, torch_peak_reserved_bytes=2 * 10**9),
        [],
        "/d",
    )
    assert (
        "  GPU memory at peak: torch allocated 1.00 GB, reserved 2.00 GB"
        in format_summary(torch_only).splitlines()
    )
    cpu = make_summary(1, make_ctx([10.0] * 4), [], "/d")
    assert cpu["memory"] == {}
    assert "GPU memory" not in format_summary(cpu)


def test_comm_line_counts_buckets_in_words():
    from gpuprof.summary import comm_line

    one = {
        "median_exposed_ms": 2.0,
        "median_share_of_step": 0.1,
        "buckets_per_step": 1,
        "bytes_per_step": 500_000,
    }
    assert comm_line(one) == (
        "  Comm (median of steady steps): 2.0 ms/step exposed, 10 % of step; 1 bucket, "
        "gradient bytes 500.0 KB/step"
    )
    assert comm_line({**one, "buckets_per_step": 2.5}).endswith(
        "; 2.5 buckets, gradient bytes 500.0 KB/step"
    )
    assert comm_line(None) is None


def test_comm_bytes_are_gradient_bytes_and_small_ones_are_not_zero_mb():
    """An fp16-compressed 64x64 model: its bucket is 16.6 KB of gradients
    (not 0.0 MB, and not what crossed the wire)."""
    from gpuprof.summary import comm_line, size_text

    tiny = {
        "median_exposed_ms": 0.4,
        "median_share_of_step": 0.02,
        "buckets_per_step": 1,
        "bytes_per_step": 64 * 64 * 4 + 64 * 4,
    }
    assert comm_line(tiny).endswith("; 1 bucket, gradient bytes 16.6 KB/step")
    assert [size_text(n) for n in (512, 16_640, 25_100_000, 1_200_000_000)] == [
        "512 B",
        "16.6 KB",
        "25.1 MB",
        "1.20 GB",
    ]


def test_group_block_of_one_rank_says_rank_not_ranks():
    from gpuprof.summary import group_lines

    ins = {
        "rule": "comm_dominant",
        "severity": "HIGH",
        "title": "Collectives take 84%",
        "detail": "d",
        "fix": "f",
        "evidence": {},
    }
    assert group_lines({"group": "g", "ranks": 1, "insights": [ins]})[0] == "  Group g (1 rank):"
    assert group_lines({"group": "g", "ranks": 2, "insights": [ins]})[0] == "  Group g (2 ranks):"


def test_a_grouped_runs_summary_names_the_group_report_quoted():
    summary = make_summary(3, make_ctx([10.0] * 4), [], "/data/my runs.db")
    assert "Group report" not in format_summary(summary)
    summary["group_id"] = "my exp"
    lines = format_summary(summary).splitlines()
    at = lines.index("  Full report: gpuprofctl insights '/data/my runs.db' 3")
    assert lines[at + 1] == (
        "  Group report: gpuprofctl insights '/data/my runs.db' --group 'my exp'"
    )
