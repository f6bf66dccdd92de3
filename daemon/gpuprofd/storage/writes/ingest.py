"""Applying an ingest batch (:mod:`gpuprofd.storage.writes.batch`) on a team server.

One batch is one transaction (:meth:`Store.transaction`): all of it or none.
It is idempotent, keyed by (node id, sequence number): the node's row in
``ingest_nodes`` holds the highest sequence applied, and is locked first
(an upsert), so two replicas given the same node's batches apply them one
after the other. Then:

- events at or below that sequence were applied before (a resent batch, an
  acknowledgement the node never got): skipped, counted in ``skipped``;
- the others are applied in order and the node's sequence moves to the
  batch's last. Gaps are fine (a node that gave up events under its outbox
  limit says so itself); events never go backwards within a batch
  (:func:`~gpuprofd.storage.writes.batch.validate` refuses that).

A step is its run, its index and its start (``step``, ``t0_ns``): a step
sent again under a new sequence number (stored before, or earlier in the
same batch) is dropped, the first kept; a step with a stored index but
another start (a manual loop numbering its steps again) is a step of its
own, stored as the node stored it. DDP buckets likewise, by (``step``,
``bucket``, ``start_ns``).

Runs are keyed by their UUID (``runs.run_uuid``); a run belongs to the node
that first sent it: an event of another node's run is refused
(:class:`IngestConflict`) and nothing of the batch is stored.

On Postgres the batch's transaction also ``NOTIFY``s :data:`NOTIFY_CHANNEL`
with the ids of the runs it touched (delivered only if it commits).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpuprofd.sampling.rollup import INSERT_SQL as _ROLLUP_SQL
from gpuprofd.sampling.rollup import ROLLUP_COLUMNS
from gpuprofd.storage.writes import costs
from gpuprofd.storage.writes.batch import (
    COMM_FIELDS,
    END_FIELDS,
    HOST_FIELDS,
    RUN_CPU_FIELDS,
    RUN_FIELDS,
    STEP_FIELDS,
    WORKER_CPU_FIELDS,
    BatchError,
)
from gpuprofd.storage.writes.ops import Txn
from gpuprofd.storage.writes.runsdb import (
    _COMM_SQL,
    _HOST_SQL,
    _RUN_CPU_SQL,
    _STACKS_SQL,
    _STEP_SQL,
    _WORKER_CPU_SQL,
)
from gpuprofd.storage.writes.store import Store

#: The Postgres channel a committed batch notifies with the ids of the runs it
#: touched (ids only: a listener re-reads what it needs), so every replica's
#: live pages hear of a run ingested through another.
NOTIFY_CHANNEL = "gpuprof_runs"
#: Postgres refuses payloads of 8,000 bytes or more.
NOTIFY_MAX_BYTES = 7900
#: The ``daemon`` column of a forwarded run: no node daemon ever recovers it
#: as its own (``gpuprofd.ingest.runservice``), even on a shared database.
OWNER_PREFIX = "ingest:"

_LOCK_NODE_SQL = (
    "INSERT INTO ingest_nodes (node_id, last_seq, host, first_wall_ns, last_wall_ns, batches, "
    "events) VALUES (?, 0, ?, ?, ?, 1, 0) ON CONFLICT (node_id) DO UPDATE SET "
    "batches = ingest_nodes.batches + 1, last_wall_ns = excluded.last_wall_ns, "
    "host = COALESCE(excluded.host, ingest_nodes.host)"
)
_NODE_SEQ_SQL = "SELECT last_seq FROM ingest_nodes WHERE node_id = ?"
_SET_SEQ_SQL = "UPDATE ingest_nodes SET last_seq = ?, events = events + ? WHERE node_id = ?"
_RUN_SET = tuple(f for f in RUN_FIELDS)
_INSERT_RUN_SQL = (
    f"INSERT INTO runs (run_uuid, run_key, node_id, daemon, {', '.join(_RUN_SET)}) "
    f"VALUES ({', '.join('?' * (4 + len(_RUN_SET)))}) RETURNING id"
)
_KERNEL_WINDOW_SQL = (
    "INSERT INTO kernel_windows (run_id, t0_ns, t1_ns, source, steps, rows_dropped) "
    "VALUES (?, ?, ?, ?, ?, ?) RETURNING id"
)
_KERNEL_STATS_SQL = (
    "INSERT INTO kernel_stats (window_id, run_id, name, kind, cls, count, total_ns, self_ns, "
    "flops) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DELETE_WINDOW_SQL = (
    "DELETE FROM kernel_windows WHERE run_id = ? AND t0_ns = ? AND t1_ns = ? AND source = ?"
)
_ORPHAN_STATS_SQL = (
    "DELETE FROM kernel_stats WHERE run_id = ? AND window_id NOT IN "
    "(SELECT id FROM kernel_windows WHERE run_id = ?)"
)
_EVIDENCE_SQL = (
    "INSERT INTO evidence_windows (run_id, window_id, request_id, rule, time_kind, t0_ns, "
    "t1_ns, first_step, last_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id, request_id) DO UPDATE SET window_id = excluded.window_id"
)
_INSIGHT_SQL = (
    "INSERT INTO insights (run_id, rule, severity, title, detail, fix, evidence, "
    "created_wall_ns) VALUES (?,?,?,?,?,?,?,?)"
)


class IngestConflict(Exception):
    """An event about a run another node sent first; nothing was stored."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


