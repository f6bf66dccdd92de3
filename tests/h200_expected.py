"""The GPU rules' verdicts on each phase of the recorded H200 trace
(``tests/fixtures/h200/nvml_trace.jsonl``), shared by the replay test
(``tests/gpuprof/insights/test_gpu.py``) and the real-GPU check
(``scripts/gpu_check.py``), which compares a live H200's verdicts with it.
"""

from __future__ import annotations

#: Which GPU rules each phase of the H200 trace must fire; every other GPU rule
#: must stay silent. Why, from the data (fixture README and the rows):
#:  - bf16_matmul: busy (util 94 %) with SW power cap (0x4) on ~95 % of rows and
#:    the SM clock ~1445 MHz vs 1980: the cap really lowers clocks, so
#:    power_capping fires (est. ~27 % of compute throughput).
#:  - tiny_kernels: its first rows still run the queued capped matmuls, too few
#:    (< 10 %) to count; util ~30 % in every window is launch-bound, not idle.
#:  - h2d_copy: util ~95 %, GPM SM 0 % → copy_bound_gpu; RX ~60 GB/s → pcie_saturation.
#:  - d2h_copy: the same copy signature; its traffic is TX, so no RX saturation.
#:  - memory_92pct: 92 % of memory → memory_pressure; the GPU then sat idle on
#:    ~93 % of its rows, which is what gpu_idle_between_steps reports for a run.
#:  - loader_stall: ~1 ms of matmuls per 80 ms wait, util 1-2 % → gpu_idle_between_steps.
#:  - idle / idle_end: the GpuIdle bit (0x1) and clocks parked at 345 MHz are
#:    not throttling; a GPU that did no work is not "idle between steps".
#:  - small_batch needs MFU, which a replay without steps/FLOPs lacks: silent.
EXPECTED: dict[str, set[str]] = {
    "idle": set(),
    "bf16_matmul": {"power_capping"},
    "tiny_kernels": set(),
    "h2d_copy": {"copy_bound_gpu", "pcie_saturation"},
    "d2h_copy": {"copy_bound_gpu"},
    "memory_92pct": {"memory_pressure", "gpu_idle_between_steps"},
    "loader_stall": {"gpu_idle_between_steps"},
    "idle_end": set(),
}
