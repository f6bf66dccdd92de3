"""A database as gpuprofd's store writes and packs one, for the tests of
values damaged after the fact (raw SQL, another program, a bad disk): one
ended run with every kind of stored value a view decodes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuprof.insights.base import Insight
from gpuprof.kernels import KernelAgg
from gpuprofd.storage.reads import samplerows
from gpuprofd.storage.upkeep import hostrollup, samplepack, steppack, steprollup
from gpuprofd.storage.writes import runsdb
from tests.daemon.helpers import open_store

S = 1_000_000_000
#: The run's start, monotonic ns; its steps are 0.5 s apart.
START = 5_000 * S
START_WALL = 1_796_000_000_000_000_000
STEPS = 1_300
#: Where a step's t0 lies (ns).
STEP_NS = S // 2
END = START + STEPS * STEP_NS
BOOT = "boot-a"
GROUP = "job-1"
#: The span of a packed block of samples here (the daemon's: 600 s).
PACK_NS = 60 * S


def step_t0(i: int) -> int:
    return START + i * STEP_NS + 1_000


def _step(i: int) -> dict[str, Any]:
    t0 = step_t0(i)
    msg: dict[str, Any] = {
        "i": i,
        "t0": t0,
        "t1": t0 + 400_000_000,
        "wait": 20_000_000,
        "explicit": False,
        "micro": 1,
        "phases": {"forward": 150_000_000, "backward": 200_000_000, "optimizer": 40_000_000},
    }
    if i % 100 == 7:
        msg["optimizers"] = [{"name": "adam", "updates": 1, "skipped": 0, "ns": 9_000}]
    if i % 25 == 3:  # DDP's gradient buckets
        msg["comm"] = [[b, t0 + 1_000 * b, t0 + 1_000 * b + 500, 4_096] for b in range(3)]
    return msg


async def write(db: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run 1 in *db*: ended (``failed``, so no stored summary: a view builds
    it from the rows), :data:`STEPS` steps, block 0 (steps 0-999) packed,
    the rest rows; 2 Hz host and CPU samples, the older blocks packed;
    two findings, two kernel windows, sampled stacks, gradient buckets."""
    monkeypatch.setattr(steppack, "STEPS_RAW_KEPT", 100)
    monkeypatch.setattr(samplerows, "SAMPLE_PACK_NS", PACK_NS)
    monkeypatch.setattr(samplepack, "SAMPLE_PACK_NS", PACK_NS)
    monkeypatch.setattr(samplepack, "SAMPLES_RAW_KEPT_NS", 2 * PACK_NS)
    async with open_store(str(db)) as store:
        run = {
            "run_key": "k1",
            "run_name": "damaged",
            "status": "running",
            "host": "h",
            "pid": 1,
            "rank": 0,
            "local_rank": 0,
            "world_size": 1,
            "auto": 1,
            "start_wall_ns": START_WALL,
            "start_mono_ns": START,
            "options": {},
            "cpu_count": 8,
            "boot_id": BOOT,
            "group_id": GROUP,
        }
        run_id = await runsdb.insert_run(store, run)
        for i in range(STEPS):
            store.submit_nowait(runsdb.step_op(run_id, _step(i)))
        for k in range(2 * (END - START) // S):
            t = START + k * S // 2
            store.submit_nowait(runsdb.host_sample_op(t, 40.0 + k % 7, 8, 1e6, boot_id=BOOT))
            store.submit_nowait(runsdb.run_cpu_op(run_id, t, 1.5 + (k % 5) / 4))
        for n, steps in enumerate(([10, 11], [500, 501])):
            t0 = step_t0(steps[0])
            window = {"t0": t0, "t1": t0 + 2 * STEP_NS, "source": "snapshot", "steps": steps}
            rows = [
                KernelAgg("gemm", "kernel", "compute", 4, 600_000 + n, 600_000 + n),
                KernelAgg("relu", "kernel", "compute", 4, 300_000, 300_000),
            ]
            store.submit_all_nowait(runsdb.kernel_window_ops(run_id, window, rows))
        frames = [["train.py", 12, "step", "", 5, 30], ["data.py", 40, "load", "read", 5, 10]]
        store.submit_all_nowait(runsdb.stacks_ops(run_id, {"source": "main", "rows": frames}))
        await store.flush()
        found = [
            Insight("dataloader_stall", "warning", "Loader waits", "d", "f", {"wait_pct": 5.0}),
            Insight("small_kernels", "info", "Small kernels", "d", "f", {"kernels": 12}),
        ]
        await runsdb.replace_insights(store, run_id, found)
        await runsdb.update_run(
            store, run_id, status="failed", end_mono_ns=END, end_wall_ns=START_WALL + END - START
        )
        await store.flush()
        while await steprollup.roll_pass(store) or await hostrollup.roll_pass(store):
            pass
        assert await steppack.pack_round(store) == 1
        assert await samplepack.pack_round(store) > 4
    return run_id


def damage(db: Path, *sql: str) -> None:
    """Run *sql* on *db* as another program would (plain ``sqlite3``)."""
    conn = sqlite3.connect(db)
    for statement in sql:
        conn.execute(statement)
    conn.commit()
    conn.close()


def flip_middle(column: str) -> str:
    """SQL whose value is *column*'s BLOB with two bytes in its middle
    overwritten (a packed value's zlib data then fails its checks)."""
    half = f"length({column}) / 2"
    return f"CAST(substr({column}, 1, {half}) || x'00ff' || substr({column}, {half} + 3) AS BLOB)"