@dataclass
class Applied:
    """What one batch did: the node's highest sequence applied now
    (``acked_seq``: the node may forget everything up to it), how many of the
    batch's events were applied and how many skipped as sent before, the
    server's ids of the runs it touched and of those whose end it carried."""

    node: str
    acked_seq: int
    applied: int
    skipped: int
    run_ids: list[int] = field(default_factory=list)
    ended_run_ids: list[int] = field(default_factory=list)


async def apply_batch(store: Store, batch: Mapping[str, Any]) -> Applied:
    """Apply a validated batch (:func:`gpuprofd.storage.writes.batch.validate`) in one transaction.

    Raises:
        BatchError: an event that cannot be applied as sent (steps of a run
            never announced); nothing was stored.
        IngestConflict: an event about another node's run; nothing was stored.
        Exception: the database refused a statement (the store's errors); nothing was stored.
    """
    now = time.time_ns()
    return await store.transaction(lambda txn: _apply(txn, batch, now), "ingest batch")


async def _apply(txn: Txn, batch: Mapping[str, Any], now: int) -> Applied:
    node = batch["node"]
    await txn.execute(_LOCK_NODE_SQL, (node, batch.get("host"), now, now))
    rows = await txn.fetch(_NODE_SEQ_SQL, (node,))
    last = int(rows[0][0])
    events = [ev for ev in batch["events"] if ev["seq"] > last]
    out = Applied(node, last, 0, len(batch["events"]) - len(events))
    runs = await _known_runs(txn, {ev["run"] for ev in events if "run" in ev})
    rows: dict[str, list[tuple[Any, ...]]] = {}
    seen: Seen = {}
    for i, ev in enumerate(batch["events"]):
        if ev["seq"] <= last:
            continue
        await _event(txn, node, ev, f"events[{i}]", runs, out, rows, seen)
    for sql, values in rows.items():  # one bulk insert per table (COPY on Postgres)
        await txn.executemany(sql, values)
    if events:
        out.acked_seq = events[-1]["seq"]
        out.applied = len(events)
        await txn.execute(_SET_SEQ_SQL, (out.acked_seq, out.applied, node))
    out.run_ids = sorted(out_ids(runs, events))
    # a late end or a new summary changes what the rollups count of the run
    await costs.refresh(txn, out.run_ids)
    if out.run_ids and txn.dialect.name == "postgres":  # delivered when the batch commits
        for payload in notify_payloads(out.run_ids):
            await txn.fetch("SELECT pg_notify(?, ?)", (NOTIFY_CHANNEL, payload))
    return out


def notify_payloads(run_ids: Sequence[int]) -> list[str]:
    """*run_ids* as ``NOTIFY`` payloads: ids only, comma-separated, each
    under Postgres's 8,000-byte payload limit."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for run_id in run_ids:
        text = str(run_id)
        if current and size + len(text) + 1 > NOTIFY_MAX_BYTES:
            out.append(",".join(current))
            current, size = [], 0
        current.append(text)
        size += len(text) + 1
    if current:
        out.append(",".join(current))
    return out


#: Known runs of a batch: run UUID -> (the server's id, the node that sent it).
Runs = dict[str, tuple[int, str | None]]


async def _known_runs(txn: Txn, uuids: set[str]) -> Runs:
    """The batch's runs already stored, found in one query per 500."""
    out: Runs = {}
    listed = sorted(uuids)
    for first in range(0, len(listed), 500):
        part = listed[first : first + 500]
        marks = ", ".join("?" * len(part))
        sql = f"SELECT run_uuid, id, node_id FROM runs WHERE run_uuid IN ({marks})"
        for uuid, run_id, owner in await txn.fetch(sql, part):
            out[uuid] = (int(run_id), owner)
    return out


def out_ids(runs: Runs, events: Sequence[Mapping[str, Any]]) -> set[int]:
    """The server's ids of the runs *events* are about."""
    return {runs[ev["run"]][0] for ev in events if "run" in ev and ev["run"] in runs}


