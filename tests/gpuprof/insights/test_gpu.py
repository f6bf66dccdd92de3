from __future__ import annotations

import json
from collections import OrderedDict

import pytest

from gpuprof.insights import registered_rules, run_rules
from gpuprof.insights.aggregates import GpuStats
from gpuprof.insights.gpu import (
    GPU_RULES,
    REASON_GPU_IDLE,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    GpuAccumulator,
    copy_bound_gpu,
    gpu_idle_between_steps,
    gpu_stats,
    memory_pressure,
    pcie_saturation,
    power_capping,
    small_batch,
    thermal_throttling,
)
from tests.h200_expected import EXPECTED

from .conftest import H200, make_ctx

GB = 10**9


def _row(**kw) -> dict:
    """One fast-loop NVML sample of a busy, cool, unthrottled 80 GB GPU."""
    row = {
        "util_gpu": 95,
        "mem_used": 40 * GB,
        "mem_total": 80 * GB,
        "power_mW": 400_000,
        "temp_C": 60,
        "sm_MHz": 1980,
        "reasons": 0,
    }
    row.update(kw)
    return row


def _ctx(rows, **kw):
    return make_ctx([10.0] * 10, gpu=gpu_stats(rows), **kw)


# --- gpu_stats ---------------------------------------------------------------


def test_gpu_stats_none_without_utilization():
    assert gpu_stats([]) is None
    assert gpu_stats([{"temp_C": 50}]) is None


def test_gpu_stats_missing_readings_are_none_not_zero():
    g = gpu_stats([{"util_gpu": 50}, {"util_gpu": 40}])
    assert isinstance(g, GpuStats)
    assert g.samples == 2 and g.util_mean_pct == 45 and g.idle_share == 0.0
    for name in (
        "mem_used_max_bytes",
        "mem_total_bytes",
        "power_max_mw",
        "temp_max_c",
        "sm_mhz_ref",
        "reasons_seen",
        "power_capped_share",
        "thermal_share",
        "pcie_rx_max_kbps",
        "gpm_sm_util_pct",
    ):
        assert getattr(g, name) is None, name
    assert g.mem_used_fraction is None and g.pcie_rx_max_bytes_per_s is None
    for name in GPU_RULES:
        assert registered_rules()[name](make_ctx([10.0] * 10, gpu=g)) is None, name


def test_gpu_stats_slow_loop_keys_only_on_some_rows():
    rows = [_row(), _row(pcie_rx_KBps=1000, gpm_sm_util=40.0), _row(), _row(gpm_sm_util=60.0)]
    g = gpu_stats(rows)
    assert g.pcie_rx_max_kbps == 1000 and g.pcie_rx_max_bytes_per_s == 1e6
    assert g.gpm_sm_util_pct == 50.0


def test_clock_reference_ignores_idle_parked_samples_and_takes_max_clock():
    rows = [_row(sm_MHz=1500), _row(util_gpu=0, sm_MHz=1980, reasons=REASON_GPU_IDLE)]
    assert gpu_stats(rows).sm_mhz_ref == 1500
    assert gpu_stats(rows, max_sm_mhz=1980).sm_mhz_ref == 1980


def test_rules_silent_without_gpu_stats():
    ctx = make_ctx([10.0] * 10)
    for name in GPU_RULES:
        assert registered_rules()[name](ctx) is None, name


# --- memory_pressure ---------------------------------------------------------


def test_memory_pressure_fires_above_90_percent():
    ins = memory_pressure(_ctx([_row(), _row(mem_used=76 * GB)]))
    assert ins is not None and ins.severity == "MED"
    assert ins.evidence["mem_used_fraction"] == pytest.approx(0.95)
    assert "95% full (76.0 of 80.0 GB)" in ins.title.replace(" at peak", "")


def test_memory_pressure_silent_at_90_percent():
    assert memory_pressure(_ctx([_row(mem_used=72 * GB)])) is None


def _torch_mem(used_gb: float, reserved_gb: float, allocated_gb: float):
    """An 80 GB GPU whose NVML peak is *used_gb*, with torch's peak reserved
    and allocated figures as the shim reports them."""
    return _ctx(
        [_row(), _row(mem_used=int(used_gb * GB))],
        torch_peak_reserved_bytes=int(reserved_gb * GB),
        torch_peak_allocated_bytes=int(allocated_gb * GB),
    )


