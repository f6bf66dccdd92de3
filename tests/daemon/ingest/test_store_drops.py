"""Events gpuprofd received but could not store are the run's: counted per
run while it is live, stored with it at its end, shown by ``gpuprofctl runs``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from gpuprofd.counters import DropCounter
from gpuprofd.ctl import main
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.insights_runner import InsightsRunner
from gpuprofd.storage import schema
from gpuprofd.storage.store import Store
from tests.daemon import helpers as h
from tests.daemon.helpers import query


async def _busy_run(db: Path) -> None:
    """A run of 12 steps through real ingest into a store whose writer stalls
    with 5 places in its queue; 3 events lost in the training process."""
    schema.prepare(db)
    drops = DropCounter()
    store = Store(db, drops, queue_size=5)
    await store.open()  # the writer is not started yet: the queue fills
    runs = RunService(store, RunRegistry(), InsightsRunner(store, str(db), None), [],
                      pid_alive=lambda pid, _wall: True)  # fmt: skip
    ingest = Ingest(None, runs, store, drops)  # type: ignore[arg-type] - frames handed in
    try:
        store.start()
        live = await runs.hello(h.hello("k", os.getpid(), run_name="busy"))
        await store.flush()
        store._task.cancel()  # a writer that cannot keep up
        store._task = None
        base = 1_000_000_000
        for i in range(12):
            await ingest.handle(orjson.dumps(h.step("k", i, base)))
        assert live.store_dropped == 7 and drops.snapshot()["store_backpressure"] == 7
        store.start()
        await runs.bye(h.bye("k", sent=12, dropped=3))
    finally:
        await store.close()


def test_a_full_store_queue_counts_against_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "d.db"
    asyncio.run(_busy_run(db))
    (row,) = query(db, "SELECT dropped_events, store_dropped_events FROM runs")
    assert tuple(row) == (3, 7)
    assert query(db, "SELECT COUNT(*) FROM steps")[0][0] == 5
    assert main(["runs", str(db), "--format", "json"]) == 0
    (run,) = orjson.loads(capsys.readouterr().out)
    assert (run["dropped_events"], run["store_dropped_events"]) == (3, 7)
    assert main(["runs", str(db)]) == 0
    header, line = capsys.readouterr().out.splitlines()[:2]
    assert header.split()[-1] == "DROPPED" and line.split()[-1] == "10"