async def _run_id(txn: Txn, node: str, ev: Mapping[str, Any], where: str, runs: Runs) -> int:
    """The server's id of the event's run (announced by a ``run`` event, in
    this batch or an earlier one)."""
    uuid = ev["run"]
    if uuid not in runs:
        raise BatchError(f"{where}.run", f"no run {uuid} here: send its run event first")
    run_id, owner = runs[uuid]
    if owner != node:
        raise IngestConflict(f"{where}.run", f"run {uuid} was sent by another node")
    return run_id


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _flag(value: Any, default: int = 0) -> int:
    return default if value is None else int(value)


async def _upsert_run(txn: Txn, node: str, ev: Mapping[str, Any], where: str, runs: Runs) -> int:
    fields = dict(ev["fields"])
    fields["options"] = _json(fields["options"] or {})
    if fields["auto"] is not None:
        fields["auto"] = int(fields["auto"])
    uuid = ev["run"]
    if uuid not in runs:
        values = [uuid, uuid, node, OWNER_PREFIX + node, *(fields[f] for f in _RUN_SET)]
        got = await txn.fetch(_INSERT_RUN_SQL, values)
        runs[uuid] = (int(got[0][0]), node)
        return runs[uuid][0]
    run_id = await _run_id(txn, node, ev, where, runs)
    given = {k: v for k, v in fields.items() if v is not None}
    sets = ", ".join(f"{k} = ?" for k in given)
    await txn.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*given.values(), run_id))
    return run_id


async def _end_run(txn: Txn, node: str, ev: Mapping[str, Any], where: str, runs: Runs) -> int:
    run_id = await _run_id(txn, node, ev, where, runs)
    given = {k: v for k, v in ev["fields"].items() if v is not None and k in END_FIELDS}
    if "summary" in given:
        given["summary"] = _json(given["summary"])
    sets = ", ".join(f"{k} = ?" for k in given)
    await txn.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*given.values(), run_id))
    return run_id


def _step_row(run_id: int, r: Mapping[str, Any]) -> tuple[Any, ...]:
    """A steps row in :data:`gpuprofd.storage.writes.runsdb._STEP_SQL`'s order."""
    return (
        run_id,
        r["step"],
        r["t0_ns"],
        r["t1_ns"],
        r["wait_ns"] or 0,
        _flag(r["explicit"]),
        r["micro"] if r["micro"] is not None else 1,
        _json(r["phases"] or {}),
        _flag(r["skipped"]),
        r["eval_ns"] or 0,
        _json(r["optimizers"]) if r["optimizers"] else None,
        r["mem_allocated_bytes"],
        r["mem_reserved_bytes"],
        r["mem_peak_bytes"],
        _flag(r["traced"]),
    )


#: Rows of this batch already taken, by (table, run id): their keys (see the module doc).
Seen = dict[tuple[str, int], set[tuple[Any, ...]]]
#: Of a steps row and of a comm bucket: the columns that identify it, and the
#: one its query's range is also bounded by (so a resend is found in its
#: own stretch of the run, however often a manual loop reused the indices).
_STEP_KEY = ("step", "t0_ns")
_COMM_KEY = ("step", "bucket", "start_ns")
_STORED_SQL = {
    "steps": "SELECT step, t0_ns FROM steps WHERE run_id = ? AND step BETWEEN ? AND ? "
    "AND t0_ns BETWEEN ? AND ?",
    "comm_buckets": "SELECT step, bucket, start_ns FROM comm_buckets WHERE run_id = ? "
    "AND step BETWEEN ? AND ? AND COALESCE(start_ns, 0) BETWEEN ? AND ?",
}


async def _not_sent_before(
    txn: Txn,
    table: str,
    run_id: int,
    rows: Sequence[Mapping[str, Any]],
    key: Sequence[str],
    seen: Seen,
) -> list[Mapping[str, Any]]:
    """*rows* (of *table*, of run *run_id*) less those stored before or
    taken earlier in this batch, by *key*; the first of repeats within *rows*.
    A row whose key is incomplete (a bucket without its index or start)
    cannot be told from another: it is kept."""
    if not rows:
        return []
    taken = seen.setdefault((table, run_id), set())
    steps = [r["step"] for r in rows]
    times = [r[key[-1]] or 0 for r in rows]
    stored = await txn.fetch(
        _STORED_SQL[table], (run_id, min(steps), max(steps), min(times), max(times))
    )
    have = {tuple(r) for r in stored}
    out = []
    for r in rows:
        k = tuple(r[c] for c in key)
        if None not in k and (k in have or k in taken):
            continue
        taken.add(k)
        out.append(r)
    return out