def test_memory_pressure_without_torch_figures_keeps_the_general_fix():
    ins = memory_pressure(_ctx([_row(mem_used=76 * GB)]))
    assert "cause" not in ins.evidence and "torch_peak_allocated_bytes" not in ins.evidence
    assert "checkpointing" in ins.fix and "expandable_segments" in ins.fix
    assert "reserved" not in ins.detail


def test_memory_pressure_from_the_allocator_cache_suggests_expandable_segments():
    # 74 GB reserved but tensors peaked at 60: 14 GB (17.5 % of the GPU) is cache
    ins = memory_pressure(_torch_mem(used_gb=76, reserved_gb=74, allocated_gb=60))
    assert ins.evidence["cause"] == "allocator_cache"
    assert ins.evidence["torch_peak_reserved_bytes"] == 74 * GB
    assert ins.evidence["torch_peak_allocated_bytes"] == 60 * GB
    assert ins.evidence["mem_used_max_bytes"] == 76 * GB
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in ins.fix
    assert "batch size" in ins.fix and "checkpointing" not in ins.fix
    assert "reserved 74.0 GB" in ins.detail and "tensors took 60.0 GB" in ins.detail
    assert "2.0 GB of NVML's used memory lay outside it" in ins.detail
    assert "14.0 GB of cached, unused blocks" in ins.detail


def test_memory_pressure_from_live_tensors_suggests_checkpointing():
    # reserved a little above allocated (rounding), NVML a little above reserved
    # (context): the normal picture, with the tensors themselves near the total
    ins = memory_pressure(_torch_mem(used_gb=76, reserved_gb=75, allocated_gb=73))
    assert ins.evidence["cause"] == "tensors"
    assert "checkpointing" in ins.fix and "micro-batch" in ins.fix
    assert "expandable_segments" not in ins.fix
    assert "Live tensors" in ins.detail


def test_memory_pressure_outside_torch_points_at_other_users_of_the_gpu():
    # torch holds 60 GB; 16 GB more is used by something else on the GPU
    ins = memory_pressure(_torch_mem(used_gb=76, reserved_gb=60, allocated_gb=58))
    assert ins.evidence["cause"] == "outside_torch"
    assert "nvidia-smi" in ins.fix and "checkpointing" not in ins.fix
    assert "16.0 GB of NVML's used memory lay outside it" in ins.detail


def test_memory_pressure_cause_threshold_is_a_tenth_of_the_gpu():
    # cache 7.9 GB (< 8 GB = 10 % of 80): not the cause; 8.1 GB: the cause
    below = memory_pressure(_torch_mem(used_gb=76, reserved_gb=75, allocated_gb=67.1))
    above = memory_pressure(_torch_mem(used_gb=76, reserved_gb=75, allocated_gb=66.9))
    assert below.evidence["cause"] == "tensors"
    assert above.evidence["cause"] == "allocator_cache"


def test_memory_pressure_peaks_apart_in_time_do_not_go_negative():
    # NVML's peak below torch's reserved peak (sampled at other moments)
    ins = memory_pressure(_torch_mem(used_gb=73, reserved_gb=74, allocated_gb=72.5))
    assert ins.evidence["cause"] == "tensors"
    assert "0.0 GB of NVML's used memory lay outside it" in ins.detail


def test_memory_pressure_silent_for_the_normal_picture_below_90_percent():
    # NVML used > reserved > allocated, each well apart, but the GPU has room
    assert memory_pressure(_torch_mem(used_gb=60, reserved_gb=50, allocated_gb=30)) is None


# --- thermal_throttling ------------------------------------------------------


def _hot(**kw):
    return _row(**{"temp_C": 88, "sm_MHz": 1500, "reasons": REASON_HW_THERMAL, **kw})


def test_thermal_throttling_fires_hot_slow_and_flagged():
    ins = thermal_throttling(_ctx([_row()] + [_hot()] * 4))
    assert ins is not None
    assert ins.evidence["clock_drop"] == pytest.approx(1 - 1500 / 1980, abs=1e-4)


def test_thermal_throttling_silent_without_a_thermal_bit():
    # hot and slow, but the only bit is GpuIdle: parked clocks are not throttling
    rows = [_row()] + [_row(temp_C=88, sm_MHz=1500, reasons=REASON_GPU_IDLE)] * 4
    assert thermal_throttling(_ctx(rows)) is None


