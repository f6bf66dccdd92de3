"""Storage of a long run: database size per GPU-hour, and how fast a 24-hour
8-GPU run opens (its series loaded, its insights computed).

Builds, in a temporary directory, the database gpuprofd would hold after a
24-hour run of 8 ranks on 8 GPUs: per-second GPU rollups made by the
daemon's own code from the recorded H200 trace (tiled over the day), the
raw window (10 Hz rows, 15 min), host and per-run CPU samples at the
daemon's 2 Hz and their 10 s host rollups (made by the daemon's own pass),
every step of every rank, DataLoader worker rows; the steps and the 2 Hz
samples then packed by the daemon's own passes, as it leaves them. Then it
times what a user does with it:

- ``gpuprofctl insights`` on one rank (a real subprocess: Python start-up,
  reading the run, its steps and its GPU rollups, the rules);
- the same in-process (open, context, rules), best of 3, and its CPU
  seconds by part (each read, the context built from them, the rules);
- loading one GPU's whole-day per-second series, and the node's 8 GPUs
  downsampled to 1-minute points (what a dashboard chart draws);
- SQLite's ``PRAGMA quick_check`` of the whole file (gpuprofd's check of
  a file it did not leave cleanly: :mod:`gpuprofd.storage.filecheck`).

Under DDP (``--comm-buckets``, 280 by default; 0 skips it) the ranks form
one torchrun group and every step also has its per-bucket comm timings. The
day's database holds the bucket rows (``comm_steps``) the daemon keeps once it has
pruned (:mod:`gpuprofd.storage.upkeep.commprune`: each run's last ``COMM_STEPS_KEPT`` steps
and every ``COMM_KEEP_EVERY``-th) and each rank's stored end-of-run summary,
as gpuprofd leaves them; ``gpuprofctl insights --group`` is timed on it. A
comm case (``--comm-prune-hours``, 1 h by default: a day is 48 M rows a rank,
too slow to write on a small box) stores one rank's every bucket row, gives
MB per GPU-hour as received, prunes it with the daemon's own code (bounded
passes through the store's writer) and gives MB per GPU-hour after.

A second case is one rank of a ``continuous_traces_hz=1`` run: a kernels
window a second, :data:`KERNELS_PER_WINDOW` rows each, stored as received,
then compacted by the daemon's own code (:mod:`gpuprofd.storage.upkeep.kcompact`, as at the
run's end with the default raw window): kernel rows per GPU-hour before and
after, and the time to load the day's kernel windows and compute insights.

    python bench/storage.py [--hours 24] [--gpus 8] [--step-ms 500] [--kernel-hours 24]
                            [--comm-buckets 280] [--comm-prune-hours 1]
    python bench/storage.py --sizes 1,6,24,72    # the growth table only

``--sizes`` prints one line per run length (the same day's database built for
that many hours): ``gpuprofctl insights`` on one rank cold and in-process,
``--group`` on the ranks, MB per GPU-hour; how each grows with the run.

Prints the figures; not a test (these machines are noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from gpuprof.insights import run_rules
from gpuprof.insights.distributed import group_rules
from gpuprof.insights.kernels import kernel_stats
from gpuprof.summary import make_summary
from gpuprofd.core.counters import DropCounter
from gpuprofd.sampling import rollup
from gpuprofd.sampling.nvml import RealNvml, normalize_uuid
from gpuprofd.sampling.nvml_replay import ReplayPynvml
from gpuprofd.services.sinks import STORED_GPU_HZ
from gpuprofd.storage import commpack, reads, schema, stepcodec
from gpuprofd.storage.reader import Reader, open_reader
from gpuprofd.storage.reads import steprows
from gpuprofd.storage.upkeep import (
    DEFAULT_RAW_WINDOW_S,
    commprune,
    hostrollup,
    kcompact,
    samplepack,
    steppack,
    steprollup,
)
from gpuprofd.storage.writes import Store, runsdb

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "h200" / "nvml_trace.jsonl"
S = 10**9
HOST_HZ = 2.0  # the daemon's default host interval, 0.5 s
SAMPLE_HZ = 100.0
GPU_UUIDS = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(64)]
#: Rows per continuous window: ~80 kernels and ~20 operators, what one step
#: of a mid-size transformer lists (the issue's "~100 kernels per window").
KERNELS_PER_WINDOW = 80
OPS_PER_WINDOW = 20
GROUP = "llm-24h"
#: Gradient bytes per bucket: DDP's default 25 MB cap.
BUCKET_BYTES = 25 * 2**20


def trace_rollups() -> list[tuple]:
    """Per-second rollups of the H200 trace (whole seconds), from the replay
    played through the real NVML backend and the daemon's SecondRollups."""
    now = [0.0]
    fake = ReplayPynvml.from_file(TRACE, clock=lambda: now[0])
    backend = RealNvml(fake, clock=lambda: now[0], name="replay")
    devices = backend.devices()
    r = rollup.SecondRollups(devices)
    rows: list[tuple] = []
    t0 = fake.trace.t_start
    for i in range(int(fake.trace.duration_s * SAMPLE_HZ)):
        now[0] = i / SAMPLE_HZ
        ns = int((t0 + i / SAMPLE_HZ) * S)
        rows += r.add(ns, [backend.sample(d) for d in devices])
        if i % int(SAMPLE_HZ) == 0:
            rows += r.add_slow(ns, [backend.slow_sample(d) for d in devices])
    return rows[1:]  # the first second was sampled in part


