"""The daemon's writes about runs, steps, samples and insights, over a
:class:`Store` (its writer queue). Every read is in
:mod:`gpuprofd.storage.reads`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gpuprof.insights import Insight
from gpuprof.insights.gains import to_stored_evidence
from gpuprofd.sampling import rollup
from gpuprofd.storage import commpack
from gpuprofd.storage.dialect import Dialect
from gpuprofd.storage.writes import outbox
from gpuprofd.storage.writes.ops import Op, Part
from gpuprofd.storage.writes.store import Store

_STEP_SQL = (
    "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases, "
    "skipped, eval_ns, optimizers, mem_allocated_bytes, mem_reserved_bytes, mem_peak_bytes, "
    "traced) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_CLOCK_SQL = (
    "UPDATE runs SET clock_offset_ns = ?, clock_uncertainty_ns = ?, clock_rtt_ns = ?, "
    "clock_round_trips = ?, clock_reference_rank = ? WHERE id = ?"
)
_KERNEL_WINDOW_SQL = (
    "INSERT INTO kernel_windows (run_id, t0_ns, t1_ns, source, steps, rows_dropped) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
#: A stats row finds its window by (run, t0, t1, source), the window's own
#: insert just before it in the same writer queue: no commit is awaited for
#: the window's id. If that insert failed, the lookup gives NULL and the
#: NOT NULL ``window_id`` drops the row too (no row lands on another window).
_KERNEL_STAT_SQL = (
    "INSERT INTO kernel_stats (window_id, run_id, name, kind, cls, count, total_ns, self_ns, "
    "flops) VALUES ((SELECT id FROM kernel_windows WHERE run_id = ?1 AND t0_ns = ?2 "
    "AND t1_ns = ?3 AND source = ?4 ORDER BY id DESC LIMIT 1), ?1, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
)
#: An evidence window's link (gpuprof.evidence), its window found as a stats row finds it.
_EVIDENCE_WINDOW_SQL = (
    "INSERT INTO evidence_windows (run_id, window_id, request_id, rule, time_kind, t0_ns, "
    "t1_ns, first_step, last_step) VALUES (?1, (SELECT id FROM kernel_windows WHERE "
    "run_id = ?1 AND t0_ns = ?2 AND t1_ns = ?3 AND source = 'evidence' ORDER BY id DESC "
    "LIMIT 1), ?4, ?5, ?6, ?2, ?3, ?7, ?8) ON CONFLICT (run_id, request_id) DO NOTHING"
)
_HOST_SQL = (
    "INSERT INTO host_samples (mono_ns, cpu_pct, cpu_count, disk_read_bps, disk_read_iops, "
    "page_cache_bytes, mem_total_bytes, swap_in_bps, boot_id) VALUES (?,?,?,?,?,?,?,?,?)"
)
_RUN_CPU_SQL = "INSERT INTO run_cpu_samples (run_id, mono_ns, cores) VALUES (?,?,?)"
#: One row per worker process, rewritten as its cumulative CPU grows.
_WORKER_CPU_SQL = (
    "INSERT INTO worker_cpu (run_id, loader_seq, worker_id, pid, first_mono_ns, last_mono_ns, "
    "cpu_s, ctx_voluntary, ctx_involuntary) VALUES (?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (run_id, pid, loader_seq) DO UPDATE SET "
    "last_mono_ns = excluded.last_mono_ns, cpu_s = excluded.cpu_s, "
    "ctx_voluntary = excluded.ctx_voluntary, ctx_involuntary = excluded.ctx_involuntary"
)
#: One row per (run, source, step, frame); a later event's samples add to it.
_STACKS_SQL = (
    "INSERT INTO stack_samples (run_id, source, step, path, line, func, callee, samples) "
    "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (run_id, source, step, path, line, func, callee) "
    "DO UPDATE SET samples = stack_samples.samples + excluded.samples"
)
_GPU_SQL = (
    "INSERT INTO gpu_samples (mono_ns, gpu_index, uuid, util_pct, mem_used_bytes, "
    "mem_total_bytes, power_mw, temp_c, sm_clock_mhz, mem_util_pct, clock_event_reasons) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_GPU_SLOW_SQL = (
    "INSERT INTO gpu_slow_samples (mono_ns, uuid, energy_mj, energy_power_mw, pcie_rx_bps, "
    "pcie_tx_bps, gpm_sm_util_pct, gpm_sm_occupancy_pct, gpm_tensor_util_pct, "
    "gpm_dram_bw_util_pct, power_capped_pct, thermal_capped_pct) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
_RUN_COLUMNS = (
    "run_key",
    "run_name",
    "status",
    "host",
    "pid",
    "pid_ns",
    "rank",
    "local_rank",
    "world_size",
    "auto",
    "start_wall_ns",
    "start_mono_ns",
    "options",
    "cuda_uuid",
    "gpu_model",
    "gpu_count",
    "cpu_count",
    "boot_id",
    "group_id",
    "local_world_size",
    "daemon",
    "run_uuid",
    "user_name",
    "project",
    "tags",
)


def seq_op(run_id: int, seq: int, received: int) -> Op:
    """Record that the shim's message *seq* of run *run_id* is stored, with
    the run's *received* events so far: queued after the message's events, so
    it commits with them or after them (a restart resumes from it exactly)."""
    return Op(
        "UPDATE runs SET shim_seq = ?, received_events = ? WHERE id = ?",
        (seq, received, run_id),
    )


def step_op(run_id: int, msg: Mapping[str, Any]) -> Op:
    """The insert of one validated ``step`` message; its optional ``mem``
    (torch allocator ``[allocated, reserved, peak]`` bytes) fills the three
    ``mem_*_bytes`` columns, NULL when the step did not carry it; its
    optional ``traced`` (a profiler snapshot ran in it) sets ``traced``.

    A step with ``comm`` rows (:mod:`gpuprof.comm`, at most
    ``MAX_BUCKETS_PER_STEP``, checked by ``decode``) is one atomic op: the
    step row and its ``comm_steps`` row (its buckets packed) commit together or not at all
    (one queue item: dropped and counted as one under back-pressure)."""
    mem = msg.get("mem") or (None, None, None)
    params = (
        run_id,
        msg["i"],
        msg["t0"],
        msg["t1"],
        msg["wait"],
        int(msg["explicit"]),
        msg["micro"],
        orjson.dumps(msg["phases"]).decode(),
        int(msg.get("skipped", False)),
        msg.get("eval", 0),
        orjson.dumps(msg["optimizers"]).decode() if msg.get("optimizers") else None,
        *mem,
        int(msg.get("traced", False)),
    )
    comm = msg.get("comm")
    if not comm:
        return Op(
            _STEP_SQL, params, drop_reason="store_error", run_id=run_id, forward=(outbox.STEPS,)
        )
    packed = commpack.step_row(run_id, msg["i"], comm)
    return Op(
        "-- step with comm buckets",
        parts=(Part(_STEP_SQL, (params,)), Part(commpack.INSERT_SQL, (packed,))),
        drop_reason="store_error",
        run_id=run_id,
        forward=(outbox.STEPS, outbox.COMM),
    )


def clock_op(run_id: int, msg: Mapping[str, Any]) -> Op:
    """The run's clock offset from one validated ``clock`` event
    (:class:`gpuprof.comm.ClockOffset`); a later event replaces an earlier one."""
    params = (
        msg["offset_ns"],
        msg["uncertainty_ns"],
        msg["rtt_ns"],
        msg["round_trips"],
        msg["reference_rank"],
        run_id,
    )
    return Op(_CLOCK_SQL, params, drop_reason="store_error", run_id=run_id, forward=(outbox.RUN,))


def kernels_ops(run_id: int, msg: Mapping[str, Any]) -> list[Op]:
    """The inserts of one validated ``kernels`` message (see
    :mod:`gpuprof.kernels`): its ``kernel_windows`` row (``t0``/``t1``
    monotonic ns, ``source``, ``steps`` as JSON, ``rows_dropped``), then one
    ``kernel_stats`` row per wire row (ns, counts, FLOP as sent). Queue them
    together and in order (:meth:`Store.submit_all_nowait`)."""
    t0, t1, source = msg["t0"], msg["t1"], msg["source"]
    window = Op(
        _KERNEL_WINDOW_SQL,
        (run_id, t0, t1, source, orjson.dumps(msg["steps"]).decode(), msg.get("rows_dropped", 0)),
        forward=(outbox.kernels(run_id, msg),),
    )
    ops = [window] + [Op(_KERNEL_STAT_SQL, (run_id, t0, t1, source, *row)) for row in msg["rows"]]
    if source == "evidence" and isinstance(msg.get("evidence"), Mapping):
        ops.append(evidence_window_op(run_id, msg))
    return ops


def evidence_window_op(run_id: int, msg: Mapping[str, Any]) -> Op:
    """The ``evidence_windows`` row of a validated ``kernels`` event of
    source ``evidence``: its request and rule, its times' kind, its span
    (monotonic ns) and steps; after its window's insert. A request stored
    once (a resent message) is not stored again."""
    tag, steps = msg["evidence"], msg.get("steps") or []
    params = (
        run_id,
        msg["t0"],
        msg["t1"],
        tag["id"],
        tag["rule"],
        tag.get("time", "device"),
        min(steps) if steps else None,
        max(steps) if steps else None,
    )
    return Op(_EVIDENCE_WINDOW_SQL, params, run_id=run_id)


def kernel_window_ops(run_id: int, window: Mapping[str, Any], rows: Sequence[Any]) -> list[Op]:
    """:func:`kernels_ops` for a window dict (``t0``, ``t1``, ``source``,
    ``steps``, optional ``rows_dropped``) and :class:`gpuprof.kernels.KernelAgg` rows."""
    msg = {**window, "rows": [r.to_wire() for r in rows]}
    return kernels_ops(run_id, msg)


def host_sample_op(
    mono_ns: int,
    cpu_pct: float,
    cpu_count: int,
    disk_read_bps: float | None,
    disk_read_iops: float | None = None,
    page_cache_bytes: int | None = None,
    mem_total_bytes: int | None = None,
    swap_in_bps: float | None = None,
    boot_id: str | None = None,
) -> Op:
    """One host sample: CPU % (all cores), disk read bytes/s and IOPS, page
    cache and total RAM in bytes, swap-in bytes/s (None: not available), and
    the boot it was taken in (:mod:`gpuprofd.core.boot`)."""
    params = (
        mono_ns,
        cpu_pct,
        cpu_count,
        disk_read_bps,
        disk_read_iops,
        page_cache_bytes,
        mem_total_bytes,
        swap_in_bps,
        boot_id,
    )
    return Op(_HOST_SQL, params, forward=(outbox.HOST,))


def stacks_ops(run_id: int, msg: Mapping[str, Any]) -> list[Op]:
    """The upserts of one validated ``stacks`` message: each row's samples
    added to its (run, source, step, frame) row. A resent message is never
    applied twice (the shim's numbered messages are stored once)."""
    source, whole = msg["source"], (outbox.stacks(run_id, msg),)
    return [
        # forwarded whole with the first row's write
        Op(
            _STACKS_SQL,
            (run_id, source, step, path, line, func, callee, count),
            forward=() if k else whole,
        )
        for k, (path, line, func, callee, step, count) in enumerate(msg["rows"])
    ]


def run_cpu_op(run_id: int, mono_ns: int, cores: float) -> Op:
    """One sample of a run's process-tree CPU use, in cores."""
    return Op(_RUN_CPU_SQL, (run_id, mono_ns, cores), forward=(outbox.RUN_CPU,))


def worker_cpu_op(r: Any) -> Op:
    """The upsert of one :class:`gpuprofd.sampling.host_sampler.WorkerCpuReading`: a
    DataLoader worker's CPU seconds so far (cumulative, so a dropped write is
    made good by the next)."""
    params = (
        r.run_id,
        r.loader_seq,
        r.worker_id,
        r.pid,
        r.first_mono_ns,
        r.last_mono_ns,
        r.cpu_s,
        r.ctx_voluntary,
        r.ctx_involuntary,
    )
    return Op(_WORKER_CPU_SQL, params, forward=(outbox.WORKER_CPU,))


def gpu_sample_op(mono_ns: int, s: Any) -> Op:
    """The insert of one :class:`gpuprofd.sampling.nvml.GpuSample` taken at *mono_ns*."""
    params = (
        mono_ns,
        s.index,
        s.uuid,
        s.util_pct,
        s.mem_used_bytes,
        s.mem_total_bytes,
        s.power_mw,
        s.temp_c,
        s.sm_clock_mhz,
        s.mem_util_pct,
        s.clock_event_reasons,
    )
    return Op(_GPU_SQL, params)


def gpu_slow_sample_op(mono_ns: int, s: Any) -> Op:
    """The insert of one :class:`gpuprofd.sampling.nvml.GpuSlowSample` taken at *mono_ns*."""
    params = (
        mono_ns,
        s.uuid,
        s.energy_mj,
        s.energy_power_mw,
        s.pcie_rx_bytes_per_s,
        s.pcie_tx_bytes_per_s,
        s.gpm_sm_util_pct,
        s.gpm_sm_occupancy_pct,
        s.gpm_tensor_util_pct,
        s.gpm_dram_bw_util_pct,
        s.power_capped_pct,
        s.thermal_capped_pct,
    )
    return Op(_GPU_SLOW_SQL, params)


@functools.cache
def model_dtype_sql(d: Dialect) -> str:
    """The dtype the shim saw, into ``runs.options`` unless the user declared
    one. Params: dtype, dtype_source, run id."""
    text = "CAST(? AS TEXT)"
    merged = d.json_merge("options", {"dtype": text, "dtype_source": text})
    return (
        f"UPDATE runs SET options = {merged} WHERE id = ? "
        f"AND {d.json_text('options', 'dtype')} IS NULL"
    )


@functools.cache
def model_flops_sql(d: Dialect) -> str:
    """The FLOP the shim counted: kept as ``flops_counted`` (and ``flops_step``),
    and made ``flops_per_step`` (``flops_source`` "counter") unless the user
    declared FLOPs or an arch. Params: flops_counted, flops_step, run id
    (numbers as NUMERIC: an integer stays one in the JSON on both engines)."""
    declared = d.json_num("options", "flops_per_step")
    merged = d.json_merge(
        "options",
        {
            "flops_counted": "CAST(?1 AS NUMERIC)",
            "flops_step": "CAST(?2 AS NUMERIC)",
            "flops_source": f"CASE WHEN {declared} IS NULL THEN 'counter' "
            f"ELSE COALESCE({d.json_text('options', 'flops_source')}, 'user') END",
            "flops_per_step": f"COALESCE({declared}, CAST(?1 AS NUMERIC))",
        },
    )
    return f"UPDATE runs SET options = {merged} WHERE id = ?3"


def model_info_ops(run_id: int, msg: Mapping[str, Any], dialect: Dialect) -> list[Op]:
    """The updates of ``runs.options`` for one validated ``model_info``
    event: what the user declared in ``hello`` always wins. *dialect*: the
    store's (``store.dialect``)."""
    ops = []
    if "dtype" in msg:
        params = (msg["dtype"], msg.get("dtype_source"), run_id)
        ops.append(Op(model_dtype_sql(dialect), params, run_id=run_id, forward=(outbox.RUN,)))
    if "flops_counted" in msg:
        params = (msg["flops_counted"], msg.get("flops_step"), run_id)
        ops.append(Op(model_flops_sql(dialect), params, run_id=run_id, forward=(outbox.RUN,)))
    return ops


def loaders_op(run_id: int, msg: Mapping[str, Any], dialect: Dialect) -> Op:
    """The update of ``runs.options["loaders"]`` for one validated ``loaders``
    event (the shim sends the whole list each time: it replaces the last)."""
    merged = dialect.json_merge("options", {"loaders": dialect.json_param()})
    params = (orjson.dumps(msg["loaders"]).decode(), run_id)
    sql = f"UPDATE runs SET options = {merged} WHERE id = ?"
    return Op(sql, params, drop_reason="store_error", run_id=run_id, forward=(outbox.RUN,))


async def insert_run(store: Store, row: Mapping[str, Any]) -> int:
    """Create a run row (``status`` running); return its id."""
    values = [row.get(c) for c in _RUN_COLUMNS]
    values[_RUN_COLUMNS.index("options")] = orjson.dumps(row.get("options") or {}).decode()
    marks = ", ".join("?" * len(values))
    sql = f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({marks}) RETURNING id"
    run_id = await store.write(sql, values, forward=(outbox.RUN,))
    assert run_id is not None
    return run_id


async def update_run(store: Store, run_id: int, *, ended: bool = False, **fields: Any) -> None:
    """Set columns of one run and wait for the commit. *ended*: this is the
    run's last write (its insights and summary are stored): a forwarding
    node sends its ``end`` event with it."""
    if not fields:
        return
    sets = ", ".join(f"{k} = ?" for k in fields)
    forward = (outbox.END,) if ended else (outbox.RUN,)
    sql = f"UPDATE runs SET {sets} WHERE id = ?"
    await store.write(sql, (*fields.values(), run_id), forward=forward, run_id=run_id)


def rollup_op(row: Sequence[Any]) -> Op:
    """The insert of one per-second GPU rollup row (in
    :data:`gpuprofd.sampling.rollup.ROLLUP_COLUMNS` order)."""
    return Op(
        "-- gpu rollup",
        parts=(
            Part(rollup.GPU_SQL, rollup.gpu_rows((row,))),
            Part(rollup.INSERT_SQL, (rollup.insert_params(row),)),
        ),
        forward=(outbox.ROLLUP,),
    )


def prune_raw_gpu_ops(cutoff_mono_ns: int) -> list[Op]:
    """Deletes of raw GPU rows (fast and slow loop) taken before *cutoff_mono_ns*;
    the per-second rollups keep the whole run."""
    return [
        Op("DELETE FROM gpu_samples WHERE mono_ns < ?", (cutoff_mono_ns,)),
        Op("DELETE FROM gpu_slow_samples WHERE mono_ns < ?", (cutoff_mono_ns,)),
    ]


async def replace_insights(store: Store, run_id: int, insights: Sequence[Insight]) -> None:
    """Replace the run's stored insights with *insights*; wait for the commit."""
    now = time.time_ns()
    # a finding's gain rides in its evidence (gpuprof.insights.gains.to_stored_evidence)
    found = [
        {
            "rule": i.rule,
            "severity": i.severity,
            "title": i.title,
            "detail": i.detail,
            "fix": i.fix,
            "evidence": orjson.loads(orjson.dumps(to_stored_evidence(i.to_dict()), default=str)),
        }
        for i in insights
    ]
    forward = (outbox.insights(run_id, found),)
    await store.submit(Op("DELETE FROM insights WHERE run_id = ?", (run_id,), forward=forward))
    for ins in found:
        await store.submit(
            Op(
                "INSERT INTO insights (run_id, rule, severity, title, detail, fix, evidence, "
                "created_wall_ns) VALUES (?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    ins["rule"],
                    ins["severity"],
                    ins["title"],
                    ins["detail"],
                    ins["fix"],
                    orjson.dumps(ins["evidence"], default=str).decode(),
                    now,
                ),
            )
        )
    await store.flush()