def test_thermal_throttling_silent_when_cool_or_clock_near_max():
    assert thermal_throttling(_ctx([_row()] + [_hot(temp_C=80)] * 4)) is None
    rows = [_row()] + [_row(temp_C=88, sm_MHz=1800, reasons=REASON_HW_THERMAL)] * 4
    assert thermal_throttling(_ctx(rows)) is None  # 9 % below 1980: not > 15 %


# --- power_capping -----------------------------------------------------------


def test_power_capping_fires_busy_capped_and_slow():
    rows = [_row()] + [_row(sm_MHz=1485, reasons=REASON_SW_POWER_CAP, power_mW=699_000)] * 9
    ins = power_capping(_ctx(rows))
    assert ins is not None
    assert ins.evidence["est_throughput_loss"] == pytest.approx(0.25)
    assert "est." in ins.title and "estimate" in ins.detail


def test_power_capping_silent_when_idle_or_clock_unchanged_or_brief():
    cap = REASON_SW_POWER_CAP
    idle = [_row()] + [_row(util_gpu=0, sm_MHz=1485, reasons=cap)] * 9
    assert power_capping(_ctx(idle)) is None
    flat = [_row(sm_MHz=1980, reasons=cap)] * 10
    assert power_capping(_ctx(flat)) is None
    brief = [_row()] * 19 + [_row(sm_MHz=1485, reasons=cap)]  # 5 % of samples
    assert power_capping(_ctx(brief)) is None


# --- copy_bound_gpu ----------------------------------------------------------


def test_copy_bound_gpu_fires_busy_util_with_idle_sms():
    rows = [_row(util_gpu=98), _row(util_gpu=97, gpm_sm_util=0.0)]
    ins = copy_bound_gpu(_ctx(rows))
    assert ins is not None and ins.evidence["gpm_sm_util_pct"] == 0.0


def test_copy_bound_gpu_silent_when_computing_or_without_gpm():
    assert copy_bound_gpu(_ctx([_row(gpm_sm_util=90.0)])) is None
    assert copy_bound_gpu(_ctx([_row(util_gpu=99)])) is None  # no GPM: unknown


# --- pcie_saturation ---------------------------------------------------------


def test_pcie_saturation_fires_above_20_gbps():
    ins = pcie_saturation(_ctx([_row(), _row(pcie_rx_KBps=25_000_000)]))
    assert ins is not None and ins.evidence["pcie_rx_max_bytes_per_s"] == 25 * GB


def test_pcie_saturation_silent_below():
    assert pcie_saturation(_ctx([_row(pcie_rx_KBps=19_000_000)])) is None


# --- small_batch -------------------------------------------------------------


def _mfu_ctx(rows, flops_per_step: float):
    # 10 ms steps on an H200 (989.4 bf16 TFLOP/s): MFU = flops / 1e-2 / 989.4e12
    return _ctx(
        rows, gpu_model="NVIDIA H200", gpu_count=1, flops_per_step=flops_per_step, dtype="bf16"
    )


def test_small_batch_fires_busy_sms_low_mfu_preferring_gpm():
    # NVML util 95 %, GPM SM 70 %: GPM is the one reported
    ins = small_batch(_mfu_ctx([_row(gpm_sm_util=70.0)], flops_per_step=1e12))  # ~10 % MFU
    assert ins is not None
    assert (
        ins.evidence["sm_busy_pct"] == 70.0 and ins.evidence["sm_busy_source"] == "GPM SM activity"
    )


def test_small_batch_falls_back_to_nvml_util():
    ins = small_batch(_mfu_ctx([_row(util_gpu=90)], flops_per_step=1e12))
    assert ins is not None and ins.evidence["sm_busy_source"] == "NVML utilization"


def test_small_batch_silent_high_mfu_unknown_mfu_or_idle_sms():
    assert small_batch(_mfu_ctx([_row()], flops_per_step=4e12)) is None  # ~40 % MFU
    assert small_batch(_ctx([_row()])) is None  # MFU unknown
    # NVML says 95 %, but GPM says the SMs are 30 % busy: GPM wins
    assert small_batch(_mfu_ctx([_row(gpm_sm_util=30.0)], flops_per_step=1e12)) is None


