"""The SQLite schema of a gpuprof database and the check that a file is ours.
(Past 500 lines by design: the schema is defined once, every table with its
columns' units and every migration step in one place, for both backends.)

Table and column names are an interface: integration tests, ``gpuprofctl``
and (later) the dashboard read them. Times are ``*_ns`` (monotonic or wall
nanoseconds, as named), byte counts ``*_bytes``, rates ``*_bps`` (bytes/s),
power ``*_mw`` (milliwatts).

Tiering (what a long run leaves behind, see ``bench/storage.py``): raw GPU
samples for the daemon's raw window only, per-second GPU rollups for the
whole run (``gpu_seconds``, keyed by a small ``gpus`` id, read through the
``gpu_rollups`` view that joins each GPU's UUID and boot back in); every host
sample and run CPU sample, the newest as rows, older ones packed per block of
10 min into ``host_packs`` / ``run_cpu_packs`` rows once their host rollups
are written (columnar, lossless: ``gpuprofd.storage.upkeep.samplepack``; every
read of them goes through ``gpuprofd.storage.reads.samplerows``), and per run
``host_rollups`` of them (10 s blocks, ``gpuprofd.storage.upkeep.hostrollup``)
for the whole-run charts; continuous
kernel windows merged as they age (``gpuprofd.storage.upkeep.kcompact``);
every step kept: a run's last ``STEPS_RAW_KEPT`` steps (by index) as ``steps``
rows, older ones packed per block of 1,000 into ``step_packs`` rows (columnar,
compressed, lossless: ``gpuprofd.storage.upkeep.steppack``; every read of steps
goes through ``gpuprofd.storage.reads.steprows``), and per block of 100 steps the
figures ``gpuprofctl runs`` shows (``step_totals``, ``gpuprofd.storage.reads.steptotals``)
and the step chart's (``step_rollups``). ``comm_steps`` (one row per DDP step, its
buckets packed by ``gpuprofd.storage.commpack``: ~1 KB for 280 buckets) keeps, per run, the
steps whose index is within ``COMM_STEPS_KEPT`` of the run's latest step
(the window the group rules read, ``gpuprofd.storage.reads.GROUP_STEPS_MAX``) and
every ``COMM_KEEP_EVERY``-th step for history; the daemon deletes the rest in
bounded passes (``gpuprofd.storage.upkeep.commprune``). Each step's exposed comm stays in
its ``steps.phases`` (``comm``) whatever is pruned.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from gpuprof.insights.gpu import (
    BUSY_UTIL_PCT,
    IDLE_UTIL_PCT,
    REASON_GPU_IDLE,
    REASON_SW_POWER_CAP,
    THERMAL_REASONS,
)
from gpuprofd.core.errors import DatabaseError
from gpuprofd.sampling import rollup
from gpuprofd.storage import commpack, filecheck, textcells

SCHEMA_VERSION = 24
#: Columns added since schema 1: (table, column, declaration).
_ADDED_IN_2 = (
    ("steps", "skipped", "INTEGER DEFAULT 0"),
    ("steps", "eval_ns", "INTEGER DEFAULT 0"),
    ("steps", "optimizers", "TEXT"),
    ("runs", "trailing_eval_ns", "INTEGER DEFAULT 0"),
)
#: ... and since schema 2 (the slow-loop table is new: created by SCHEMA_SQL).
_ADDED_IN_3 = (
    ("gpu_samples", "mem_util_pct", "REAL"),
    ("gpu_samples", "clock_event_reasons", "INTEGER"),
    ("host_samples", "disk_read_iops", "REAL"),
    ("host_samples", "page_cache_bytes", "INTEGER"),
    ("host_samples", "mem_total_bytes", "INTEGER"),
    ("host_samples", "swap_in_bps", "REAL"),
)
#: ... and since schema 3 (gpu_rollups and worker_cpu are new tables).
_ADDED_IN_4 = (
    ("steps", "mem_allocated_bytes", "INTEGER"),
    ("steps", "mem_reserved_bytes", "INTEGER"),
    ("steps", "mem_peak_bytes", "INTEGER"),
)
#: ... and since schema 4 (kernel_windows and kernel_stats are new tables).
_ADDED_IN_5 = (
    ("runs", "boot_id", "TEXT"),
    ("host_samples", "boot_id", "TEXT"),
    ("gpu_rollups", "boot_id", "TEXT"),
    ("steps", "traced", "INTEGER DEFAULT 0"),
    ("runs", "mfu", "REAL"),
    ("runs", "achieved_tflops", "REAL"),
    ("runs", "group_id", "TEXT"),
    ("runs", "local_world_size", "INTEGER"),
)
#: ... and since schema 5 (comm_buckets is a new table): a rank's clock offset
#: against the reference rank (the shim's ``clock`` event, gpuprof.comm.ClockOffset).
_ADDED_IN_6 = (
    ("runs", "clock_offset_ns", "INTEGER"),
    ("runs", "clock_uncertainty_ns", "INTEGER"),
    ("runs", "clock_rtt_ns", "INTEGER"),
    ("runs", "clock_round_trips", "INTEGER"),
    ("runs", "clock_reference_rank", "INTEGER"),
)
#: ... and since schema 7: events gpuprofd received for a run but could not store.
#: ... and the daemon that tracks a run (several may share one Postgres database).
_ADDED_IN_8 = (
    ("runs", "store_dropped_events", "INTEGER DEFAULT 0"),
    ("runs", "daemon", "TEXT"),
)
#: ... and since schema 9: a run's identity across nodes (made at hello) and, on a
#: team server, the node that forwarded it (ingest_nodes, login_limits and
#: server_secrets are new tables).
_ADDED_IN_10 = (
    ("runs", "run_uuid", "TEXT"),
    ("runs", "node_id", "TEXT"),
)
#: ... and since schema 13: who trained (the login name the shim sends at hello).
_ADDED_IN_14 = (("runs", "user_name", "TEXT"),)
#: ... and since schema 15: the project a run counts to and its tags (gpuprof.labels).
_ADDED_IN_16 = (("runs", "project", "TEXT"), ("runs", "tags", "TEXT"))
#: ... and since schema 16: the highest shim message stored (a resend is stored once).
_ADDED_IN_17 = (("runs", "shim_seq", "INTEGER DEFAULT 0"),)
#: The runs columns of schema 17, as an older database read as it is shows them.
_RUNS_17 = ", 0 AS shim_seq"
#: The runs columns of schema 16, NULL in an older database read as it is.
_RUNS_16 = ", NULL AS project, NULL AS tags" + _RUNS_17
#: The runs columns of schema 14, NULL in an older database read as it is.
_RUNS_14 = ", NULL AS user_name" + _RUNS_16
#: The runs columns of schema 10, as an older database read as it is shows them.
_RUNS_10 = ", NULL AS run_uuid, NULL AS node_id" + _RUNS_14
#: ... and since schema 10: each DataLoader worker's context switches (voluntary:
#: it slept or blocked; involuntary: it was preempted, i.e. wanted the CPU).
_ADDED_IN_11 = (
    ("worker_cpu", "ctx_voluntary", "INTEGER"),
    ("worker_cpu", "ctx_involuntary", "INTEGER"),
)
#: Schema 13 adds a table only (viewer_sessions: the team server's logins), made by SCHEMA_SQL.
#: The worker_cpu columns of schema 11, NULL in an older database read as it is.
_WORKER_CPU_11 = ", NULL AS ctx_voluntary, NULL AS ctx_involuntary"
#: The runs columns of schema 8, as an older database read as it is shows them.
_RUNS_8 = ", 0 AS store_dropped_events, NULL AS daemon" + _RUNS_10
#: The runs columns of schema 6, NULL in an older database read as it is.
_RUNS_6 = tuple(c for _, c, _ in _ADDED_IN_6)
APP_NAME = "gpuprof"
#: (the schema version that added them, the columns) for each upgrade.
_ADDED = (
    (2, _ADDED_IN_2),
    (3, _ADDED_IN_3),
    (4, _ADDED_IN_4),
    (5, _ADDED_IN_5),
    (6, _ADDED_IN_6),
    (8, _ADDED_IN_8),
    (10, _ADDED_IN_10),
    (11, _ADDED_IN_11),
    (14, _ADDED_IN_14),
    (16, _ADDED_IN_16),
    (17, _ADDED_IN_17),
)


def _norm_uuid_sql(col: str) -> str:
    """SQL for :func:`gpuprofd.sampling.nvml.normalize_uuid` of column *col*."""
    low = f"lower(trim({col}))"
    return (
        f"CASE WHEN {low} LIKE 'mig-gpu-%' THEN 'mig:' || substr({low}, 9) "
        f"WHEN {low} LIKE 'gpu-%' OR {low} LIKE 'mig-%' THEN substr({low}, 5) ELSE {low} END"
    )


_REASONS = "COALESCE(clock_event_reasons, 0)"
_SEC = "(mono_ns - mono_ns % 1000000000)"  # the second a sample falls in, as rollups key it
#: Raw samples of a schema 1-3 database as gpu_rollups rows: each fast sample a
#: one-sample rollup of its second, each slow sample a slow-only one. Used to upgrade such a
#: database and to read one that cannot be written.
_RAW_AS_ROLLUPS_SQL = (
    f"SELECT {_SEC} AS sec_ns, {_norm_uuid_sql('uuid')} AS uuid, "
    "CASE WHEN util_pct IS NULL THEN 0 ELSE 1 END AS n, util_pct AS util_min, "
    "util_pct AS util_mean, util_pct AS util_max, "
    f"CASE WHEN util_pct <= {IDLE_UTIL_PCT} THEN 1 ELSE 0 END AS idle_n, "
    "mem_used_bytes AS mem_used_min, mem_used_bytes AS mem_used_mean, "
    "mem_used_bytes AS mem_used_max, mem_total_bytes, power_mw AS power_min_mw, "
    "power_mw AS power_mean_mw, power_mw AS power_max_mw, temp_c AS temp_min_c, "
    "temp_c AS temp_mean_c, temp_c AS temp_max_c, sm_clock_mhz AS sm_min_mhz, "
    "sm_clock_mhz AS sm_mean_mhz, sm_clock_mhz AS sm_max_mhz, "
    f"CASE WHEN ({_REASONS} & {REASON_GPU_IDLE}) = 0 THEN sm_clock_mhz END "
    "AS sm_active_max_mhz, NULL AS sm_limit_mhz, mem_util_pct AS mem_util_mean, "
    "CASE WHEN clock_event_reasons IS NULL THEN 0 ELSE 1 END AS reasons_n, "
    f"{_REASONS} AS reasons_any, "
    f"CASE WHEN ({_REASONS} & {REASON_SW_POWER_CAP}) != 0 AND util_pct >= {BUSY_UTIL_PCT} "
    "THEN 1 ELSE 0 END AS capped_n, sm_clock_mhz AS capped_sm_mean_mhz, "
    f"CASE WHEN ({_REASONS} & {THERMAL_REASONS}) != 0 THEN 1 ELSE 0 END AS thermal_n, "
    "sm_clock_mhz AS thermal_sm_mean_mhz, 0 AS slow_n, NULL AS pcie_rx_max_bps, "
    "NULL AS pcie_tx_max_bps, NULL AS gpm_sm_util_mean, NULL AS gpm_sm_occupancy_mean, "
    "NULL AS gpm_tensor_util_mean, NULL AS gpm_dram_bw_util_mean, NULL AS boot_id "
    "FROM gpu_samples "
    f"UNION ALL SELECT {_SEC}, {_norm_uuid_sql('uuid')}, 0, NULL, NULL, NULL, 0, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, 0, 0, 0, NULL, 0, NULL, 1, pcie_rx_bps, pcie_tx_bps, gpm_sm_util_pct, "
    "gpm_sm_occupancy_pct, gpm_tensor_util_pct, gpm_dram_bw_util_pct, NULL "
    "FROM gpu_slow_samples"
)


SCHEMA_SQL = (
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    run_key TEXT UNIQUE NOT NULL,
    run_name TEXT NOT NULL,
    status TEXT NOT NULL,            -- running | finished | failed | lost
    host TEXT, pid INTEGER, pid_ns TEXT, rank INTEGER, local_rank INTEGER, world_size INTEGER,
    auto INTEGER,
    start_wall_ns INTEGER, start_mono_ns INTEGER,
    end_wall_ns INTEGER, end_mono_ns INTEGER,
    options TEXT,                    -- json
    cuda_uuid TEXT, gpu_model TEXT, gpu_count INTEGER, cpu_count INTEGER,
    dropped_events INTEGER DEFAULT 0,  -- dropped inside the training process
    received_events INTEGER DEFAULT 0,
    sent_events INTEGER,
    error TEXT,
    median_step_ms REAL,
    summary TEXT,                    -- json, set when the run ends
    trailing_eval_ns INTEGER DEFAULT 0,  -- evaluation after the last step
    mfu REAL,                        -- 0-1, set when the run ends; NULL: unknown
    achieved_tflops REAL,            -- TFLOP/s per GPU, set when the run ends
    boot_id TEXT,                    -- the boot (gpuprofd.core.boot): *_mono_ns restart per boot
    group_id TEXT,                   -- torchrun's run id or profile(group=); NULL: its own group
    local_world_size INTEGER,        -- ranks on this node (LOCAL_WORLD_SIZE)
    clock_offset_ns INTEGER,         -- this rank's monotonic clock minus the reference rank's:
                                     -- t - offset is t on that clock; NULL: not measured
    clock_uncertainty_ns INTEGER,    -- the offset is good to +/- this
    clock_rtt_ns INTEGER, clock_round_trips INTEGER, clock_reference_rank INTEGER,
    store_dropped_events INTEGER DEFAULT 0,  -- received by gpuprofd but not stored (busy, lost db)
    daemon TEXT,                     -- the gpuprofd tracking it: "host:socket dir"; NULL: unknown
    run_uuid TEXT,                   -- schema 10: the run across nodes, made at hello (a UUID)
    node_id TEXT,                    -- team server: the node that forwarded it (ingest_nodes)
    user_name TEXT,                  -- schema 14: who trained (the login name); NULL: unknown
    project TEXT,                    -- schema 16: the project it counts to; NULL: none
    tags TEXT,                       -- schema 16: json {key: value}; NULL: none
    shim_seq INTEGER DEFAULT 0       -- schema 17: the highest shim message stored (its seq)
);
CREATE INDEX IF NOT EXISTS runs_project ON runs (project);
CREATE INDEX IF NOT EXISTS runs_name ON runs (run_name, id);
CREATE UNIQUE INDEX IF NOT EXISTS runs_uuid ON runs (run_uuid);
CREATE INDEX IF NOT EXISTS runs_group ON runs (group_id, rank);
CREATE TABLE IF NOT EXISTS steps (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL,
    t0_ns INTEGER, t1_ns INTEGER, wait_ns INTEGER,
    explicit INTEGER, micro INTEGER,
    phases TEXT,                     -- json: phase name -> ns
    skipped INTEGER DEFAULT 0,       -- 1: the optimizer update was skipped (inf/NaN)
    eval_ns INTEGER DEFAULT 0,       -- evaluation in the gap before the step
    optimizers TEXT,                 -- json: [{name, updates, skipped, ns}] or NULL
    mem_allocated_bytes INTEGER,     -- torch's allocator at the step's end; NULL: not
                                     -- reported (no CUDA; or one read per burst of steps)
    mem_reserved_bytes INTEGER,
    mem_peak_bytes INTEGER,          -- torch.cuda.max_memory_allocated so far
    traced INTEGER DEFAULT 0         -- 1: a profiler snapshot ran in this step (not timed)
);
CREATE INDEX IF NOT EXISTS steps_run_t0 ON steps (run_id, t0_ns);
CREATE INDEX IF NOT EXISTS steps_run_step ON steps (run_id, step);  -- schema 7: a group's
                                 -- last steps and a run's latest step found by index
CREATE TABLE IF NOT EXISTS step_packs (  -- schema 22: a block of a run's older steps, packed
    -- (gpuprofd.storage.upkeep.steppack; read by gpuprofd.storage.reads.steprows)
    run_id INTEGER NOT NULL,
    block INTEGER NOT NULL,          -- step / STEP_PACK: the indices it covers
    n INTEGER NOT NULL,              -- steps rows in it
    first_step INTEGER, last_step INTEGER,  -- the lowest and highest index in it
    t0_min_ns INTEGER, t0_max_ns INTEGER,   -- its steps' earliest and latest t0
    t1_max_ns INTEGER,               -- its steps' latest t1
    data BLOB NOT NULL,              -- the rows, columnar, zlib (gpuprofd.storage.stepcodec)
    PRIMARY KEY (run_id, block)
);
CREATE TABLE IF NOT EXISTS host_packs (  -- schema 24: a block of a boot's older host samples,
    -- packed (gpuprofd.storage.upkeep.samplepack; read by gpuprofd.storage.reads.samplerows)
    boot_key TEXT NOT NULL,          -- COALESCE(host_samples.boot_id, ''), as gpus.boot_id
    block INTEGER NOT NULL,          -- mono_ns / SAMPLE_PACK_NS: the span it covers
    n INTEGER NOT NULL,              -- host_samples rows in it
    t_min_ns INTEGER, t_max_ns INTEGER,  -- its earliest and latest mono_ns
    data BLOB NOT NULL,              -- the rows, columnar, zlib (gpuprofd.storage.samplecodec)
    PRIMARY KEY (boot_key, block)
);
CREATE TABLE IF NOT EXISTS run_cpu_packs (  -- schema 24: ... and of a run's CPU samples
    run_id INTEGER NOT NULL,
    block INTEGER NOT NULL,
    n INTEGER NOT NULL,
    t_min_ns INTEGER, t_max_ns INTEGER,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, block)
);
CREATE TABLE IF NOT EXISTS insights (
    run_id INTEGER NOT NULL, rule TEXT, severity TEXT, title TEXT, detail TEXT,
    fix TEXT, evidence TEXT, created_wall_ns INTEGER
);
CREATE INDEX IF NOT EXISTS insights_run ON insights (run_id);
CREATE TABLE IF NOT EXISTS group_insights (  -- schema 7: a group's findings once it ended
    group_id TEXT NOT NULL,          -- runs.group_id
    ranks INTEGER,                   -- ranks the group rules compared
    rule TEXT, severity TEXT, title TEXT, detail TEXT, fix TEXT,
    evidence TEXT,                   -- json (keys by rank are strings)
    created_wall_ns INTEGER
);
CREATE INDEX IF NOT EXISTS group_insights_group ON group_insights (group_id);
CREATE TABLE IF NOT EXISTS group_checks (  -- schema 21: an ended group whose rules ran
    group_id TEXT PRIMARY KEY,       -- runs.group_id; its findings (maybe none) are in
    ranks INTEGER,                   -- group_insights, read instead of computed again
    found INTEGER,                   -- how many findings the rules stored
    checked_wall_ns INTEGER
);
CREATE TABLE IF NOT EXISTS host_samples (
    mono_ns INTEGER, cpu_pct REAL, cpu_count INTEGER, disk_read_bps REAL,
    disk_read_iops REAL,             -- read operations/s
    page_cache_bytes INTEGER, mem_total_bytes INTEGER,
    swap_in_bps REAL,                -- NULL in any of these: not offered by the platform
    boot_id TEXT
);
CREATE INDEX IF NOT EXISTS host_samples_t ON host_samples (mono_ns);
CREATE TABLE IF NOT EXISTS run_cpu_samples (run_id INTEGER, mono_ns INTEGER, cores REAL);
CREATE INDEX IF NOT EXISTS run_cpu_samples_run ON run_cpu_samples (run_id, mono_ns);
CREATE TABLE IF NOT EXISTS gpu_samples (
    mono_ns INTEGER, gpu_index INTEGER, uuid TEXT, util_pct REAL,
    mem_used_bytes INTEGER, mem_total_bytes INTEGER, power_mw INTEGER,
    temp_c INTEGER, sm_clock_mhz INTEGER,
    mem_util_pct REAL,
    clock_event_reasons INTEGER       -- NVML clock-event reason bitmask
);
CREATE TABLE IF NOT EXISTS gpu_slow_samples (  -- the <= 1 Hz loop; NULL: not available
    mono_ns INTEGER, uuid TEXT, energy_mj INTEGER, energy_power_mw REAL,
    pcie_rx_bps REAL, pcie_tx_bps REAL,
    gpm_sm_util_pct REAL, gpm_sm_occupancy_pct REAL, gpm_tensor_util_pct REAL,
    gpm_dram_bw_util_pct REAL, power_capped_pct REAL, thermal_capped_pct REAL
);
CREATE TABLE IF NOT EXISTS gpus (  -- schema 23: each GPU of each boot with rollups
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL,              -- normalized (sampling.nvml.normalize_uuid)
    boot_id TEXT NOT NULL,           -- the boot (gpuprofd.core.boot); '': unknown
    sm_limit_mhz REAL,               -- the GPU's max SM clock (NVML), MHz
    UNIQUE (uuid, boot_id)
);
CREATE TABLE IF NOT EXISTS gpu_seconds (  -- schema 23: one row per GPU per second, the
    -- whole run; read through the gpu_rollups view (its GPU's uuid and boot_id joined in)
    gpu INTEGER NOT NULL,            -- gpus.id
    sec_ns INTEGER NOT NULL,         -- the second's start, monotonic ns of the GPU's boot
    n INTEGER,                       -- n: fast samples with a utilization reading
    -- *_total: a reading summed over the n samples (the view's *_mean = total / n;
    -- n 0: the mean itself): NVML's readings are integers, and so their totals;
    -- NULL where the reading's min and max are equal (the mean is the min)
    util_min REAL, util_total REAL, util_max REAL, idle_n INTEGER,
    mem_used_min INTEGER, mem_used_total REAL, mem_used_max INTEGER, mem_total_bytes INTEGER,
    power_min_mw REAL, power_total_mw REAL, power_max_mw REAL,
    temp_min_c REAL, temp_total_c REAL, temp_max_c REAL,
    sm_min_mhz REAL, sm_total_mhz REAL, sm_max_mhz REAL, sm_active_max_mhz REAL,
    mem_util_total REAL,
    reasons_n INTEGER, reasons_any INTEGER,
    capped_n INTEGER, capped_sm_mean_mhz REAL, thermal_n INTEGER, thermal_sm_mean_mhz REAL,
    slow_n INTEGER,                  -- slow-loop samples folded in (<= 1 Hz)
    pcie_rx_max_bps REAL, pcie_tx_max_bps REAL,
    gpm_sm_util_mean REAL, gpm_sm_occupancy_mean REAL, gpm_tensor_util_mean REAL,
    gpm_dram_bw_util_mean REAL,
    PRIMARY KEY (gpu, sec_ns)        -- the rows themselves, in key order: no second index
) WITHOUT ROWID;
-- gpu_rollups: gpu_seconds with each GPU's uuid and boot_id (boot_key: the boot, '' for
-- none: what readers match it by), the means divided back (rollup.VIEW_COLUMNS_SQL)
CREATE VIEW IF NOT EXISTS gpu_rollups AS SELECT """
    + rollup.VIEW_COLUMNS_SQL
    + """
    FROM gpu_seconds s JOIN gpus g ON g.id = s.gpu;
CREATE TABLE IF NOT EXISTS worker_cpu (  -- DataLoader workers' CPU, one row per worker process
    run_id INTEGER NOT NULL, loader_seq INTEGER, worker_id INTEGER, pid INTEGER,
    first_mono_ns INTEGER, last_mono_ns INTEGER,
    cpu_s REAL,                      -- user + system CPU seconds since the worker started
    ctx_voluntary INTEGER,           -- context switches since it started: slept or blocked
    ctx_involuntary INTEGER,         -- ... preempted while it wanted the CPU (NULL: unknown)
    PRIMARY KEY (run_id, pid, loader_seq)
);
CREATE INDEX IF NOT EXISTS gpu_slow_samples_t ON gpu_slow_samples (mono_ns);
CREATE INDEX IF NOT EXISTS gpu_samples_t ON gpu_samples (mono_ns);
CREATE TABLE IF NOT EXISTS kernel_windows (  -- one per kernels event (gpuprof.kernels)
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, t0_ns INTEGER, t1_ns INTEGER,
    source TEXT,                     -- snapshot | continuous | nsys
    steps TEXT,                      -- json: the step indices the window covered
    rows_dropped INTEGER DEFAULT 0
);
CREATE INDEX IF NOT EXISTS kernel_windows_run ON kernel_windows (run_id, t0_ns);
CREATE TABLE IF NOT EXISTS kernel_stats (
    window_id INTEGER NOT NULL, run_id INTEGER NOT NULL,
    name TEXT, kind TEXT, cls TEXT,  -- kind: kernel | op; cls: compute | comm | memcpy | ...
    count INTEGER, total_ns INTEGER, self_ns INTEGER, flops REAL
);
CREATE INDEX IF NOT EXISTS kernel_stats_run ON kernel_stats (run_id, window_id);
CREATE TABLE IF NOT EXISTS stack_samples (  -- schema 19: sampled Python stacks (the shim's
    -- gpuprof_shim.stacks), counts added up per frame and step; bounded per run by the shim
    run_id INTEGER NOT NULL,
    source TEXT NOT NULL,            -- main: the training thread between its phases;
                                     -- loader: the DataLoader worker processes
    step INTEGER NOT NULL,           -- the step whose loader wait the sample fell in
    path TEXT NOT NULL, line INTEGER NOT NULL, func TEXT NOT NULL,  -- the user's frame
    callee TEXT NOT NULL,            -- the library call it was in ('': none)
    samples INTEGER NOT NULL,        -- ~10 ms each
    PRIMARY KEY (run_id, source, step, path, line, func, callee)
);
CREATE TABLE IF NOT EXISTS comm_steps (  -- schema 23: one step's DDP gradient buckets
    -- (each bucket's all-reduce), packed; pruned to each run's last COMM_STEPS_KEPT steps +
    -- every COMM_KEEP_EVERY-th (module doc); read through gpuprofd.storage.commpack
    run_id INTEGER NOT NULL, step INTEGER NOT NULL,  -- step: the steps row's step index
    start_ns INTEGER NOT NULL,       -- its first bucket's launch, the rank's monotonic ns
                                     -- (0: none timed); tells apart reused step indices
    buckets INTEGER NOT NULL,        -- the bucket rows it holds
    bytes INTEGER NOT NULL,          -- their flattened gradients, summed
    packed BLOB NOT NULL,            -- (bucket, start_ns, end_ns, bytes) per bucket: DDP's
                                     -- GradBucket.index(), launched / completed (ns), bytes
    PRIMARY KEY (run_id, step, start_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS drops (reason TEXT PRIMARY KEY, count INTEGER);
CREATE TABLE IF NOT EXISTS step_rollups (  -- schema 9: one row per block of a run's steps
    -- (by index: block = step / STEP_BLOCK, gpuprofd.storage.upkeep.steprollup), the whole run
    run_id INTEGER NOT NULL, block INTEGER NOT NULL,
    first_step INTEGER, last_step INTEGER, t0_ns INTEGER, t1_ns INTEGER,  -- first t0, last t1
    n INTEGER,                       -- steps in the block
    iter_min_ns INTEGER, iter_max_ns INTEGER, iter_sum_ns REAL,  -- iteration: wait + step
    loader_wait_sum_ns REAL, forward_sum_ns REAL, backward_sum_ns REAL, comm_sum_ns REAL,
    optimizer_sum_ns REAL, other_sum_ns REAL,  -- phase sums (ns), stacking to iter_sum_ns
    eval_n INTEGER, skipped_n INTEGER,  -- steps with evaluation before / a skipped update
    mem_alloc_max INTEGER, mem_reserved_max INTEGER,  -- torch's allocator, bytes; NULL: none
    PRIMARY KEY (run_id, block)
);
CREATE INDEX IF NOT EXISTS step_rollups_run_t0 ON step_rollups (run_id, t0_ns);
CREATE TABLE IF NOT EXISTS ingest_nodes (  -- schema 10, team server: each forwarding node
    node_id TEXT PRIMARY KEY,        -- made once by the node, stored in its database
    last_seq INTEGER NOT NULL,       -- the highest event sequence applied (0: none yet)
    host TEXT,                       -- the node's host name, as it last said
    first_wall_ns INTEGER, last_wall_ns INTEGER,  -- its first and latest batch, wall ns
    batches INTEGER DEFAULT 0,       -- batches received (resent ones included)
    events INTEGER DEFAULT 0         -- events applied
);
CREATE TABLE IF NOT EXISTS login_limits (  -- schema 10: viewer logins per client address
    client TEXT PRIMARY KEY,
    attempts TEXT NOT NULL,          -- json: wall ns of the attempts within the last window
    last_wall_ns INTEGER             -- the latest attempt (retention deletes old clients)
);
CREATE TABLE IF NOT EXISTS server_secrets (  -- schema 10: made once, shared by replicas
    name TEXT PRIMARY KEY, value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS run_costs (  -- schema 16: a run's GPU-hours, made when it ends
    -- (and again when a forward changes it) for the rollups (gpuprofd.storage.reads.rollups)
    run_id INTEGER NOT NULL,
    at_wall_ns INTEGER NOT NULL,     -- when it counts: its end (else its start), wall ns
    run_name TEXT, user_name TEXT, project TEXT,
    node TEXT,                       -- the node it came from (node_id, else host)
    gpu_hours REAL NOT NULL,         -- wall time x GPUs
    usd REAL,                        -- at the cost line's rate; NULL: not priced
    lost_gpu_hours REAL NOT NULL,    -- fixing every finding (the fix-all budget, each part once)
    lost_usd REAL,
    PRIMARY KEY (run_id)
);
CREATE INDEX IF NOT EXISTS run_costs_at ON run_costs (at_wall_ns);
CREATE TABLE IF NOT EXISTS run_cost_findings (  -- schema 16: run_costs' lost time by finding;
    -- a run's rows sum to its lost_gpu_hours (gains scaled down where findings share time)
    run_id INTEGER NOT NULL,
    rule TEXT NOT NULL,
    at_wall_ns INTEGER NOT NULL,     -- run_costs.at_wall_ns
    lost_gpu_hours REAL NOT NULL,
    lost_usd REAL,
    fix TEXT,                        -- what the run's finding said to do
    PRIMARY KEY (run_id, rule)
);
CREATE INDEX IF NOT EXISTS run_cost_findings_at ON run_cost_findings (at_wall_ns);
CREATE TABLE IF NOT EXISTS digests (  -- schema 16: the team server's digests sent, one a
    -- period: the replica that inserts the row sends it (gpuprofd.services.digest)
    period_end_ns INTEGER NOT NULL,  -- the period's end, wall ns (a multiple of every_s)
    every_s INTEGER NOT NULL,        -- its length, seconds
    claimed_wall_ns INTEGER,
    PRIMARY KEY (period_end_ns, every_s)
);
CREATE TABLE IF NOT EXISTS step_totals (  -- schema 15: per block of a run's steps (as
    -- step_rollups), the aggregates gpuprofctl runs shows (gpuprofd.storage.reads.steptotals)
    run_id INTEGER NOT NULL, block INTEGER NOT NULL,
    steps INTEGER,                   -- every step of the block
    skipped_updates REAL, eval_ns REAL,  -- over every step
    counted_steps INTEGER,           -- the steps the sums below cover: not traced, not the
                                     -- run's first (by t0)
    wait_ns REAL, step_ns REAL, micro REAL, forward_ns REAL, backward_ns REAL,
    optimizer_ns REAL, data_ns REAL, comm_ns REAL,
    comm_steps REAL,                 -- counted steps that carry a comm phase
    mem_peak_bytes INTEGER, mem_reserved_max_bytes INTEGER,  -- torch's maxima; NULL: none
    micro_max INTEGER,               -- the most micro-batches a step had
    PRIMARY KEY (run_id, block)
);
CREATE TABLE IF NOT EXISTS host_rollups (  -- schema 15: one row per run per block of the
    -- node's host samples with the run's own CPU (storage.upkeep.hostrollup), the whole run
    run_id INTEGER NOT NULL,
    block INTEGER NOT NULL,          -- mono_ns / HOST_BLOCK_NS (10 s) on the run's boot's clock
    t0_ns INTEGER, t1_ns INTEGER,    -- its first and last sample's mono_ns
    n INTEGER,                       -- host samples in it
    cpu_count INTEGER,               -- the most logical CPUs a sample counted
    -- per reading (the run's cores, the other cores busy, disk read bytes/s, page cache
    -- bytes): minimum, maximum, sum and count of the samples that had it (mean = sum / n)
    run_cores_min REAL, run_cores_max REAL, run_cores_sum REAL, run_cores_n INTEGER,
    other_cores_min REAL, other_cores_max REAL, other_cores_sum REAL, other_cores_n INTEGER,
    disk_read_bps_min REAL, disk_read_bps_max REAL, disk_read_bps_sum REAL,
    disk_read_bps_n INTEGER,
    page_cache_bytes_min INTEGER, page_cache_bytes_max INTEGER, page_cache_bytes_sum REAL,
    page_cache_bytes_n INTEGER,
    PRIMARY KEY (run_id, block)
);
CREATE TABLE IF NOT EXISTS outbox (  -- schema 12, a forwarding node: events not yet
    -- acknowledged by the team server (gpuprofd.storage.writes.outbox); seq is the node's sequence
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,              -- a batch event kind (gpuprofd.storage.writes.batch.KINDS)
    run_id INTEGER,                  -- runs.id for the kinds about a run
    priority INTEGER NOT NULL,       -- what a full outbox gives up first: 0 (raw) .. 4 (run, end)
    body TEXT,                       -- json: the event's rows/fields; NULL: read from runs at send
    n_rows INTEGER NOT NULL,         -- rows in body (batches are bounded in rows)
    bytes INTEGER NOT NULL,          -- length of body (the outbox is bounded in bytes)
    wall_ns INTEGER NOT NULL         -- when it was stored
);
CREATE INDEX IF NOT EXISTS outbox_priority ON outbox (priority, seq);
CREATE TABLE IF NOT EXISTS outbox_dead (  -- schema 12: events the team server refused for good
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, run_id INTEGER, priority INTEGER,
    body TEXT, n_rows INTEGER, bytes INTEGER, wall_ns INTEGER,
    status INTEGER,                  -- the server's HTTP status (400, 409, 413, ...)
    reason TEXT,                     -- the server's answer
    dead_wall_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS forward_given_up (  -- schema 12: events a full outbox dropped
    run_id INTEGER NOT NULL,         -- 0: the node's own (host samples, GPU rollups)
    kind TEXT NOT NULL, events INTEGER NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, kind)
);
CREATE TABLE IF NOT EXISTS viewer_sessions (  -- schema 13: a viewer's login, shared by
    -- replicas: a session cookie is valid while its row is here and unexpired (logout deletes it)
    sid_digest TEXT PRIMARY KEY,     -- SHA-256 (hex) of the session id the cookie carries
    created_wall_ns INTEGER NOT NULL,
    expires_wall_ns INTEGER NOT NULL,  -- the login's end (--session-hours after it)
    client TEXT                      -- the address it logged in from
);
CREATE INDEX IF NOT EXISTS viewer_sessions_expires ON viewer_sessions (expires_wall_ns);
CREATE TABLE IF NOT EXISTS evidence_windows (  -- schema 20: a profiler window gpuprofd asked
    -- the shim for to explain a finding (gpuprof.evidence); its rows are kernel_stats'
    run_id INTEGER NOT NULL,
    window_id INTEGER,               -- kernel_windows.id (source 'evidence'); NULL: not stored
    request_id TEXT NOT NULL,        -- the request's id (one window per request)
    rule TEXT NOT NULL,              -- the rule whose finding it explains
    time_kind TEXT,                  -- device | cpu: what its rows' times are
    t0_ns INTEGER, t1_ns INTEGER,    -- the window, the run's monotonic ns
    first_step INTEGER, last_step INTEGER,  -- the steps it covered
    PRIMARY KEY (run_id, request_id)
);
"""
)

