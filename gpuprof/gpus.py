"""Peak throughput and reference price per GPU model.

Peaks are the **dense** (not 2:4-sparse) tensor-core numbers from NVIDIA's
datasheets, in TFLOP/s; ``fp32`` is the non-tensor-core FP32 rate. Where a
datasheet prints only the sparse figure (marked "with sparsity"), the dense
one is half of it, as its footnote says. Reviewed row by row (2026-11):

- H100 SXM5 and H200 SXM: NVIDIA H100 Tensor Core GPU datasheet and NVIDIA
  H200 Tensor Core GPU datasheet (same SM count and clocks: FP32 67, TF32
  494.7, BF16/FP16 989.4, FP8 1978.9; the datasheets print the sparse
  figures 989 / 1979 / 3958 for TF32 / BF16 / FP8).
- H100 PCIe: same H100 datasheet, PCIe column (FP32 51, TF32 378,
  BF16/FP16 756, FP8 1513; sparse 756 / 1513 / 3026).
- H100 NVL and H200 NVL: the same two datasheets, NVL columns (FP32 60;
  sparse TF32 835, BF16/FP16 1671, FP8 3341 → dense 417.5 / 835.5 / 1670.5).
  Their NVML names contain "NVL"; they are matched before the SXM rows.
- A100 SXM4 and PCIe (40 and 80 GB): NVIDIA A100 Tensor Core GPU datasheet
  (FP32 19.5, TF32 156, BF16/FP16 312; no FP8: Ampere has none).
- A10: NVIDIA A10 Tensor Core GPU datasheet (FP32 31.2, TF32 62.5, BF16/FP16
  125; sparse 125 / 250; no FP8). The A10G (AWS) has no NVIDIA datasheet:
  its row has no peaks, so its MFU is unknown rather than the A10's.
- L4: NVIDIA L4 datasheet (FP32 30.3, TF32 60, BF16/FP16 121, FP8 242.5 dense).
- L40S: NVIDIA L40S datasheet (FP32 91.6, TF32 183, BF16/FP16 362.05, FP8
  733; sparse 366 / 733 / 1466).
- L40: NVIDIA L40 datasheet (FP32 90.5, TF32 90.5, BF16/FP16 181.05, FP8
  362; sparse 181 / 362.1 / 724).
- GeForce RTX 4090: NVIDIA Ada GPU Architecture whitepaper, Appendix A
  (FP32 82.6; tensor rates with FP32 accumulate, what PyTorch's matmuls use:
  TF32 82.6, BF16/FP16 165.2, FP8 330.3; GeForce cards run FP32 accumulate
  at half the FP16-accumulate rate the marketing figures quote).

Not in the table (MFU "unknown", never a guess): GPUs without a datasheet
at hand here, e.g. RTX 6000 Ada (its datasheet gives only FP32 and a
sparse FP8 figure), B200/GB200, consumer cards other than the 4090.

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

_NVL = {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}

# Order matters: the first row whose every substring is in the name wins.
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("H200 NVL", ("h200", "nvl"), _NVL, None),
    GpuSpec("H200", ("h200",), _H100_SXM, None),
    GpuSpec("H100 NVL", ("h100", "nvl"), _NVL, None),
    GpuSpec(
        "H100 PCIe",
        ("h100", "pcie"),
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
        None,
    ),
    GpuSpec("H100 SXM", ("h100",), _H100_SXM, 12.29),
    GpuSpec("A100 80GB", ("a100", "80gb"), _A100, 5.12),
    GpuSpec("A100 40GB", ("a100",), _A100, 4.10),
    # before L4: "nvidia l4" is in "NVIDIA L40S"
    GpuSpec(
        "L40S",
        ("l40s",),
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
    ),
    GpuSpec(
        "L40",
        ("nvidia l40",),
        {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0},
    ),
    GpuSpec(
        "L4",
        ("nvidia l4",),
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
        0.805,
    ),
    GpuSpec("A10G", ("a10g",), {}, None),  # no NVIDIA datasheet: unknown, not the A10's
    GpuSpec("A10", ("nvidia a10",), {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    # other chips behind the name (fewer SMs): unknown, not the 4090's peaks
    GpuSpec("RTX 4090 D", ("rtx 4090 d",), {}, None),
    GpuSpec("RTX 4090 Laptop", ("rtx 4090", "laptop"), {}, None),
    GpuSpec(
        "RTX 4090",
        ("rtx 4090",),
        {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
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
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "tensorfloat32": "tf32",
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