def build(db: Path, hours: float, gpus: int, step_ms: float) -> dict[str, int]:
    """Write the day's rows; returns row counts by table."""
    schema.prepare(db)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    seconds = int(hours * 3600)
    start = 1000 * S
    end = start + seconds * S
    uuids = GPU_UUIDS[:gpus]
    keys = [normalize_uuid(u) for u in uuids]
    template = trace_rollups()
    counts: dict[str, int] = {}

    def rollup_rows():
        for sec in range(seconds):
            t = template[sec % len(template)]
            for key in keys:
                yield rollup.insert_params((start + sec * S, key, *t[2:]))

    conn.executemany(
        rollup.GPU_SQL, rollup.gpu_rows((start, key, *template[0][2:]) for key in keys)
    )
    conn.executemany(rollup.INSERT_SQL, rollup_rows())
    counts["gpu_rollups"] = seconds * gpus

    raw_s = int(min(seconds, DEFAULT_RAW_WINDOW_S))
    raw = (
        (
            end - raw_s * S + int(k * S / STORED_GPU_HZ),
            g,
            uuids[g],
            90.0,
            70 * 2**30,
            141 * 2**30,
            650_000,
            71,
            1755,
            40.0,
            4,
        )
        for k in range(int(raw_s * STORED_GPU_HZ))
        for g in range(gpus)
    )
    conn.executemany(
        "INSERT INTO gpu_samples (mono_ns, gpu_index, uuid, util_pct, mem_used_bytes, "
        "mem_total_bytes, power_mw, temp_c, sm_clock_mhz, mem_util_pct, clock_event_reasons) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        raw,
    )
    counts["gpu_samples"] = int(raw_s * STORED_GPU_HZ) * gpus
    conn.executemany(
        "INSERT INTO gpu_slow_samples (mono_ns, uuid, energy_mj, energy_power_mw, pcie_rx_bps, "
        "pcie_tx_bps, gpm_sm_util_pct, gpm_sm_occupancy_pct, gpm_tensor_util_pct, "
        "gpm_dram_bw_util_pct, power_capped_pct, thermal_capped_pct) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            (
                end - raw_s * S + k * S,
                uuids[g],
                10**9 + k,
                650e3,
                2.1e9,
                0.3e9,
                71.0,
                40.0,
                55.0,
                38.0,
                0.0,
                0.0,
            )
            for k in range(raw_s)
            for g in range(gpus)
        ),
    )
    counts["gpu_slow_samples"] = raw_s * gpus

    host_n = int(seconds * HOST_HZ)
    conn.executemany(
        "INSERT INTO host_samples (mono_ns, cpu_pct, cpu_count, disk_read_bps, disk_read_iops, "
        "page_cache_bytes, mem_total_bytes, swap_in_bps) VALUES (?,?,?,?,?,?,?,?)",
        (
            (
                start + int(k * S / HOST_HZ),
                41.5 + k % 7,
                128,
                2.5e8 + k % 1000,
                1900.0 + k % 50,
                300 * 2**30,
                2048 * 2**30,
                0.0,
            )
            for k in range(host_n)
        ),
    )
    counts["host_samples"] = host_n

    step_ns = int(step_ms * 1e6)
    n_steps = seconds * S // step_ns
    for rank in range(gpus):
        conn.execute(
            "INSERT INTO runs (id, run_key, run_name, status, host, pid, rank, local_rank, "
            "world_size, auto, start_wall_ns, start_mono_ns, end_wall_ns, end_mono_ns, options, "
            "cuda_uuid, gpu_model, gpu_count, cpu_count, median_step_ms, group_id, "
            "local_world_size) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                rank + 1,
                f"day-{rank}",
                "llm-24h",
                "finished",
                "node1",
                1000 + rank,
                rank,
                rank,
                gpus,
                1,
                0,
                start,
                seconds * S,
                end,
                "{}",
                uuids[rank],
                "NVIDIA H200",
                gpus,
                128,
                step_ms,
                GROUP,
                gpus,
            ),
        )
        conn.executemany(
            "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases, "
            "skipped, eval_ns, optimizers, mem_allocated_bytes, mem_reserved_bytes, "
            "mem_peak_bytes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                (
                    rank + 1,
                    i,
                    start + i * step_ns + step_ns // 50,
                    start + (i + 1) * step_ns,
                    step_ns // 50 + i % 97 * 1000,
                    0,
                    4,
                    orjson.dumps(
                        {
                            "forward": step_ns * 3 // 10 + i % 89,
                            "backward": step_ns * 6 // 10 + i % 83,
                            "optimizer": step_ns // 20 + i % 79,
                        }
                    ).decode(),
                    0,
                    0,
                    None,
                    61 * 2**30 + i % 4096,
                    68 * 2**30,
                    66 * 2**30,
                )
                for i in range(n_steps)
            ),
        )
        conn.executemany(
            "INSERT INTO run_cpu_samples (run_id, mono_ns, cores) VALUES (?,?,?)",
            ((rank + 1, start + int(k * S / HOST_HZ), 5.0 + k % 13 / 10) for k in range(host_n)),
        )
        conn.executemany(
            "INSERT INTO worker_cpu (run_id, loader_seq, worker_id, pid, first_mono_ns, "
            "last_mono_ns, cpu_s) VALUES (?,?,?,?,?,?,?)",
            (
                (rank + 1, epoch, w, 50_000 + rank * 1000 + epoch * 10 + w, start, end, 3000.0 + w)
                for epoch in range(24)
                for w in range(8)
            ),
        )
    counts["steps"] = n_steps * gpus
    counts["run_cpu_samples"] = host_n * gpus
    counts["worker_cpu"] = 24 * 8 * gpus
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return counts