# --- gpu_idle_between_steps --------------------------------------------------


def test_gpu_idle_between_steps_fires_when_idle_share_high():
    rows = [_row(util_gpu=100)] * 3 + [_row(util_gpu=2)] * 7
    ins = gpu_idle_between_steps(_ctx(rows))
    assert ins is not None and ins.severity == "HIGH"
    assert ins.evidence["idle_share"] == 0.7


def test_gpu_idle_between_steps_silent_busy_launch_bound_or_unused():
    assert gpu_idle_between_steps(_ctx([_row(util_gpu=100)] * 8 + [_row(util_gpu=0)] * 2)) is None
    # launch-bound: low util in every window, never a whole idle window
    assert gpu_idle_between_steps(_ctx([_row(util_gpu=30)] * 10)) is None
    # the run never used the GPU: not this problem
    assert gpu_idle_between_steps(_ctx([_row(util_gpu=0)] * 10)) is None


def test_run_rules_includes_gpu_findings():
    found = {i.rule for i in run_rules(_ctx([_row(mem_used=79 * GB)]))}
    assert "memory_pressure" in found


# --- replay of the real H200 trace -------------------------------------------

# EXPECTED (which GPU rules each trace phase fires, and why) lives in
# tests/h200_expected.py: scripts/gpu_check.py compares a live H200 with it.


@pytest.fixture(scope="module")
def h200_phases() -> dict[str, list[dict]]:
    """NVML rows by phase label, each phase's first row dropped (rows lag the
    label by one sample)."""
    path = H200 / "nvml_trace.jsonl"
    if not path.exists():
        pytest.fail(f"H200 fixture missing at {path}: tests/fixtures/ is part of the repository")
    lines = path.read_text().splitlines()
    phases: dict[str, list[dict]] = OrderedDict()
    for line in lines[1:]:
        row = json.loads(line)
        phases.setdefault(row["phase"], []).append(row)
    header = [p["phase"] for p in json.loads(lines[0])["phases"]]
    assert header == list(EXPECTED)
    return {name: rows[1:] for name, rows in phases.items() if name in EXPECTED}


def _replay_ctx(rows: list[dict]):
    return make_ctx([], gpu=gpu_stats(rows), gpu_model="NVIDIA H200", gpu_count=1)


@pytest.mark.parametrize("phase", list(EXPECTED))
def test_h200_replay_verdicts(h200_phases, phase):
    ctx = _replay_ctx(h200_phases[phase])
    rules = registered_rules()
    fired = {name for name in GPU_RULES if rules[name](ctx) is not None}
    assert fired == EXPECTED[phase]


def test_h200_replay_memory_phase_evidence(h200_phases):
    rows = h200_phases["memory_92pct"]
    expected = max(r["mem_used"] for r in rows) / rows[0]["mem_total"]
    ins = memory_pressure(_replay_ctx(rows))
    assert ins.evidence["mem_used_fraction"] == pytest.approx(expected, abs=1e-4)
    assert 0.9 < expected < 0.95  # README: 138.8 of 150.75 GB


def test_h200_replay_copy_and_pcie_evidence(h200_phases):
    h2d = h200_phases["h2d_copy"]
    rx_peak_kbps = max(r["pcie_rx_KBps"] for r in h2d if "pcie_rx_KBps" in r)
    ins = pcie_saturation(_replay_ctx(h2d))
    assert ins.evidence["pcie_rx_max_bytes_per_s"] == rx_peak_kbps * 1000
    rx_mean = [r["pcie_rx_KBps"] for r in h2d if "pcie_rx_KBps" in r]
    assert sum(rx_mean) / len(rx_mean) / 1e6 == pytest.approx(58.8, abs=0.1)  # GB/s, README
    for phase in ("h2d_copy", "d2h_copy"):
        rows = h200_phases[phase]
        ev = copy_bound_gpu(_replay_ctx(rows)).evidence
        util = [r["util_gpu"] for r in rows]
        assert ev["util_mean_pct"] == pytest.approx(sum(util) / len(util), abs=0.05)
        assert ev["util_mean_pct"] > 90
        assert ev["gpm_sm_util_pct"] == 0.0
        assert all(r["gpm_sm_util"] == 0.0 for r in rows if "gpm_sm_util" in r)