#: The ``step_rollups`` table for a read-only connection to a database older
#: than schema 9 (empty: readers then use the steps themselves).
_STEP_ROLLUPS_TEMP = (
    "CREATE TEMP TABLE step_rollups (run_id INTEGER, block INTEGER, first_step INTEGER, "
    "last_step INTEGER, t0_ns INTEGER, t1_ns INTEGER, n INTEGER, iter_min_ns INTEGER, "
    "iter_max_ns INTEGER, iter_sum_ns REAL, loader_wait_sum_ns REAL, forward_sum_ns REAL, "
    "backward_sum_ns REAL, comm_sum_ns REAL, optimizer_sum_ns REAL, other_sum_ns REAL, "
    "eval_n INTEGER, skipped_n INTEGER, mem_alloc_max INTEGER, mem_reserved_max INTEGER)"
)


#: ... and the ``host_rollups`` table for one older than schema 15 (empty: the
#: host series then reads the samples themselves).
_HOST_ROLLUPS_TEMP = (
    "CREATE TEMP TABLE host_rollups (run_id INTEGER, block INTEGER, t0_ns INTEGER, "
    "t1_ns INTEGER, n INTEGER, cpu_count INTEGER, "
    + ", ".join(
        f"{m}_min REAL, {m}_max REAL, {m}_sum REAL, {m}_n INTEGER"
        for m in ("run_cores", "other_cores", "disk_read_bps", "page_cache_bytes")
    )
    + ")"
)