def bucket_rows(run_id: int, rank: int, steps, step_ns: int, n_buckets: int):
    """*run_id*'s bucket rows for *steps* (as the build's steps lay them out:
    backward is 60 % of the step after a 30 % forward; bucket ``b`` launched
    as its gradients are ready, every rank's all-reduce done 2 ms after the
    last launch; rank 3 launches 3 ms late: a straggler)."""
    start = 1000 * S
    bwd = step_ns * 6 // 10
    late = 3_000_000 if rank == 3 else 0
    for i in steps:
        t0 = start + i * step_ns + step_ns // 50
        back = t0 + step_ns * 3 // 10
        for b in range(n_buckets):
            ready = back + (b + 1) * bwd // n_buckets
            yield (
                run_id,
                i,
                b,
                ready + late + (i * 7 + b) % 50_000,
                ready + 3_000_000 + 2_000_000 + b % 1000,
                BUCKET_BYTES,
            )


def comm_steps(run_id: int, rank: int, steps, step_ns: int, n_buckets: int):
    """:func:`bucket_rows` packed one ``comm_steps`` row a step, as gpuprofd stores them."""
    for i in steps:
        rows = [r[2:] for r in bucket_rows(run_id, rank, (i,), step_ns, n_buckets)]
        yield commpack.step_row(run_id, i, rows)


def build_comm(db: Path, hours: float, gpus: int, step_ms: float, n_buckets: int) -> int:
    """The day's comm rows once pruned (each rank's last COMM_STEPS_KEPT steps
    and every COMM_KEEP_EVERY-th). Returns the rows."""
    step_ns = int(step_ms * 1e6)
    n_steps = int(hours * 3600) * S // step_ns
    cut = n_steps - commprune.COMM_STEPS_KEPT
    kept = [i for i in range(n_steps) if i >= cut or i % commprune.COMM_KEEP_EVERY == 0]
    conn = sqlite3.connect(db)
    for rank in range(gpus):
        conn.executemany(commpack.INSERT_SQL, comm_steps(rank + 1, rank, kept, step_ns, n_buckets))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return len(kept) * n_buckets * gpus


def comm_prune_case(tmp: str, hours: float, step_ms: float, n_buckets: int) -> None:
    """One rank's every bucket row for *hours*, then pruned by the daemon's code."""
    db = Path(tmp) / "comm.db"
    schema.prepare(db)
    step_ns = int(step_ms * 1e6)
    n_steps = int(hours * 3600) * S // step_ns
    t = time.perf_counter()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, options) "
        "VALUES (1, 'c', 'comm', 'finished', '{}')"
    )
    conn.executemany(
        "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases) "
        "VALUES (1, ?, ?, ?, 0, 0, 1, '{}')",
        ((i, 1000 * S + i * step_ns, 1000 * S + (i + 1) * step_ns) for i in range(n_steps)),
    )
    conn.executemany(commpack.INSERT_SQL, comm_steps(1, 0, range(n_steps), step_ns, n_buckets))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    rows = n_steps * n_buckets
    print(
        f"\ncomm buckets, one rank, {hours:g} h of {step_ms:g} ms steps with {n_buckets} "
        f"buckets: {rows:,} rows built in {time.perf_counter() - t:.0f} s"
    )
    before = table_bytes(db).get("comm_steps", 0)
    print(
        f"  as received: {before / rows:.0f} bytes a bucket (packed a step), "
        f"{before / 1e6 / hours:.1f} MB per GPU-hour; a 24-hour rank: "
        f"{before / hours * 24 / 1e9:.2f} GB, {rows / hours * 24 / 1e6:.1f} M rows"
    )

    async def prune() -> tuple[int, float]:
        store = Store(db, DropCounter())
        await store.open()
        store.start()
        try:
            pruner = commprune.CommPruner()
            passes, worst = 0, 0.0
            while True:
                t = time.perf_counter()
                if not await pruner.prune_pass(store):
                    break
                worst = max(worst, time.perf_counter() - t)
                passes += 1
            return passes, worst
        finally:
            await store.close()

    t = time.perf_counter()
    passes, worst = asyncio.run(prune())
    took = time.perf_counter() - t
    (left,) = read(db, "SELECT COALESCE(SUM(buckets), 0) FROM comm_steps")[0]
    conn = sqlite3.connect(db)
    conn.execute("VACUUM")
    conn.close()
    after = table_bytes(db).get("comm_steps", 0)
    print(
        f"  pruned by gpuprofd.storage.upkeep.commprune in {passes} passes of <= "
        f"{commprune.MAX_ROWS_PER_PASS:,} rows: {took:.1f} s "
        f"({(rows - left) / max(took, 1e-9) / 1e6:.2f} M rows/s, longest pass {worst:.2f} s); "
        f"{left:,} rows left = {after / 1e6:.1f} MB ({after / 1e6 / hours:.2f} MB per "
        f"GPU-hour over {hours:g} h; the window of {commprune.COMM_STEPS_KEPT:,} steps is "
        f"a fixed cost per run)"
    )