_GROUP_INSIGHT_SQL = (
    "INSERT INTO group_insights (group_id, ranks, rule, severity, title, detail, fix, evidence, "
    "created_wall_ns) VALUES (?,?,?,?,?,?,?,?,?)"
)

_GROUP_CHECK_SQL = (
    "INSERT INTO group_checks (group_id, ranks, found, checked_wall_ns) VALUES (?,?,?,?) "
    "ON CONFLICT (group_id) DO UPDATE SET ranks = excluded.ranks, found = excluded.found, "
    "checked_wall_ns = excluded.checked_wall_ns"
)


async def replace_group_insights(
    store: Store, group: str, ranks: int, insights: Sequence[Mapping[str, Any]]
) -> None:
    """Replace the stored findings of *group* (ended) with *insights*
    (``Insight.to_dict()`` shapes) and mark it checked (``group_checks``: its
    findings, none included, are read from here instead of computed again),
    all or none in one transaction; wait for the commit."""
    now = time.time_ns()
    rows = [
        (
            group,
            ranks,
            i["rule"],
            i["severity"],
            i["title"],
            i.get("detail"),
            i.get("fix"),
            orjson.dumps(
                to_stored_evidence(i), option=orjson.OPT_NON_STR_KEYS, default=str
            ).decode(),
            now,
        )
        for i in insights
    ]
    parts = [Part("DELETE FROM group_insights WHERE group_id = ?", ((group,),))]
    if rows:
        parts.append(Part(_GROUP_INSIGHT_SQL, rows))
    parts.append(Part(_GROUP_CHECK_SQL, ((group, ranks, len(rows), now),)))
    await store.write_atomic(parts, "group insights")


async def add_drops(store: Store, delta: Mapping[str, int]) -> None:
    """Add *delta* to the persisted ``drops`` counters (queued, not awaited)."""
    for reason, n in delta.items():
        await store.submit(
            Op(
                "INSERT INTO drops (reason, count) VALUES (?, ?) "
                "ON CONFLICT(reason) DO UPDATE SET count = drops.count + excluded.count",
                (reason, n),
            )
        )
