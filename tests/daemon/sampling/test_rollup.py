"""SecondRollups: one row per GPU per second, closed by the GPU's first
sample of a later second; slow-loop samples join their GPU's open second."""

from __future__ import annotations

from gpuprofd.sampling.nvml import GpuDevice, GpuSample, GpuSlowSample
from gpuprofd.sampling.rollup import ROLLUP_COLUMNS, SecondRollups, accumulator_from_row

S = 10**9


def _fast(uuid: str, util: float, sm: int = 1500, reasons: int = 0) -> GpuSample:
    return GpuSample(0, uuid, util, 10 * 2**30, 80 * 2**30, 300_000, 60, sm, 20.0, reasons)


def _slow(uuid: str, rx_bps: float, gpm_sm: float | None) -> GpuSlowSample:
    return GpuSlowSample(0, uuid, 1, 1.0, rx_bps, 0.0, gpm_sm, None, None, None, None, None)


def _row(t: tuple) -> dict:
    return dict(zip(ROLLUP_COLUMNS, t, strict=True))


def test_a_gpus_second_closes_on_its_first_sample_of_a_later_second():
    r = SecondRollups([GpuDevice(0, "GPU-AA", "x", max_sm_mhz=1980)])
    assert r.add(5 * S + 100, [_fast("GPU-AA", 10)]) == []
    assert r.add(5 * S + 900_000_000, [_fast("GPU-AA", 30, reasons=0x4)]) == []
    (closed,) = r.add(7 * S + 1, [_fast("GPU-AA", 50)])  # a gap: second 6 had no sample
    row = _row(closed)
    assert (row["sec_ns"], row["uuid"], row["n"]) == (5 * S, "aa", 2)
    assert (row["util_min"], row["util_mean"], row["util_max"]) == (10, 20, 30)
    assert (row["reasons_n"], row["reasons_any"], row["capped_n"]) == (2, 0x4, 0)  # 30 % not busy
    assert row["sm_limit_mhz"] == 1980
    (last,) = r.flush()
    assert (_row(last)["sec_ns"], _row(last)["n"]) == (7 * S, 1)
    assert r.flush() == []


def test_gpus_are_rolled_up_apart_and_slow_samples_join_the_open_second():
    r = SecondRollups()
    r.add(1 * S, [_fast("GPU-A", 100), _fast("GPU-B", 0)])
    assert r.add_slow(1 * S + 5, [_slow("GPU-A", 25e9, 0.0)]) == []
    # the slow sample stamped just before B's open second still joins it
    r.add(2 * S, [_fast("GPU-B", 0)])[0]
    r.add_slow(1 * S + 999_000_000, [_slow("GPU-B", 1e9, 50.0)])
    rows = {(_row(t)["uuid"], _row(t)["sec_ns"]): _row(t) for t in r.flush()}
    a, b2 = rows[("a", 1 * S)], rows[("b", 2 * S)]
    assert (a["slow_n"], a["pcie_rx_max_bps"], a["gpm_sm_util_mean"]) == (1, 25e9, 0.0)
    assert (b2["slow_n"], b2["pcie_rx_max_bps"], b2["gpm_sm_util_mean"]) == (1, 1e9, 50.0)
    assert a["idle_n"] == 0 and b2["idle_n"] == 1


def test_a_row_rebuilds_the_accumulator_it_was_written_from():
    r = SecondRollups()
    for i, util in enumerate((100, 90, 0)):
        r.add(3 * S + i, [_fast("GPU-A", util, sm=1400 + i, reasons=0x4)])
    r.add_slow(3 * S + 9, [_slow("GPU-A", 3e9, 40.0)])
    (t,) = r.flush()
    acc = accumulator_from_row(_row(t))
    stats = acc.stats()
    assert stats is not None
    assert (stats.samples, stats.util_mean_pct, stats.idle_share) == (3, 190 / 3, 1 / 3)
    assert stats.power_capped_share == 2 / 3  # the two busy samples of three
    assert stats.sm_mhz_power_capped == 1400.5
    assert stats.pcie_rx_max_kbps == 3e6 and stats.gpm_sm_util_pct == 40.0
    assert stats.mem_used_max_bytes == 10 * 2**30