def build_continuous(db: Path, hours: float, step_ms: float) -> tuple[int, int]:
    """One rank's kernel windows of a ``continuous_traces_hz=1`` run, as the
    daemon stores them on receipt: one window a second over the step it
    traced, its kernels (a 5 ms one grows 60 % in the second half: kernel_drift
    must still see it after compaction) and operators. Returns (the run's
    last ns, rows)."""
    schema.prepare(db)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    start, seconds = 1000 * S, int(hours * 3600)
    end = start + seconds * S
    steps_per_s = max(1, int(1000 / step_ms))
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, start_mono_ns, end_mono_ns, options) "
        "VALUES (1, 'cont', 'llm-24h-continuous', 'finished', ?, ?, '{}')",
        (start, end),
    )
    conn.executemany(
        "INSERT INTO kernel_windows (id, run_id, t0_ns, t1_ns, source, steps, rows_dropped) "
        "VALUES (?, 1, ?, ?, 'continuous', ?, 0)",
        (
            (k + 1, start + k * S, start + k * S + int(step_ms * 1e6), f"[{k * steps_per_s}]")
            for k in range(seconds)
        ),
    )

    def rows():
        for k in range(seconds):
            grow = 1.6 if k >= seconds // 2 else 1.0
            for j in range(KERNELS_PER_WINDOW):
                ns = (int(5e6 * grow) if j == 0 else 200_000 + 3_000 * j) + k % 101
                yield (
                    k + 1,
                    f"sm90_kernel_{j}",
                    "kernel",
                    "comm" if j % 10 == 9 else "compute",
                    4 + j % 3,
                    ns,
                    ns,
                    None,
                )
            for j in range(OPS_PER_WINDOW):
                yield (
                    k + 1,
                    f"aten::op_{j}",
                    "op",
                    "compute",
                    2,
                    900_000 + j,
                    50_000,
                    1.5e11 if j % 2 == 0 else None,
                )

    conn.executemany(
        "INSERT INTO kernel_stats (window_id, run_id, name, kind, cls, count, total_ns, "
        "self_ns, flops) VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?)",
        rows(),
    )
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return end, seconds * (KERNELS_PER_WINDOW + OPS_PER_WINDOW)


async def compact(db: Path, now_ns: int) -> int:
    """Run the daemon's compaction passes until nothing is left to merge."""
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    merged = 0
    try:
        while n := await kcompact.compact_once(store, now_ns, DEFAULT_RAW_WINDOW_S):
            merged += n
    finally:
        await store.close()
    return merged


async def roll_hosts(db: Path) -> int:
    """Run the daemon's host rollup passes (as its maintenance loop does every
    10 s while the runs ran) until nothing is left to roll: the blocks rolled."""
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    rolled = 0
    try:
        while n := await hostrollup.roll_pass(store):
            rolled += n
    finally:
        await store.close()
    return rolled


async def pack_steps(db: Path) -> int:
    """Roll and pack the steps as the daemon's passes do (each run's step
    rollups and totals, then every packable block); the blocks packed."""
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    packed = 0
    try:
        while await steprollup.roll_pass(store):
            pass
        while n := await steppack.pack_round(store):
            packed += n
    finally:
        await store.close()
    return packed


async def pack_samples(db: Path) -> int:
    """Pack the host and run CPU samples as the daemon's pass does (after the
    host rollups: :func:`roll_hosts`), until nothing is left; the blocks packed."""
    schema.prepare(db)  # as gpuprofd starts: a day built by older code gets the tables
    store = Store(db, DropCounter())
    await store.open()
    store.start()
    packed = 0
    try:
        while n := await samplepack.pack_round(store):
            packed += n
    finally:
        await store.close()
    return packed


def in_use_bytes(db: Path) -> int:
    """The database file's bytes less its free pages (what later rows fill
    before the file grows)."""
    (free,) = read(db, "SELECT freelist_count * page_size FROM pragma_freelist_count, "
                       "pragma_page_size")[0]  # fmt: skip
    return db.stat().st_size - free


def cpu_s(fn: Any) -> tuple[float, Any]:
    """(CPU seconds, user + system, of *fn()*, its result)."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    got = fn()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, got


def steps_case(db: Path, gpu_hours: float) -> None:
    """Steps MB per GPU-hour and one rank's step read (CPU s) as stored, then
    after the daemon's packing (:mod:`gpuprofd.storage.upkeep.steppack`)."""

    def figures(label: str) -> None:
        sizes = table_bytes(db)
        mb = (sizes.get("steps", 0) + sizes.get("step_packs", 0)) / 1e6
        cpu, steps = cpu_s(lambda: read_db(db, lambda r: reads.run_steps(r, 1)))
        col_cpu, cols = cpu_s(lambda: read_db(db, lambda r: steprows.columns(r, 1)))
        print(
            f"steps {label}: {mb:.1f} MB = {mb / gpu_hours:.3f} MB per GPU-hour "
            f"(rows {sizes.get('steps', 0) / 1e6:.1f} MB, packed "
            f"{sizes.get('step_packs', 0) / 1e6:.1f} MB); one rank's {len(steps):,} steps "
            f"read: as dicts {cpu:.2f} s CPU, as columns {col_cpu:.2f} s CPU ({len(cols):,})"
        )

    figures("as received")
    t = time.perf_counter()
    blocks = asyncio.run(pack_steps(db))
    print(f"packed {blocks:,} blocks of steps in {time.perf_counter() - t:.0f} s")
    figures("packed")
    # the bench's steps repeat (i % 89): a block of noisy ones (ns jitter) packs as
    rnd = random.Random(1)
    rows = []
    for i in range(steppack.STEP_PACK):
        t0 = 10**12 + i * 500_000_000 + rnd.randrange(10**6)
        phases = {p: rnd.randrange(10**8) for p in ("forward", "backward", "optimizer", "comm")}
        rows.append((i, t0, t0 + 490_000_000 + rnd.randrange(10**7), rnd.randrange(10**7), 1,
                     1, orjson.dumps(phases).decode(), 0, 0, None,
                     61 * 2**30 + rnd.randrange(2**24), 68 * 2**30, 66 * 2**30, 0))  # fmt: skip
    per_step = len(stepcodec.encode(rows)) / len(rows)
    print(
        f"a block of noisy steps (random ns in every column): {per_step:.0f} bytes a step = "
        f"{per_step * 7200 / 1e6:.3f} MB per GPU-hour of 500 ms steps"
    )