#: ... and the ``step_totals`` table for one older than schema 15 (empty: a
#: run's figures then come from its steps).
_STEP_TOTALS_TEMP = (
    "CREATE TEMP TABLE step_totals (run_id INTEGER, block INTEGER, steps INTEGER, "
    "skipped_updates REAL, eval_ns REAL, counted_steps INTEGER, wait_ns REAL, step_ns REAL, "
    "micro REAL, forward_ns REAL, backward_ns REAL, optimizer_ns REAL, data_ns REAL, "
    "comm_ns REAL, comm_steps REAL, mem_peak_bytes INTEGER, mem_reserved_max_bytes INTEGER, "
    "micro_max INTEGER)"
)


#: ... and the ``stack_samples`` table for one older than schema 19 (empty).
_STACK_SAMPLES_TEMP = (
    "CREATE TEMP TABLE stack_samples (run_id INTEGER, source TEXT, step INTEGER, path TEXT, "
    "line INTEGER, func TEXT, callee TEXT, samples INTEGER)"
)
#: ... and the ``group_checks`` table for one older than schema 21 (empty: a
#: group's findings are then computed when read).
_GROUP_CHECKS_TEMP = (
    "CREATE TEMP TABLE group_checks (group_id TEXT, ranks INTEGER, found INTEGER, "
    "checked_wall_ns INTEGER)"
)
#: ... and the ``step_packs`` table for one older than schema 22 (empty: every
#: step is then a ``steps`` row).
_STEP_PACKS_TEMP = (
    "CREATE TEMP TABLE step_packs (run_id INTEGER, block INTEGER, n INTEGER, "
    "first_step INTEGER, last_step INTEGER, t0_min_ns INTEGER, t0_max_ns INTEGER, "
    "t1_max_ns INTEGER, data BLOB)"
)
#: ... and the ``host_packs`` and ``run_cpu_packs`` tables for one older than
#: schema 24 (empty: every sample is then a row).
_SAMPLE_PACKS_TEMP = (
    "CREATE TEMP TABLE host_packs (boot_key TEXT, block INTEGER, n INTEGER, t_min_ns INTEGER, "
    "t_max_ns INTEGER, data BLOB)",
    "CREATE TEMP TABLE run_cpu_packs (run_id INTEGER, block INTEGER, n INTEGER, "
    "t_min_ns INTEGER, t_max_ns INTEGER, data BLOB)",
)
#: ... and the ``evidence_windows`` table for one older than schema 20 (empty).
_EVIDENCE_WINDOWS_TEMP = (
    "CREATE TEMP TABLE evidence_windows (run_id INTEGER, window_id INTEGER, "
    "request_id TEXT, rule TEXT, time_kind TEXT, t0_ns INTEGER, t1_ns INTEGER, "
    "first_step INTEGER, last_step INTEGER)"
)