def test_h200_replay_power_cap_lowers_clocks(h200_phases):
    rows = h200_phases["bf16_matmul"]
    capped = [r for r in rows if r["reasons"] & 0x4 and r["util_gpu"] >= 80]
    capped_mhz = sum(r["sm_MHz"] for r in capped) / len(capped)
    max_mhz = max(r["sm_MHz"] for r in rows if not r["reasons"] & 0x1)
    # the data's answer to "clocks down while capped?": yes, by well over 5 %
    assert 1 - capped_mhz / max_mhz > 0.2
    ev = power_capping(_replay_ctx(rows)).evidence
    assert ev["sm_mhz_ref"] == max_mhz
    assert ev["sm_mhz_power_capped"] == pytest.approx(capped_mhz, abs=0.1)
    assert ev["est_throughput_loss"] == pytest.approx(1 - capped_mhz / max_mhz, abs=1e-4)
    assert ev["power_capped_share"] == pytest.approx(len(capped) / len(rows), abs=1e-4)


def test_h200_replay_loader_stall_idle_share(h200_phases):
    rows = h200_phases["loader_stall"]
    idle = sum(1 for r in rows if r["util_gpu"] <= 5) / len(rows)
    assert idle > 0.8
    ev = gpu_idle_between_steps(_replay_ctx(rows)).evidence
    assert ev["idle_share"] == pytest.approx(idle, abs=1e-4)
    assert ev["util_mean_pct"] == pytest.approx(10, abs=1)  # README: util ~10 %


def test_h200_replay_idle_bit_is_not_throttling(h200_phases):
    rows = h200_phases["idle"]
    parked = [r for r in rows if r["reasons"] & 0x1]
    assert parked and min(r["sm_MHz"] for r in parked) < 0.85 * 1980  # clocks way down
    g = gpu_stats(rows)
    assert g.thermal_share == 0.0 and g.power_capped_share == 0.0


# --- GpuAccumulator: partials merge into the whole ---------------------------


def test_accumulators_merged_in_any_split_equal_one_over_all_rows():
    rows = (
        [_row(util_gpu=u, sm_MHz=1400 + u, reasons=4 if u > 50 else 1) for u in range(0, 99, 7)]
        + [_row(temp_C=85, reasons=0x20, sm_MHz=1500), {"pcie_rx_KBps": 9e6, "gpm_sm_util": 3.0}]
        + [_row(pcie_rx_KBps=2e7, gpm_sm_util=80.0, mem_used=79 * GB)]
    )
    whole = gpu_stats(rows)
    for cut in (1, 5, len(rows) - 1):
        left, right = GpuAccumulator(), GpuAccumulator()
        for r in rows[:cut]:
            left.add(r)
        for r in rows[cut:]:
            right.add(r)
        left.merge(right)
        assert left.stats() == whole, cut
    assert whole is not None and whole.samples == len(rows) - 1  # the util-less row is skipped
    assert whole.pcie_rx_max_kbps == 2e7 and whole.mem_used_max_bytes == 79 * GB


def test_the_max_sm_clock_is_the_reference_when_every_busy_sample_is_capped():
    acc = GpuAccumulator(sm_limit_mhz=1980)
    for _ in range(10):
        acc.add(_row(util_gpu=99, sm_MHz=1500, reasons=0x4))
    g = acc.stats()
    assert g is not None and g.sm_mhz_ref == 1980
    assert power_capping(make_ctx([10.0] * 10, gpu=g)) is not None
    # without it the capped clock is its own reference: nothing to measure from
    assert power_capping(_ctx([_row(util_gpu=99, sm_MHz=1500, reasons=0x4)] * 10)) is None


def test_gpu_idle_between_steps_fires_for_a_loader_starved_gpu_at_low_util():
    # the H200 trace's loader_stall: 1-2 % util in every window (1 ms of work per 80 ms)
    starved = [_row(util_gpu=1), _row(util_gpu=2)] * 10
    ins = gpu_idle_between_steps(_ctx(starved))
    assert ins is not None and ins.evidence["idle_share"] == 1.0
    # under 1 % mean: only NVML's lag after work ended, not a run using its GPU
    assert gpu_idle_between_steps(_ctx([_row(util_gpu=1)] + [_row(util_gpu=0)] * 19)) is None