def samples_case(db: Path, gpu_hours: float) -> None:
    """The 2 Hz host and run CPU samples' MB per GPU-hour and one rank's
    read of them (CPU s, as the report reads them) as stored, then after the
    daemon's packing (:mod:`gpuprofd.storage.upkeep.samplepack`)."""
    from gpuprofd.storage.reads import context as rc

    def figures(label: str) -> None:
        sizes = table_bytes(db)
        parts = {t: sizes.get(t, 0) / 1e6 for t in
                 ("host_samples", "host_packs", "run_cpu_samples", "run_cpu_packs")}  # fmt: skip
        run = read_db(db, lambda r: reads.get_run(r, 1))
        span = (run["start_mono_ns"], run["end_mono_ns"], run.get("boot_id"))
        host_cpu, host = cpu_s(lambda: read_db(db, lambda r: rc.host_columns(r, *span)))
        own_cpu, own = cpu_s(lambda: read_db(db, lambda r: rc.run_cpu_columns(r, 1)))
        print(
            f"2 Hz samples {label}: "
            + ", ".join(f"{t} {mb:.2f} MB" for t, mb in parts.items())
            + f" = {sum(parts.values()) / gpu_hours:.3f} MB per GPU-hour; one rank's read: "
            f"host {len(host):,} in {host_cpu:.3f} s CPU, its CPU {len(own):,} in "
            f"{own_cpu:.3f} s CPU"
        )

    figures("as received")
    t = time.perf_counter()
    blocks = asyncio.run(pack_samples(db))
    print(f"packed {blocks:,} blocks of samples in {time.perf_counter() - t:.0f} s")
    figures("packed")


def read_db(db: Path, fn: Any) -> Any:
    """``await fn(reader)`` on a read-only :class:`Reader` of *db* (as gpuprofctl reads)."""

    async def main() -> Any:
        async with open_reader(db) as reader:
            return await fn(reader)

    return asyncio.run(main())


async def _context(reader: Reader, run_id: int = 1) -> Any:
    return await reads.run_context(reader, await reads.get_run(reader, run_id))