#: ... and the ``run_costs`` / ``run_cost_findings`` tables for one older than
#: schema 16 (empty: its rollups are then empty).
_RUN_COSTS_TEMP = (
    "CREATE TEMP TABLE run_costs (run_id INTEGER, at_wall_ns INTEGER, run_name TEXT, "
    "user_name TEXT, project TEXT, node TEXT, gpu_hours REAL, usd REAL, "
    "lost_gpu_hours REAL, lost_usd REAL)"
)
_RUN_COST_FINDINGS_TEMP = (
    "CREATE TEMP TABLE run_cost_findings (run_id INTEGER, rule TEXT, at_wall_ns INTEGER, "
    "lost_gpu_hours REAL, lost_usd REAL, fix TEXT)"
)


def check_connection(conn: sqlite3.Connection, path: Path) -> int:
    """Check that *conn* is a gpuprof database this code can read.

    Returns:
        Its schema version, or 0 for an empty database (no tables yet).

    Raises:
        DatabaseError: not SQLite, corrupt, another program's, or too new.
    """
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return 0
        if "meta" not in tables or "runs" not in tables:
            raise DatabaseError(f"{path} is an SQLite database but not a gpuprof one")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"{path} is not a usable SQLite database ({exc})") from None
    return check_meta(meta, str(path), "an SQLite database")