def _in_order(run_id: int | None, rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> list:
    head = () if run_id is None else (run_id,)
    return [(*head, *(r[n] for n in names)) for r in rows]


async def _event(
    txn: Txn,
    node: str,
    ev: Mapping[str, Any],
    where: str,
    runs: Runs,
    out: Applied,
    rows: dict[str, list[tuple[Any, ...]]],
    seen: Seen,
) -> None:
    """Apply one event; rows that are only appended go into *rows* (by
    statement), inserted together after the batch's last event (steps and
    buckets sent before left out: *seen*)."""
    kind = ev["kind"]
    if kind == "run":
        await _upsert_run(txn, node, ev, where, runs)
        return
    if kind == "end":
        run_id = await _end_run(txn, node, ev, where, runs)
        if run_id not in out.ended_run_ids:
            out.ended_run_ids.append(run_id)
        return
    if kind == "host_samples":
        names = ("mono_ns", "cpu_pct", "cpu_count", "disk_read_bps", "disk_read_iops")
        names += ("page_cache_bytes", "mem_total_bytes", "swap_in_bps", "boot_id")
        assert set(names) == set(HOST_FIELDS)
        rows.setdefault(_HOST_SQL, []).extend(_in_order(None, ev["rows"], names))
        return
    if kind == "gpu_rollups":
        rows.setdefault(_ROLLUP_SQL, []).extend(_in_order(None, ev["rows"], ROLLUP_COLUMNS))
        return
    run_id = await _run_id(txn, node, ev, where, runs)
    if kind == "steps":
        assert len(STEP_FIELDS) == 14
        fresh = await _not_sent_before(txn, "steps", run_id, ev["rows"], _STEP_KEY, seen)
        rows.setdefault(_STEP_SQL, []).extend(_step_row(run_id, r) for r in fresh)
    elif kind == "comm":
        names = ("step", "bucket", "start_ns", "end_ns", "bytes")
        assert set(names) == set(COMM_FIELDS)
        fresh = await _not_sent_before(txn, "comm_buckets", run_id, ev["rows"], _COMM_KEY, seen)
        rows.setdefault(_COMM_SQL, []).extend(_in_order(run_id, fresh, names))
    elif kind == "run_cpu":
        names = ("mono_ns", "cores")
        assert set(names) == set(RUN_CPU_FIELDS)
        rows.setdefault(_RUN_CPU_SQL, []).extend(_in_order(run_id, ev["rows"], names))
    elif kind == "worker_cpu":
        names = ("loader_seq", "worker_id", "pid", "first_mono_ns", "last_mono_ns", "cpu_s")
        names += ("ctx_voluntary", "ctx_involuntary")
        assert set(names) == set(WORKER_CPU_FIELDS)
        for row in _in_order(run_id, ev["rows"], names):  # an upsert: one by one
            await txn.execute(_WORKER_CPU_SQL, row)
    elif kind == "kernels":
        await _kernels(txn, run_id, ev)
    elif kind == "stacks":  # counts add up: an upsert, one by one
        for path, line, func, callee, step, count in ev["rows"]:
            await txn.execute(
                _STACKS_SQL, (run_id, ev["source"], step, path, line, func, callee, count)
            )
    elif kind == "insights":
        await txn.execute("DELETE FROM insights WHERE run_id = ?", (run_id,))
        now = time.time_ns()
        await txn.executemany(
            _INSIGHT_SQL,
            [
                (
                    run_id,
                    i["rule"],
                    i["severity"],
                    i["title"],
                    i["detail"],
                    i["fix"],
                    _json(i["evidence"] or {}),
                    now,
                )
                for i in ev["insights"]
            ],
        )


async def _kernels(txn: Txn, run_id: int, ev: Mapping[str, Any]) -> None:
    """One kernel window and its rows; the windows it ``replaces`` (merged
    into it on the node) go first, their rows with them."""
    for w in ev["replaces"]:
        await txn.execute(_DELETE_WINDOW_SQL, (run_id, w["t0_ns"], w["t1_ns"], w["source"]))
    if ev["replaces"]:
        await txn.execute(_ORPHAN_STATS_SQL, (run_id, run_id))
    w = ev["window"]
    steps = _json(w["steps"] or [])
    got = await txn.fetch(
        _KERNEL_WINDOW_SQL,
        (run_id, w["t0_ns"], w["t1_ns"], w["source"], steps, w["rows_dropped"] or 0),
    )
    window_id = int(got[0][0])
    await txn.executemany(_KERNEL_STATS_SQL, [(window_id, run_id, *r) for r in ev["rows"]])
    tag = w.get("evidence")
    if tag is not None and w["source"] == "evidence":  # its link, by this database's window id
        listed = w["steps"] if isinstance(w["steps"], list) else []
        await txn.execute(
            _EVIDENCE_SQL,
            (
                run_id,
                window_id,
                tag["id"],
                tag["rule"],
                tag.get("time", "device"),
                w["t0_ns"],
                w["t1_ns"],
                min(listed) if listed else None,
                max(listed) if listed else None,
            ),
        )
