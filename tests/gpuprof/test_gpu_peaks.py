"""The peak table: every row, dense numbers, names matched to the right row
(NVML names as the drivers report them), unknown models and dtypes unknown."""

from __future__ import annotations

import pytest

from gpuprof.gpus import DTYPES, GPU_SPECS, find_gpu, normalize_dtype, peak_tflops


@pytest.mark.parametrize(
    ("nvml_name", "row"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 4090 D", "RTX 4090 D"),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "RTX 4090 Laptop"),
    ],
)
def test_each_nvml_name_finds_its_own_row(nvml_name, row):
    spec = find_gpu(nvml_name)
    assert spec is not None and spec.name == row


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200", "fp8", 1978.9),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA H100 NVL", "float8_e4m3fn", 1670.5),
        ("NVIDIA L40S", "bfloat16", 362.05),
        ("NVIDIA L40S", "fp8", 733.0),
        ("NVIDIA L40", "tf32", 90.5),
        ("NVIDIA L4", "fp8", 242.5),
        ("NVIDIA A10", "float16", 125.0),
        ("NVIDIA A10", "fp8", None),  # Ampere: no FP8
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("NVIDIA GeForce RTX 4090", "fp8", 330.3),
        ("NVIDIA A10G", "bf16", None),
        ("NVIDIA GeForce RTX 4090 D", "bf16", None),
        ("NVIDIA B200", "bf16", None),
        ("NVIDIA H200", "int8", None),
        (None, "bf16", None),
    ],
)
def test_peaks(name, dtype, peak):
    assert peak_tflops(name, dtype) == peak


def test_rows_are_dense_and_ordered_by_precision():
    """Each row: fp32 ≤ tf32 ≤ bf16 == fp16 ≤ fp8 (each tensor dtype twice the
    one above on Hopper/Ada; no row carries a sparse figure, which would
    double fp8 past 2× bf16)."""
    for spec in GPU_SPECS:
        p = spec.peak_tflops
        assert set(p) <= set(DTYPES)
        if not p:
            continue
        assert p["fp32"] <= p["tf32"] <= p["bf16"] == p["fp16"], spec.name
        if "fp8" in p:
            # 2 % slack: the L40S datasheet prints FP8 733 beside BF16 362.05
            assert p["fp8"] == pytest.approx(2 * p["bf16"], rel=0.02), spec.name


def test_dtype_names_from_torch_and_the_probe():
    for name, key in [
        ("bfloat16", "bf16"),
        ("torch.float16", "fp16"),
        ("tf32", "tf32"),
        ("float8_e5m2", "fp8"),
        ("float32", "fp32"),
        ("float64", None),
    ]:
        assert normalize_dtype(name) == key