def check_meta(meta: dict[str, str], where: str, what: str = "a database") -> int:
    """The schema version in a database's ``meta`` rows.

    Raises:
        DatabaseError: not gpuprof's, unreadable, or newer than this code's
            (both versions named).
    """
    if meta.get("app") != APP_NAME:
        raise DatabaseError(f"{where} is {what} but not a gpuprof one")
    try:
        version = int(meta.get("schema_version", ""))
    except ValueError:
        raise DatabaseError(f"{where} has an unreadable gpuprof schema version") from None
    if version > SCHEMA_VERSION:
        raise DatabaseError(
            f"{where} was written by a newer gpuprof (schema {version} > {SCHEMA_VERSION}): "
            "upgrade gpuprof to read it"
        )
    return version


def meta_rows() -> list[tuple[str, str]]:
    """The ``meta`` rows of a database at :data:`SCHEMA_VERSION`."""
    return [("app", APP_NAME), ("schema_version", str(SCHEMA_VERSION))]


def added_since(version: int) -> tuple[tuple[str, str, str], ...]:
    """The columns added after schema *version*: (table, column, SQLite declaration)."""
    return tuple(col for since, cols in _ADDED if version < since for col in cols)


def shadow_old_tables(conn: sqlite3.Connection, version: int) -> None:
    """Let a read-only connection to an older database answer today's
    queries: TEMP views (searched before ``main``) add the missing columns
    with their defaults. Nothing is written to the file."""
    runs6 = ", ".join(f"NULL AS {c}" for c in _RUNS_6) + _RUNS_8
    if version < 24:
        for sql in _SAMPLE_PACKS_TEMP:
            conn.execute(sql)
    if version < 22:
        conn.execute(_STEP_PACKS_TEMP)
    if version < 21:
        conn.execute(_GROUP_CHECKS_TEMP)
    if version < 20:
        conn.execute(_EVIDENCE_WINDOWS_TEMP)
    if version < 19:
        conn.execute(_STACK_SAMPLES_TEMP)
    if version < 16:
        conn.execute(_RUN_COSTS_TEMP)
        conn.execute(_RUN_COST_FINDINGS_TEMP)
    if version < 15:
        conn.execute(_HOST_ROLLUPS_TEMP)
        conn.execute(_STEP_TOTALS_TEMP)
    if version < 9:
        conn.execute(_STEP_ROLLUPS_TEMP)
    if version < 7:
        conn.execute(
            "CREATE TEMP TABLE group_insights (group_id TEXT, ranks INTEGER, rule TEXT, "
            "severity TEXT, title TEXT, detail TEXT, fix TEXT, evidence TEXT, "
            "created_wall_ns INTEGER)"
        )
    if version == 16:
        conn.execute(f"CREATE TEMP VIEW runs AS SELECT *{_RUNS_17} FROM main.runs")
    if 14 <= version < 16:
        conn.execute(f"CREATE TEMP VIEW runs AS SELECT *{_RUNS_16} FROM main.runs")
    if 10 <= version < 14:
        conn.execute(f"CREATE TEMP VIEW runs AS SELECT *{_RUNS_14} FROM main.runs")
    if version in (8, 9):
        conn.execute(f"CREATE TEMP VIEW runs AS SELECT *{_RUNS_10} FROM main.runs")
    if version in (6, 7):
        conn.execute(f"CREATE TEMP VIEW runs AS SELECT *{_RUNS_8} FROM main.runs")
    if version == 5:
        conn.execute(f"CREATE TEMP VIEW runs AS SELECT *, {runs6} FROM main.runs")
    if version < 5:
        v2 = ", 0 AS skipped, 0 AS eval_ns, NULL AS optimizers" if version < 2 else ""
        v4 = (
            ", NULL AS mem_allocated_bytes, NULL AS mem_reserved_bytes, NULL AS mem_peak_bytes"
            if version < 4
            else ""
        )
        v2r = ", 0 AS trailing_eval_ns" if version < 2 else ""
        conn.execute(f"CREATE TEMP VIEW steps AS SELECT *{v2}{v4}, 0 AS traced FROM main.steps")
        conn.execute(
            f"CREATE TEMP VIEW runs AS SELECT *{v2r}, NULL AS mfu, NULL AS achieved_tflops, "
            f"NULL AS boot_id, NULL AS group_id, NULL AS local_world_size, {runs6} FROM main.runs"
        )
        v3 = (
            ", NULL AS disk_read_iops, NULL AS page_cache_bytes, NULL AS mem_total_bytes, "
            "NULL AS swap_in_bps"
            if version < 3
            else ""
        )
        conn.execute(
            f"CREATE TEMP VIEW host_samples AS SELECT *{v3}, NULL AS boot_id FROM main.host_samples"
        )
        if version == 4:
            conn.execute(
                "CREATE TEMP VIEW gpu_rollups AS SELECT *, NULL AS boot_id, '' AS boot_key, "
                f"{rollup.TOTALS_OF_MEANS} FROM main.gpu_rollups"
            )
        conn.execute(
            "CREATE TEMP TABLE kernel_windows (id INTEGER PRIMARY KEY, run_id INTEGER, "
            "t0_ns INTEGER, t1_ns INTEGER, source TEXT, steps TEXT, rows_dropped INTEGER)"
        )
        conn.execute(
            "CREATE TEMP TABLE kernel_stats (window_id INTEGER, run_id INTEGER, name TEXT, "
            "kind TEXT, cls TEXT, count INTEGER, total_ns INTEGER, self_ns INTEGER, flops REAL)"
        )
    if 4 <= version < 11:
        conn.execute(
            f"CREATE TEMP VIEW worker_cpu AS SELECT *{_WORKER_CPU_11} FROM main.worker_cpu"
        )
    if version < 4:
        conn.execute(
            "CREATE TEMP TABLE worker_cpu (run_id INTEGER, loader_seq INTEGER, "
            "worker_id INTEGER, pid INTEGER, first_mono_ns INTEGER, last_mono_ns INTEGER, "
            "cpu_s REAL, ctx_voluntary INTEGER, ctx_involuntary INTEGER)"
        )
        conn.execute(
            "CREATE TEMP VIEW gpu_rollups AS SELECT *, COALESCE(boot_id, '') AS boot_key, "
            f"{rollup.TOTALS_OF_MEANS} FROM ({_RAW_AS_ROLLUPS_SQL})"
        )
    if version < 3:
        conn.execute(
            "CREATE TEMP VIEW gpu_samples AS SELECT *, NULL AS mem_util_pct, "
            "NULL AS clock_event_reasons FROM main.gpu_samples"
        )
        conn.execute(
            "CREATE TEMP TABLE gpu_slow_samples (mono_ns INTEGER, uuid TEXT, energy_mj INTEGER,"
            " energy_power_mw REAL, pcie_rx_bps REAL, pcie_tx_bps REAL, gpm_sm_util_pct REAL,"
            " gpm_sm_occupancy_pct REAL, gpm_tensor_util_pct REAL, gpm_dram_bw_util_pct REAL,"
            " power_capped_pct REAL, thermal_capped_pct REAL)"
        )
    if version < 23:
        _shadow_narrow(conn, version)