def _cpu_s() -> float:
    """This process's CPU seconds, user + system, every thread (the reads run in threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def report_parts(db: Path, run_id: int = 1) -> dict[str, float]:
    """CPU seconds of each part of the in-process report on *run_id*, one
    after another (:func:`reads.run_context` runs some of them at once):
    each read in the form the context takes it, the context built from
    them, the rules."""
    from gpuprof.insights import build_context
    from gpuprofd.storage.reads import context as rc

    async def parts(reader: Reader) -> dict[str, float]:
        out: dict[str, float] = {}

        async def timed(name: str, coro: Any) -> Any:
            c = _cpu_s()
            got = await coro
            out[name] = _cpu_s() - c
            return got

        run = await reads.get_run(reader, run_id)
        steps = await timed("steps read (columns)", rc.run_step_columns(reader, run_id))
        span = (run["start_mono_ns"], run["end_mono_ns"], run.get("boot_id"))
        host = await timed("host samples", rc.host_columns(reader, *span))
        own = await timed("the run's CPU samples", rc.run_cpu_columns(reader, run_id))
        job = await timed("the job's CPU", rc.job_cpu(reader, run, own, host.mono_ns))
        gpu = await timed("GPU rollups", rc.gpu_stats(reader, run, steps))
        comm = await timed("bucket totals", rc.comm_totals(reader, run_id))
        workers = await timed("worker rows", rc.worker_cpu(reader, run_id))
        c = _cpu_s()
        ctx = build_context(
            run, steps, host, run_cpu=own, gpu=gpu, workers=workers, comm=comm, job_cpu=job
        )
        out["context built"] = _cpu_s() - c
        c = _cpu_s()
        run_rules(ctx)
        out["rules"] = _cpu_s() - c
        return out

    return read_db(db, parts)


def kernel_load(db: Path) -> tuple[int, int, object]:
    """Load the run's kernel windows and compute its kernel insights:
    (windows, rows, the kernel_drift evidence or None)."""

    async def load(reader: Reader) -> tuple[Any, Any]:
        return await reads.kernel_windows(reader, 1), await _context(reader)

    windows, ctx = read_db(db, load)
    drift = next((i for i in run_rules(ctx) if i.rule == "kernel_drift"), None)
    assert kernel_stats(windows) is not None
    return len(windows), sum(len(r) for _, r in windows), drift


def continuous_case(tmp: str, hours: float, step_ms: float) -> None:
    """Print the continuous-traces figures (see the module doc)."""
    db = Path(tmp) / "continuous.db"
    t = time.perf_counter()
    end, n_rows = build_continuous(db, hours, step_ms)
    print(
        f"\ncontinuous traces at 1 Hz, one rank, {hours:g} h: {n_rows:,} kernel rows "
        f"({KERNELS_PER_WINDOW + OPS_PER_WINDOW} a window) built in "
        f"{time.perf_counter() - t:.0f} s"
    )

    def figures(label: str) -> None:
        sizes = table_bytes(db)
        (rows,) = read(db, "SELECT COUNT(*) FROM kernel_stats")[0]
        (wins,) = read(db, "SELECT COUNT(*) FROM kernel_windows")[0]
        mb = (sizes.get("kernel_stats", 0) + sizes.get("kernel_windows", 0)) / 1e6
        t = time.perf_counter()
        _, _, drift = kernel_load(db)
        s = time.perf_counter() - t
        ev = drift.evidence if drift is not None else {}
        print(
            f"  {label}: {wins:,} windows, {rows:,} kernel rows = {rows / hours:,.0f} per "
            f"GPU-hour, {mb / hours:.2f} MB per GPU-hour; open + load + insights {s:.2f} s; "
            f"kernel_drift: {ev.get('kernel')} {ev.get('first_half_ms')} -> "
            f"{ev.get('second_half_ms')} ms per {ev.get('unit')}"
        )

    figures("as received")
    t = time.perf_counter()
    merged = asyncio.run(compact(db, end + int(DEFAULT_RAW_WINDOW_S * S)))
    print(
        f"  compaction (storage.kcompact passes, through the store's writer): {merged:,} "
        f"windows merged in {time.perf_counter() - t:.0f} s"
    )
    conn = sqlite3.connect(db)
    conn.execute("VACUUM")
    conn.close()
    figures("compacted")


def table_bytes(db: Path) -> dict[str, int]:
    """Bytes per table, its indexes included (SQLite's dbstat)."""
    conn = sqlite3.connect(db)
    try:
        owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master"))
        out: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            out[owner.get(name, name)] = out.get(owner.get(name, name), 0) + size
        # the tables behind what the day's rows are counted as
        out["gpu_rollups"] = out.get("gpu_seconds", 0) + out.get("gpus", 0)
        out["comm_buckets"] = out.get("comm_steps", 0)
        return out
    finally:
        conn.close()


def read(db: Path, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def best_of(n: int, fn) -> tuple[float, object]:
    best, result = math.inf, None
    for _ in range(n):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def store_summaries(db: Path, gpus: int) -> None:
    """Each rank's end-of-run summary, as gpuprofd stores it when the rank
    ends (rank 1's, built once, for all)."""
    summary = make_summary(1, read_db(db, _context), [], str(db))
    conn = sqlite3.connect(db)
    conn.executemany(
        "UPDATE runs SET summary = ? WHERE id = ?",
        [(orjson.dumps({**summary, "run_id": r + 1}).decode(), r + 1) for r in range(gpus)],
    )
    conn.commit()
    conn.close()


def store_group_findings(db: Path) -> tuple[str, ...]:
    """The group's findings, stored as gpuprofd stores them once every rank
    has ended (the group rules over the store, then
    :func:`gpuprofd.storage.writes.runsdb.replace_group_insights`, which also
    marks the group checked when they find nothing): the rules that fired."""

    async def run() -> tuple[str, ...]:
        schema.prepare(db)  # as gpuprofd starts
        store = Store(db, DropCounter())
        await store.open()
        store.start()
        try:
            found = await reads.group_findings(store, GROUP)
            await runsdb.replace_group_insights(store, GROUP, found["ranks"], found["insights"])
            return tuple(i["rule"] for i in found["insights"])
        finally:
            await store.close()

    return asyncio.run(run())


#: Whether :func:`ctl` has compiled the packages' bytecode yet (once a run).
_COMPILED: list[bool] = []


def ctl(*args: str) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Run ``gpuprofctl ARGS`` in a new process: (wall seconds, its CPU seconds
    (user + system: what a shared box's load does not inflate), the process)."""
    exe = ROOT / ".venv" / "bin" / "gpuprofctl"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuprofd.ctl"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if not _COMPILED:  # as pip compiles an installed package: a user's start-up
        packages = [str(ROOT / d) for d in ("gpuprof", "daemon/gpuprofd", "shim/gpuprof_shim")]
        subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=False)
        _COMPILED.append(True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, proc


def size_line(tmp: str, hours: float, args: argparse.Namespace) -> None:
    """One line of the growth table: the day's database built for *hours*, then
    ``gpuprofctl insights`` on rank 0 (cold process, no stored summary: what
    gpuprofd computes at a run's end and a reader of a run without one
    waits for), the same in-process (open + context + rules, one pass),
    ``gpuprofctl insights`` again once each rank's summary is stored (as
    gpuprofd leaves an ended run: what a reader of yesterday's run waits),
    ``gpuprofctl insights --group`` on the ranks once the group's findings
    are stored (as gpuprofd leaves an ended group), and MB per GPU-hour."""
    db = Path(tmp) / f"size-{hours:g}h.db"
    t = time.perf_counter()
    counts = build(db, hours, args.gpus, args.step_ms)
    asyncio.run(roll_hosts(db))
    build_comm(db, hours, args.gpus, args.step_ms, args.comm_buckets)
    asyncio.run(pack_steps(db))
    asyncio.run(pack_samples(db))
    built = time.perf_counter() - t
    mb_gpu_hour = in_use_bytes(db) / 1e6 / (hours * args.gpus)
    cold, cold_cpu, proc = ctl("insights", str(db), "1", "--format", "json")
    ok = "" if proc.returncode == 0 else f" (exit {proc.returncode}: {proc.stderr[-200:]})"
    t, c = time.perf_counter(), time.process_time()
    run_rules(read_db(db, _context))
    inproc, inproc_cpu = time.perf_counter() - t, time.process_time() - c
    store_summaries(db, args.gpus)
    stored, stored_cpu, sproc = ctl("insights", str(db), "1", "--format", "json")
    ok += "" if sproc.returncode == 0 else f" (stored exit {sproc.returncode})"
    store_group_findings(db)
    group, group_cpu, gproc = ctl("insights", str(db), "--group", GROUP, "--format", "json")
    ok += "" if gproc.returncode == 0 else f" (group exit {gproc.returncode})"
    steps = counts["steps"] // args.gpus
    print(
        f"{hours:>6g} h {steps:>10,} {cold:>6.2f} ({cold_cpu:.2f}) {inproc:>6.2f} "
        f"({inproc_cpu:.2f}) {stored:>6.2f} ({stored_cpu:.2f}) {group:>6.2f} ({group_cpu:.2f}) "
        f"{mb_gpu_hour:>9.2f} {built:>8.0f}{ok}",
        flush=True,
    )
    for path in db.parent.glob(db.name + "*"):
        path.unlink()


def sizes_case(tmp: str, args: argparse.Namespace) -> None:
    """The growth table: :func:`size_line` for each of ``--sizes``."""
    print(
        f"{args.gpus} ranks on {args.gpus} GPUs, one {args.step_ms:g} ms step each, "
        f"{args.comm_buckets} buckets (pruned); wall seconds (CPU seconds), one run each; "
        f"load average {os.getloadavg()[0]:.2f} at the start"
    )
    print(
        f"{'run':>8} {'steps/rank':>10} {'ctl cold':>13} {'in-process':>13} {'stored':>13} "
        f"{'--group':>13} {'MB/GPU-h':>9} {'built s':>8}"
    )
    for hours in args.sizes:
        size_line(tmp, hours, args)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


def group_case(db: Path, args: argparse.Namespace) -> None:
    """Time ``gpuprofctl insights --group`` on the day (pruned comm rows, each
    rank's stored summary), its findings computed (as while a rank runs) and
    then stored (as gpuprofd leaves an ended group)."""
    store_summaries(db, args.gpus)
    computed, computed_cpu, _ = ctl("insights", str(db), "--group", GROUP, "--format", "json")
    fired = store_group_findings(db)
    stored, stored_cpu, proc = ctl("insights", str(db), "--group", GROUP, "--format", "json")
    found = orjson.loads(proc.stdout)["insights"] if proc.returncode == 0 else proc.stderr[-300:]
    said = (
        [(i["rule"], i["evidence"].get("rank")) for i in found] if proc.returncode == 0 else found
    )
    print(
        f"gpuprofctl insights --group on the {args.gpus}-rank day (pruned bucket rows, stored "
        f"summaries), wall s (CPU s): its findings computed {computed:.2f} ({computed_cpu:.2f}), "
        f"stored {stored:.2f} ({stored_cpu:.2f}); exit {proc.returncode}; group findings: "
        f"{said} (the rules fired: {list(fired)})"
    )

    def findings():
        return group_rules(read_db(db, lambda reader: reads.group_context(reader, GROUP)))

    s, _ = best_of(3, findings)
    print(
        f"in-process group context + rules (what gpuprofd runs at a rank's end): {s:.2f} s "
        "(best of 3)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--step-ms", type=float, default=500.0)
    ap.add_argument(
        "--kernel-hours",
        type=float,
        default=24.0,
        help="hours of the continuous-traces case (0: skip it)",
    )
    ap.add_argument("--only-kernels", action="store_true", help="run only that case")
    ap.add_argument(
        "--comm-buckets",
        type=int,
        default=280,
        help="DDP buckets per step (0: no comm rows, no group)",
    )
    ap.add_argument(
        "--comm-prune-hours",
        type=float,
        default=1.0,
        help="hours of one rank's every bucket row for the pruning case (0: skip)",
    )
    ap.add_argument("--only-comm", action="store_true", help="run only the pruning case")
    ap.add_argument(
        "--sizes",
        type=lambda text: [float(h) for h in text.split(",")],
        default=None,
        metavar="H,H,...",
        help="only the growth table: one line per run length in hours (e.g. 1,6,24,72)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuprof-bench-") as tmp:
        if args.only_kernels:
            continuous_case(tmp, args.kernel_hours, args.step_ms)
            return
        if args.only_comm:
            comm_prune_case(tmp, args.comm_prune_hours, args.step_ms, args.comm_buckets)
            return
        if args.sizes:
            sizes_case(tmp, args)
            return
        db = Path(tmp) / "day.db"
        t = time.perf_counter()
        counts = build(db, args.hours, args.gpus, args.step_ms)
        counts["host_rollups"] = asyncio.run(roll_hosts(db))
        if args.comm_buckets > 0:
            counts["comm_buckets"] = build_comm(
                db, args.hours, args.gpus, args.step_ms, args.comm_buckets
            )
        print(
            f"built {db.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t:.0f} s: "
            f"{args.hours:g} h, {args.gpus} GPUs at {SAMPLE_HZ:g} Hz, one {args.step_ms:g} ms "
            "step per rank"
        )
        sizes = table_bytes(db)
        gpu_hours = args.hours * args.gpus
        print(f"{'table':<18}{'rows':>12}{'MB':>9}{'bytes/row':>11}{'MB per GPU-hour':>17}")
        for name in sorted(counts, key=lambda n: -sizes.get(n, 0)):
            b = sizes.get(name, 0)
            print(
                f"{name:<18}{counts[name]:>12,}{b / 1e6:>9.1f}{b / max(1, counts[name]):>11.0f}"
                f"{b / 1e6 / gpu_hours:>17.3f}"
            )
        total = db.stat().st_size
        print(f"database: {total / 1e6:.1f} MB = {total / 1e6 / gpu_hours:.2f} MB per GPU-hour")
        raw_row = sizes["gpu_samples"] / counts["gpu_samples"]
        rollup_gpu_hour = sizes["gpu_rollups"] / gpu_hours
        raw_gpu_hour = raw_row * SAMPLE_HZ * 3600
        print(
            f"GPU samples per GPU-hour: rollups {rollup_gpu_hour / 1e6:.2f} MB vs every "
            f"{SAMPLE_HZ:g} Hz sample raw {raw_gpu_hour / 1e6:.1f} MB "
            f"({raw_gpu_hour / rollup_gpu_hour:.0f}x) or 10 Hz raw "
            f"{raw_row * STORED_GPU_HZ * 3600 / 1e6:.1f} MB"
        )

        steps_case(db, gpu_hours)
        samples_case(db, gpu_hours)
        used = in_use_bytes(db)
        print(
            f"database after packing: {used / 1e6 / gpu_hours:.2f} MB per GPU-hour "
            f"in use ({(db.stat().st_size - used) / 1e6:.0f} MB of the file's pages free, "
            "for later rows)"
        )

        cmd = [sys.executable, "-m", "gpuprofd.ctl", "insights", str(db), "1", "--format", "json"]
        ctl = ROOT / ".venv" / "bin" / "gpuprofctl"
        if ctl.exists():
            cmd = [str(ctl), "insights", str(db), "1", "--format", "json"]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        ctl_s = time.perf_counter() - t
        print(
            f"gpuprofctl insights on one rank ({args.hours:g} h; process start-up, the run's "
            f"steps and GPU rollups read, its summary built): {ctl_s:.2f} s wall, exit "
            f"{proc.returncode}{'' if proc.returncode == 0 else ': ' + proc.stderr[-200:]}"
        )

        def insights():
            ctx = read_db(db, _context)
            return ctx, run_rules(ctx)

        s, (ctx, fired) = best_of(3, insights)
        print(f"rules fired on the tiled H200 day: {sorted(i.rule for i in fired)}")
        print(
            f"in-process open + context + rules, one rank ({len(ctx.step_ms):,} steps, "
            f"{ctx.gpu.samples if ctx.gpu else 0:,} GPU samples in rollups): "
            f"{s:.2f} s (best of 3)"
        )

        c = _cpu_s()
        read_db(db, _context)
        print(f"the same, CPU seconds (one pass): {_cpu_s() - c:.2f}; by part, one after another:")
        for name, sec in report_parts(db).items():
            print(f"  {name:<24}{sec:>6.2f}")

        series_sql = (
            "SELECT sec_ns, util_mean, mem_used_max, power_mean_mw FROM gpu_rollups "
            "WHERE uuid = ? AND boot_key = '' ORDER BY sec_ns"
        )
        s, rows = best_of(3, lambda: read(db, series_sql, (normalize_uuid(GPU_UUIDS[0]),)))
        print(f"one GPU's per-second series ({len(rows):,} points): {s:.2f} s")
        node_sql = (
            "SELECT uuid, sec_ns / 60000000000 AS m, SUM(util_mean * n) / SUM(n), "
            "MAX(mem_used_max), AVG(power_mean_mw) FROM gpu_rollups GROUP BY uuid, m"
        )
        s, rows = best_of(3, lambda: read(db, node_sql))
        print(f"the node's {args.gpus} GPUs at 1-minute points ({len(rows):,} points): {s:.2f} s")
        s, rows = best_of(3, lambda: read(db, "PRAGMA quick_check"))
        print(
            f"PRAGMA quick_check of the day's file ({db.stat().st_size / 1e6:.0f} MB, "
            f"{in_use_bytes(db) / 1e6:.0f} MB in use; what gpuprofd runs at a start after a "
            f"crash or a change of the file): {s:.2f} s, {rows[0][0]}"
        )
        if args.comm_buckets > 0:
            group_case(db, args)
        if args.comm_buckets > 0 and args.comm_prune_hours > 0:
            comm_prune_case(tmp, args.comm_prune_hours, args.step_ms, args.comm_buckets)
        if args.kernel_hours > 0:
            continuous_case(tmp, args.kernel_hours, args.step_ms)


if __name__ == "__main__":
    main()
