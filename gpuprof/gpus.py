"""Peak throughput and reference price per GPU model.

Peaks are the **dense** (not 2:4-sparse) tensor-core numbers from NVIDIA's
datasheets, in TFLOP/s; ``fp32`` is the non-tensor-core FP32 rate:

- H100 SXM5 and H200 SXM: NVIDIA H100 Tensor Core GPU datasheet and NVIDIA
  H200 Tensor Core GPU datasheet (same SM count and clocks: FP32 67, TF32
  494.7, BF16/FP16 989.4, FP8 1978.9; the datasheets print the sparse
  figures 989 / 1979 / 3958 for TF32 / BF16 / FP8).
- H100 PCIe: same H100 datasheet, PCIe column (FP32 51, TF32 378,
  BF16/FP16 756, FP8 1513).
- A100 SXM4 and PCIe (40 and 80 GB): NVIDIA A100 Tensor Core GPU datasheet
  (FP32 19.5, TF32 156, BF16/FP16 312; no FP8).
- L4: NVIDIA L4 datasheet (FP32 30.3, TF32 60, BF16/FP16 121, FP8 242.5 dense).

Prices are USD per GPU-hour from the AWS EC2 on-demand list (us-east-1,
Linux), instance price divided by its GPU count: p5.48xlarge (8× H100 SXM)
$98.32/h → $12.29; p4d.24xlarge (8× A100 40 GB) $32.77/h → $4.10;
p4de.24xlarge (8× A100 80 GB) $40.96/h → $5.12; g6.xlarge (1× L4) $0.805/h.
A model with no row has no price: the cost line then asks for
``GPUPROF_GPU_RATE`` instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: dense peak TFLOP/s per dtype and a reference price."""

    name: str
    match: tuple[str, ...]
    """Lower-case substrings of the NVML name that identify this model."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    usd_per_hour: float | None = None


_H100_SXM = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}
_A100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}

# Order matters: the first row whose every substring is in the name wins.
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("H200", ("h200",), _H100_SXM, None),
    GpuSpec(
        "H100 PCIe",
        ("h100", "pcie"),
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
        None,
    ),
    GpuSpec("H100 SXM", ("h100",), _H100_SXM, 12.29),
    GpuSpec("A100 80GB", ("a100", "80gb"), _A100, 5.12),
    GpuSpec("A100 40GB", ("a100",), _A100, 4.10),
    GpuSpec(
        "L4",
        ("nvidia l4",),
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
        0.805,
    ),
)

_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}


def find_gpu(nvml_name: str | None) -> GpuSpec | None:
    """The spec row for an NVML device name (e.g. ``"NVIDIA H100 80GB HBM3"``),
    or None for a model not in the table."""
    if not nvml_name:
        return None
    low = nvml_name.lower()
    for spec in GPU_SPECS:
        if all(part in low for part in spec.match):
            return spec
    return None


def normalize_dtype(dtype: str | None) -> str | None:
    """``"bfloat16"``/``"torch.bfloat16"``/``"bf16"`` → ``"bf16"``; None if unknown."""
    if not dtype:
        return None
    low = dtype.lower()
    low = _DTYPE_ALIASES.get(low, low)
    return low if low in DTYPES else None


def peak_tflops(nvml_name: str | None, dtype: str | None) -> float | None:
    """Dense peak TFLOP/s of one GPU for *dtype*; None if the model or dtype is
    unknown (MFU is then "unknown", never a guess)."""
    spec = find_gpu(nvml_name)
    key = normalize_dtype(dtype)
    if spec is None or key is None:
        return None
    return spec.peak_tflops.get(key)