#: The GPU key of a ``gpu_rollups`` row of a database older than schema 23.
_OLD_GPU_KEY = "COALESCE(uuid, '') || char(31) || COALESCE(boot_id, '')"
#: A step's ``comm_buckets`` rows as its ``comm_steps`` row (older than schema 23).
_PACKED_COMM_SQL = (
    "SELECT run_id, step, COALESCE(MIN(start_ns), 0) AS start_ns, COUNT(*) AS buckets, "
    "COALESCE(SUM(bytes), 0) AS bytes, gpuprof_pack_buckets(bucket, start_ns, end_ns, bytes) "
    "AS packed FROM comm_buckets GROUP BY run_id, step"
)


class _PackBuckets:
    """SQLite aggregate: a step's bucket rows as :func:`commpack.pack` packs them."""

    def __init__(self) -> None:
        self.rows: list[tuple[int | None, ...]] = []

    def step(self, *row: int | None) -> None:
        self.rows.append(row)

    def finalize(self) -> bytes:
        return commpack.pack(self.rows)


def _shadow_narrow(conn: sqlite3.Connection, version: int) -> None:
    """Schema 23's ``gpus``, ``gpu_seconds`` and ``comm_steps`` as TEMP views
    of an older database's ``gpu_rollups`` and ``comm_buckets`` (read-only)."""
    conn.create_aggregate("gpuprof_pack_buckets", 4, _PackBuckets)  # type: ignore[arg-type]
    if version >= 5:  # older: a TEMP view with its boot_key already
        conn.execute(
            "CREATE TEMP VIEW gpu_rollups AS SELECT *, COALESCE(boot_id, '') AS boot_key, "
            f"{rollup.TOTALS_OF_MEANS} FROM main.gpu_rollups"
        )
    conn.execute(
        f"CREATE TEMP VIEW gpus AS SELECT DISTINCT {_OLD_GPU_KEY} AS id, COALESCE(uuid, '') "
        "AS uuid, COALESCE(boot_id, '') AS boot_id FROM gpu_rollups"
    )
    conn.execute(
        f"CREATE TEMP VIEW gpu_seconds AS SELECT {_OLD_GPU_KEY} AS gpu, * FROM gpu_rollups"
    )
    if version >= 6:  # older: comm_buckets is an empty TEMP table (below)
        conn.execute(f"CREATE TEMP VIEW comm_steps AS {_PACKED_COMM_SQL}")
    else:
        conn.execute(
            "CREATE TEMP TABLE comm_steps (run_id INTEGER, step INTEGER, start_ns INTEGER, "
            "buckets INTEGER, bytes INTEGER, packed BLOB)"
        )


