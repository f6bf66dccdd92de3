"""A GPU rollup row as ``gpu_seconds``' parameters
(:func:`gpuprofd.sampling.rollup.insert_params`): each mean stored as the
total of its samples, NULL where the second's minimum and maximum are equal."""

from __future__ import annotations

from typing import Any

from gpuprofd.sampling.rollup import ROLLUP_COLUMNS, SECONDS_COLUMNS, insert_params


def _row(**values: Any) -> tuple[Any, ...]:
    return tuple(values.get(c) for c in ROLLUP_COLUMNS)


def _params(**values: Any) -> dict[str, Any]:
    uuid, boot, *rest = insert_params(_row(**values))
    return {"uuid": uuid, "boot_id": boot, **dict(zip(SECONDS_COLUMNS, rest, strict=True))}


def test_means_are_stored_as_totals_and_a_flat_second_as_its_minimum() -> None:
    got = _params(
        sec_ns=5,
        uuid="gpu-a",
        boot_id="b",
        n=10,
        util_min=90.0,
        util_mean=97.5,
        util_max=100.0,
        mem_used_min=7,
        mem_used_mean=7.0,
        mem_used_max=7,
        power_mean_mw=3.3,
        sm_limit_mhz=1980,
    )
    assert (got["uuid"], got["boot_id"], got["sec_ns"], got["n"]) == ("gpu-a", "b", 5, 10)
    assert got["util_total"] == 975.0  # 97.5 x 10 samples
    assert (got["util_min"], got["util_max"]) == (90.0, 100.0)
    assert got["mem_used_total"] is None  # min == max: the minimum says it
    assert got["power_total_mw"] == 33.0  # the integer it was divided from
    assert got["temp_total_c"] is None  # not read
    assert "sm_limit_mhz" not in got  # the GPU's, in its gpus row


def test_a_row_without_a_gpu_or_boot_is_keyed_by_empty_strings() -> None:
    got = _params(sec_ns=1, n=1, util_mean=40.0)
    assert (got["uuid"], got["boot_id"], got["util_total"]) == ("", "", 40.0)
