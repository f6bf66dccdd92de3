"""The regression's history read from storage on each backend: earlier runs
of the name scaled to this run's work of an iteration, as ``gpuprofctl
compare`` counts it, micro-batches included (gradient accumulation)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuprof.insights.history import regression
from gpuprofd.storage import reads
from gpuprofd.storage.writes import Store, runsdb
from tests.daemon.storage.test_backends import open_store, run_row, step_msg

MS = 1_000_000


async def _run(store: Store, key: str, micro: int, iteration_ms: int) -> int:
    """A run of 'acc': 40 steps of *micro* micro-batches, *iteration_ms* each
    (1 ms of it loader wait), ended with its median."""
    run_id = await runsdb.insert_run(store, run_row(key, "acc"))
    for i in range(40):
        msg: dict[str, Any] = step_msg(i, micro=micro)
        msg["t0"] = 10**12 + i * iteration_ms * MS + MS
        msg["t1"] = msg["t0"] + (iteration_ms - 1) * MS
        store.submit_nowait(runsdb.step_op(run_id, msg))
    await store.flush()
    await store.write(
        "UPDATE runs SET status = 'finished', median_step_ms = ? WHERE id = ?",
        (float(iteration_ms), run_id),
    )
    return run_id


async def _context(store: Store, run_id: int) -> Any:
    run = await reads.find_run(store, run_id=run_id)
    assert run is not None
    return await reads.run_context(store, run)


@pytest.mark.parametrize(
    ("micro", "iteration_ms", "unit", "fires"),
    [
        (4, 30, "micro-batch", False),  # 4x the work in 3x the time: faster
        (4, 60, "micro-batch", True),  # 4x the work in 6x the time: 50% slower
        (1, 15, "iteration", True),  # the same shape, 50% slower
    ],
)
async def test_accumulating_more_micro_batches_is_compared_per_micro_batch(
    storage_url: str, micro: int, iteration_ms: int, unit: str, fires: bool
) -> None:
    async with open_store(storage_url) as store:
        await _run(store, "a", 1, 10)
        await _run(store, "b", 1, 10)
        ctx = await _context(store, await _run(store, "c", micro, iteration_ms))
    assert ctx.history_unit == unit
    # the earlier runs' 10 ms iterations, as the time of this run's work
    assert ctx.history_iteration_ms[0][-1] == pytest.approx(10.0 * micro)
    found = regression(ctx)
    assert (found is not None) == fires
    if found is not None and unit == "micro-batch":
        assert "15 ms vs 10 ms a micro-batch (50% slower" in found.title
        assert "compared per micro-batch" in found.detail