def _set_aside(conn: sqlite3.Connection) -> None:
    """Before schema 23's tables are made: an older ``gpu_rollups`` table
    renamed (its name is now the view's), for :func:`_narrow` to copy."""
    kind = conn.execute("SELECT type FROM sqlite_master WHERE name = 'gpu_rollups'").fetchone()
    if kind is not None and kind[0] == "table":
        conn.execute("ALTER TABLE gpu_rollups RENAME TO gpu_rollups_21")


def _narrow(conn: sqlite3.Connection) -> None:
    """Schema 23: an older database's GPU rollups into ``gpus`` and
    ``gpu_seconds`` (a GPU's rows of one second merged), its bucket rows
    packed into ``comm_steps``; the old tables dropped. In the caller's
    transaction: a crash leaves the old tables, copied again at the next start."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "gpu_rollups_21" in tables:
        for sql in rollup.copy_sql("SELECT * FROM gpu_rollups_21"):
            conn.execute(sql)
        conn.execute("DROP TABLE gpu_rollups_21")
    if "comm_buckets" in tables:
        conn.create_aggregate("gpuprof_pack_buckets", 4, _PackBuckets)  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO comm_steps {_PACKED_COMM_SQL}")
        conn.execute("DROP TABLE comm_buckets")


def _upgrade(conn: sqlite3.Connection, version: int) -> None:
    """Add what later schema versions added (in one transaction with the
    version bump, so a crash leaves the old version and columns)."""
    added = added_since(version)
    tables = {t for t, _, _ in added}
    have = {(t, r[1]) for t in tables for r in conn.execute(f"PRAGMA table_info({t})")}
    existing = {t for t, _ in have}  # a table added later is created whole by SCHEMA_SQL
    for table, column, decl in added:
        if table in existing and (table, column) not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def prepare(path: Path, *, verify: bool = True) -> None:
    """Check the database at *path* and create the schema if it is new.

    With *verify*, a file that holds pages is first checked whole
    (:mod:`gpuprofd.storage.filecheck`) on a read-only connection, so nothing
    is written to a damaged one.

    Runs synchronously at startup (before the event loop serves anyone).

    Raises:
        DatabaseError: the file is not SQLite, is damaged, or is not ours.
    """
    if path.is_dir():
        raise DatabaseError(f"{path} is a directory, not a database file")
    if verify and path.is_file() and path.stat().st_size:
        _verify(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = textcells.connect(path)
    except (OSError, sqlite3.Error) as exc:
        raise DatabaseError(f"cannot open database {path} ({exc})") from None
    try:
        version = check_connection(conn, path)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            if version:
                _upgrade(conn, version)
            if 0 < version < 23:
                _set_aside(conn)
            conn.executescript(SCHEMA_SQL)
            if 0 < version < 4:
                for sql in rollup.copy_sql(_RAW_AS_ROLLUPS_SQL):
                    conn.execute(sql)
            if 0 < version < 23:
                _narrow(conn)
            if version < SCHEMA_VERSION:
                conn.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    meta_rows(),
                )
            conn.commit()
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"cannot initialise database {path} ({exc})") from None
    finally:
        conn.close()


def _verify(path: Path) -> None:
    """Check that the file at *path* is ours and whole, reading only (a
    read-only connection never checkpoints a ``-wal`` into the file).

    Raises:
        DatabaseError: not SQLite, not ours, too new, or damaged.
    """
    try:
        conn = textcells.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open database {path} ({exc})") from None
    try:
        if check_connection(conn, path):
            filecheck.quick_check(conn, path)
    finally:
        conn.close()
