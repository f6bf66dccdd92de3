"""Applying an ingest batch (:mod:`gpuprofd.storage.writes.batch`) on a team server.

A batch is applied in one transaction (:meth:`Store.transaction`): all of
it or none. Batches that arrive together may share one
(:func:`apply_batches`, a team server's group commit): each is still all
or none, since a group that fails is applied again batch by batch. It is
idempotent, keyed by (node id, sequence number): the node's row in
``ingest_nodes`` holds the highest sequence applied, and is locked first
(one upsert for the group's nodes, in node id order), so two replicas
given the same node's batches apply them one after the other. Then:

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
own, stored as the node stored it. A comm event's DDP buckets are packed
one ``comm_steps`` row a step (``gpuprofd.storage.commpack``), kept likewise
by (``step``, its first bucket's ``start_ns``).

Runs are keyed by their UUID (``runs.run_uuid``); a run belongs to the node
that first sent it: an event of another node's run is refused
(:class:`IngestConflict`) and nothing of the batch is stored.

Rows that are only appended (steps, buckets, samples, rollups) are
inserted after the last event, one bulk insert per table for the whole
group: COPY on Postgres (:meth:`gpuprofd.storage.postgres.PostgresWriter.executemany`,
which takes the columns from the writer's own ``INSERT`` statements). GPU
rollups go after their GPUs' ``gpus`` rows, a second already stored merged.

On Postgres the transaction also ``NOTIFY``s :data:`NOTIFY_CHANNEL`
with the ids of the runs it touched (delivered only if it commits). Each
round trip of a group's transaction waits its turn on a busy replica's
event loop (behind the requests being read: ~10 ms each at a thousand
nodes), so on Postgres the statements are few: the group's last one sets
the nodes' sequences, inserts the host and run CPU samples (a few rows a
batch, from arrays) and notifies, and the stored steps and their packs
are read by one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpuprofd.core.errors import DatabaseError
from gpuprofd.sampling import rollup
from gpuprofd.sampling.rollup import ROLLUP_COLUMNS
from gpuprofd.storage import commpack, stepcodec
from gpuprofd.storage.writes import costs, pgbulk
from gpuprofd.storage.writes.batch import (
    COMM_FIELDS,
    END_FIELDS,
    HOST_FIELDS,
    RUN_CPU_FIELDS,
    RUN_FIELDS,
    STEP_FIELDS,
    WORKER_CPU_FIELDS,
    BatchError,
    Columns,
)
from gpuprofd.storage.writes.ops import Txn
from gpuprofd.storage.writes.runsdb import (
    _HOST_SQL,
    _RUN_CPU_SQL,
    _STACKS_SQL,
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

#: Lock (or make) the batch's nodes' rows and read their sequence numbers, in
#: one statement; ``{rows}`` is ``(?, 0, ?, ?, ?, ?, 0)`` once per node, in
#: node id order (every replica locks in that order: no deadlock).
_LOCK_NODES_SQL = (
    "INSERT INTO ingest_nodes (node_id, last_seq, host, first_wall_ns, last_wall_ns, batches, "
    "events) VALUES {rows} ON CONFLICT (node_id) DO UPDATE SET "
    "batches = ingest_nodes.batches + excluded.batches, last_wall_ns = excluded.last_wall_ns, "
    "host = COALESCE(excluded.host, ingest_nodes.host) RETURNING node_id, last_seq"
)
_LOCK_NODE_ROW = "(?, 0, ?, ?, ?, ?, 0)"
#: The same on Postgres for any number of nodes, as arrays in node id order
#: (``unnest`` keeps it): one statement text, prepared once, where a
#: ``VALUES`` list of each group's size is parsed and planned again.
_LOCK_NODES_PG_SQL = (
    "INSERT INTO ingest_nodes (node_id, last_seq, host, first_wall_ns, last_wall_ns, batches, "
    "events) SELECT u.node_id, 0, u.host, u.wall_ns, u.wall_ns, u.batches, 0 "
    "FROM unnest(?::text[], ?::text[], ?::bigint[], ?::bigint[]) "
    "AS u(node_id, host, wall_ns, batches) ON CONFLICT (node_id) DO UPDATE SET "
    "batches = ingest_nodes.batches + excluded.batches, last_wall_ns = excluded.last_wall_ns, "
    "host = COALESCE(excluded.host, ingest_nodes.host) RETURNING node_id, last_seq"
)
_SET_SEQ_SQL = "UPDATE ingest_nodes SET last_seq = ?, events = events + ? WHERE node_id = ?"
#: The same for many nodes at once (Postgres): one statement, not one per node.
_SET_SEQS_PG_SQL = (
    "UPDATE ingest_nodes AS n SET last_seq = u.seq, events = n.events + u.added "
    "FROM unnest(?::text[], ?::bigint[], ?::bigint[]) AS u(node_id, seq, added) "
    "WHERE n.node_id = u.node_id"
)
#: Nodes, runs or row ranges named in one statement at most (5 parameters
#: each: well under SQLite's 32,766 and Postgres's 65,535 bound parameters).
_CHUNK = 200
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


async def apply_batch(
    store: Store, batch: Mapping[str, Any], gpus: pgbulk.StoredGpus | None = None
) -> Applied:
    """Apply a validated batch (:func:`gpuprofd.storage.writes.batch.validate`) in one
    transaction; on Postgres, *gpus*: the GPUs known stored (a replica's, kept up).

    Raises:
        BatchError: an event that cannot be applied as sent (steps of a run
            never announced); nothing was stored.
        IngestConflict: an event about another node's run; nothing was stored.
        Exception: the database refused a statement (the store's errors); nothing was stored.
    """
    done = await _transaction(store, [batch], gpus, "ingest batch")
    return done[0]


async def _transaction(
    store: Store, batches: Sequence[Mapping[str, Any]], gpus: pgbulk.StoredGpus | None, label: str
) -> list[Applied]:
    """:func:`_apply` in a transaction of its own; *gpus* learns the GPUs it
    stored once it commits, and forgets all if it fails (the transaction is
    then made once more if the database refused a statement and GPUs were
    left out: one may be gone, in another database behind the same URL)."""
    now = time.time_ns()
    later = _Later(gpus)
    try:
        done = await store.transaction(lambda txn: _apply(txn, batches, now, later), label)
    except BaseException as exc:
        if gpus is None:
            raise
        gpus.forget()
        if later.gpus_left_out and isinstance(exc, store.errors) and not store.is_lost(exc):
            return await _transaction(store, batches, gpus, label)  # none left out now
        raise
    if gpus is not None:
        gpus.learn(later.gpus_upserted)
    return list(done)


async def apply_batches(
    store: Store, batches: Sequence[Mapping[str, Any]], gpus: pgbulk.StoredGpus | None = None
) -> list[Applied | Exception]:
    """Apply validated batches (several nodes', or one node's in the order
    sent) in one transaction; per batch, what :func:`apply_batch` gives it:
    its :class:`Applied`, or the exception that refused it.

    Each batch is still all or nothing: if the shared transaction fails,
    each batch is applied again in one of its own, so a bad batch is
    refused alone (with its own error) and the others are stored (a lost
    database is every batch's answer at once: none is tried again). The
    fixed costs of a transaction (its round trips, one bulk insert per
    table, one ``NOTIFY``) are paid once for all of them.

    Raises:
        Exception: only what is not a batch's fault (a cancelled caller).
    """
    if not batches:
        return []
    if len(batches) > 1:
        try:
            return list(await _transaction(store, batches, gpus, "ingest batches"))
        except DatabaseError as exc:  # no database: each would wait for it again
            return [exc] * len(batches)
        except Exception as exc:  # noqa: BLE001 - found and said per batch below
            if isinstance(exc, store.errors) and store.is_lost(exc):
                return [exc] * len(batches)
    out: list[Applied | Exception] = []
    for batch in batches:
        try:
            out.append(await apply_batch(store, batch, gpus))
        except Exception as exc:  # noqa: BLE001 - this batch's answer
            out.append(exc)
    return out


async def _lock_nodes(txn: Txn, batches: Sequence[Mapping[str, Any]], now: int) -> dict[str, int]:
    """Lock (or make) the rows of the batches' nodes, in node id order; each
    node's highest sequence applied before these batches."""
    per_node: dict[str, tuple[str | None, int]] = {}
    for b in batches:
        host, count = per_node.get(b["node"], (None, 0))
        per_node[b["node"]] = (b.get("host") or host, count + 1)
    nodes = sorted(per_node)
    last: dict[str, int] = {}
    if txn.dialect.name == "postgres":
        hosts = [per_node[n][0] for n in nodes]
        counts = [per_node[n][1] for n in nodes]
        got = await txn.fetch(_LOCK_NODES_PG_SQL, (nodes, hosts, [now] * len(nodes), counts))
        return {str(node): int(seq) for node, seq in got}
    for first in range(0, len(nodes), _CHUNK):
        part = nodes[first : first + _CHUNK]
        sql = _LOCK_NODES_SQL.format(rows=", ".join([_LOCK_NODE_ROW] * len(part)))
        params: list[Any] = []
        for node in part:
            host, count = per_node[node]
            params += (node, host, now, now, count)
        for node, seq in await txn.fetch(sql, params):
            last[str(node)] = int(seq)
    return last


async def _apply(
    txn: Txn, batches: Sequence[Mapping[str, Any]], now: int, later: _Later
) -> list[Applied]:
    last = await _lock_nodes(txn, batches, now)
    runs = await _known_runs(txn, {ev["run"] for b in batches for ev in b["events"] if "run" in ev})
    outs: list[Applied] = []
    for batch in batches:
        node = batch["node"]
        seq = last[node]
        events = [ev for ev in batch["events"] if ev["seq"] > seq]
        out = Applied(node, seq, 0, len(batch["events"]) - len(events))
        for i, ev in enumerate(batch["events"]):
            if ev["seq"] > seq:
                await _event(txn, node, ev, f"events[{i}]", runs, out, later)
        if events:
            out.acked_seq = last[node] = events[-1]["seq"]
            out.applied = len(events)
        out.run_ids = sorted(out_ids(runs, events))
        outs.append(out)
    await later.insert(txn)
    # only a run or end event changes what the rollups count of a run (its row)
    await costs.refresh(txn, sorted(later.run_rows_changed))
    touched = sorted({r for o in outs for r in o.run_ids})
    if txn.dialect.name == "postgres":  # the notification is delivered when the batch commits
        await _set_seqs_and_notify(txn, outs, notify_payloads(touched), later.tail)
    else:
        await _set_seqs(txn, outs)
    return outs


async def _set_seqs(txn: Txn, outs: Sequence[Applied]) -> None:
    """Each node's highest sequence applied now, and the events it added;
    on Postgres in one statement for the group's nodes."""
    per_node: dict[str, tuple[int, int]] = {}
    for o in outs:
        if o.applied:  # a node's later batch in the group has the higher sequence
            per_node[o.node] = (o.acked_seq, per_node.get(o.node, (0, 0))[1] + o.applied)
    if not per_node:
        return
    if txn.dialect.name == "postgres":
        nodes = sorted(per_node)
        seqs = [per_node[n][0] for n in nodes]
        added = [per_node[n][1] for n in nodes]
        await txn.execute(_SET_SEQS_PG_SQL, (nodes, seqs, added))
        return
    await txn.executemany(_SET_SEQ_SQL, [(seq, n, node) for node, (seq, n) in per_node.items()])


#: On Postgres, a group's last statement: the nodes' sequences
#: (:data:`_SET_SEQS_PG_SQL`), the rows of :data:`_TAIL_INSERTS` and the
#: ``NOTIFY`` of the runs touched (payloads as an array), all in one (``{tail}``:
#: a ``WITH`` part per insert that has rows): each round trip of a group's
#: transaction waits its turn on a busy replica's event loop, behind the
#: requests being read.
_LAST_PG_SQL = (
    f"WITH seqs AS ({_SET_SEQS_PG_SQL}){{tail}} "
    f"SELECT pg_notify('{NOTIFY_CHANNEL}', p) FROM unnest(?::text[]) AS p"
)
#: Plain inserts of a few rows a batch (a host sample, the runs' CPU
#: samples), made on Postgres in the group's last statement from arrays,
#: where a ``COPY`` costs two round trips more.
_TAIL_INSERTS = {sql: pgbulk.appended(sql) for sql in (_HOST_SQL, _RUN_CPU_SQL)}


async def _set_seqs_and_notify(
    txn: Txn,
    outs: Sequence[Applied],
    payloads: list[str],
    tail: Mapping[str, Sequence[tuple[Any, ...]]],
) -> None:
    """:func:`_set_seqs`, the *tail* rows (per statement of
    :data:`_TAIL_INSERTS`) and the ``NOTIFY`` of *payloads*, in one
    statement (Postgres)."""
    per_node: dict[str, tuple[int, int]] = {}
    for o in outs:
        if o.applied:  # a node's later batch in the group has the higher sequence
            per_node[o.node] = (o.acked_seq, per_node.get(o.node, (0, 0))[1] + o.applied)
    if not per_node and not payloads and not tail:
        return
    nodes = sorted(per_node)
    params: list[Any] = [nodes, [per_node[n][0] for n in nodes], [per_node[n][1] for n in nodes]]
    parts = ""
    for i, (sql, rows) in enumerate(tail.items()):
        insert, kinds = _TAIL_INSERTS[sql]
        parts += f", tail{i} AS ({insert})"
        params += pgbulk.arrays(rows, kinds)
    await txn.fetch(_LAST_PG_SQL.format(tail=parts), [*params, payloads])


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


#: On Postgres, the runs of any number of UUIDs in one statement: the ``IN``
#: lists of :data:`_CHUNK` parameters cost ~1 ms of planning per batch at a
#: thousand nodes (a group of 250 batches names 2,000 runs).
_KNOWN_RUNS_PG_SQL = "SELECT run_uuid, id, node_id FROM runs WHERE run_uuid = ANY(?::text[])"


async def _known_runs(txn: Txn, uuids: set[str]) -> Runs:
    """The batch's runs already stored: one query on Postgres, one per
    :data:`_CHUNK` on SQLite."""
    out: Runs = {}
    listed = sorted(uuids)
    if txn.dialect.name == "postgres":  # one statement, planned once, for any number
        for uuid, run_id, owner in await txn.fetch(_KNOWN_RUNS_PG_SQL, (listed,)):
            out[uuid] = (int(run_id), owner)
        return out
    for first in range(0, len(listed), _CHUNK):
        part = listed[first : first + _CHUNK]
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


#: Per column of a steps row (``run_id`` first, given apart), its values as
#: stored, built a column at a time (C loops, no Python step per row).
_STEP_VALUES: dict[str, Callable[[Columns], Sequence[Any]]] = {
    "step": lambda rows: rows.column("step"),
    "t0_ns": lambda rows: rows.column("t0_ns"),
    "t1_ns": lambda rows: rows.column("t1_ns"),
    "wait_ns": lambda rows: rows.column("wait_ns", 0),
    "explicit": lambda rows: _flags(rows, "explicit"),
    "micro": lambda rows: rows.column("micro", 1),
    "phases": lambda rows: _json_column(rows, "phases", "{}"),
    "skipped": lambda rows: _flags(rows, "skipped"),
    "eval_ns": lambda rows: rows.column("eval_ns", 0),
    "optimizers": lambda rows: _json_column(rows, "optimizers", None, keep_empty=False),
    "mem_allocated_bytes": lambda rows: rows.column("mem_allocated_bytes"),
    "mem_reserved_bytes": lambda rows: rows.column("mem_reserved_bytes"),
    "mem_peak_bytes": lambda rows: rows.column("mem_peak_bytes"),
    "traced": lambda rows: _flags(rows, "traced"),
}
_STEP_COLUMNS = ("run_id", *_STEP_VALUES)
#: Steps columns whose value as stored, when a row gives none (or 0, an empty
#: optimizer list), is the schema's own default: 0 (``skipped``, ``eval_ns``,
#: ``traced``) or NULL (the rest). A group's insert leaves out each of them
#: that no row of the group holds another value of, and the database fills
#: it in: a node's steps carry most of them empty as a rule (no skipped or
#: traced step, no evaluation, no optimizer list; no memory readings without
#: CUDA). Each column left out of ``COPY`` saves ~0.03 us of the replica's CPU
#: and ~0.01 us of Postgres's a row: the seven, ~15 us of the replica's a
#: second of an 8-GPU node (80 steps; ``docs/benchmarks.md``).
_STEP_FALSY_DEFAULT = ("skipped", "eval_ns", "optimizers", "traced")
_STEP_NULL_DEFAULT = ("mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes")


def _step_columns(parts: Sequence[Columns]) -> tuple[str, ...]:
    """The steps columns (:data:`_STEP_COLUMNS` order) an insert of *parts*'
    rows names: all but those of :data:`_STEP_FALSY_DEFAULT` no row gives a
    true value of and those of :data:`_STEP_NULL_DEFAULT` every row leaves None."""
    left_out = set(_STEP_FALSY_DEFAULT + _STEP_NULL_DEFAULT)
    for rows in parts:
        for name in list(left_out):
            col = rows.get(name)
            if col is None:
                continue
            if any(col) if name in _STEP_FALSY_DEFAULT else col.count(None) != len(col):
                left_out.discard(name)
        if not left_out:
            break
    return tuple(c for c in _STEP_COLUMNS if c not in left_out)


@functools.cache
def _step_sql(columns: tuple[str, ...]) -> str:
    """The steps insert naming *columns* (one statement text per set: the
    writer prepares each once)."""
    marks = ", ".join("?" * len(columns))
    return f"INSERT INTO steps ({', '.join(columns)}) VALUES ({marks})"


def _step_rows(
    run_ids: Sequence[int], rows: Columns, columns: Sequence[str] = _STEP_COLUMNS
) -> list[tuple[Any, ...]]:
    """Steps rows of *columns* (:data:`_STEP_COLUMNS` order; *run_ids*: each
    row's run), built a column at a time."""
    assert columns[0] == "run_id"
    return rows.tuples((), [run_ids, *(_STEP_VALUES[c](rows) for c in columns[1:])])


def _comm_steps(run_id: int, rows: Columns) -> Columns:
    """A comm event's bucket rows as ``comm_steps`` rows (one per step,
    :func:`gpuprofd.storage.commpack.step_rows`), keyed by ``step`` and
    ``start_ns`` (its first launch), each whole row under ``row``."""
    names = ("step", *commpack.COLUMNS)
    packed = commpack.step_rows(run_id, rows.tuples((), [rows.column(n) for n in names]))
    return Columns(
        len(packed),
        {"step": [p[1] for p in packed], "start_ns": [p[2] for p in packed], "row": packed},
    )


def _comm_rows(_run_ids: Sequence[int], rows: Columns) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in rows.column("row")]


def _flags(rows: Columns, name: str) -> Sequence[int]:
    """A flag column as the 0/1 ints stored (0 where absent)."""
    col = rows.get(name)
    if col is None:
        return [0] * rows.n
    if set(map(type, col)) == _INT_ONLY:
        return col
    return [0 if v is None else int(v) for v in col]


_INT_ONLY = {int}


def _json_column(
    rows: Columns, name: str, empty: str | None, *, keep_empty: bool = True
) -> Sequence[str | None]:
    """An object column as JSON text; *empty* where absent (and, without
    *keep_empty*, for an empty list or object)."""
    col = rows.get(name)
    if col is None:
        return [empty] * rows.n
    if None in col or not keep_empty:
        return [_json(v) if v or (keep_empty and v is not None) else empty for v in col]
    return list(map(bytes.decode, map(_DUMPS, col)))


_DUMPS = functools.partial(orjson.dumps, option=orjson.OPT_NON_STR_KEYS)


#: Of a steps row and of a comm bucket: the columns that identify it, and the
#: one its query's range is also bounded by (so a resend is found in its
#: own stretch of the run, however often a manual loop reused the indices).
_STEP_KEY = ("step", "t0_ns")
_COMM_KEY = ("step", "start_ns")
#: Per table: the keys stored in some runs' ranges (``{ranges}``: one
#: :data:`_STORED_RANGE` per run, OR-ed), and each range's condition.
_STORED_SQL = {
    "steps": "SELECT run_id, step, t0_ns FROM steps WHERE {ranges}",
    "comm_steps": "SELECT run_id, step, start_ns FROM comm_steps WHERE {ranges}",
}
_STORED_RANGE = {
    "steps": "(run_id = ? AND step BETWEEN ? AND ? AND t0_ns BETWEEN ? AND ?)",
    "comm_steps": "(run_id = ? AND step BETWEEN ? AND ? AND start_ns BETWEEN ? AND ?)",
}
#: On Postgres, the same as one join with the ranges as arrays (``{key}``:
#: the key's columns): planned once for any number of runs, where the OR-ed
#: ranges cost ~17 ms of planning and scans for 160 runs on the test box.
_STORED_PG_SQL = (
    "SELECT t.run_id, {key} FROM {table} t JOIN unnest(?::bigint[], ?::bigint[], ?::bigint[], "
    "?::bigint[], ?::bigint[]) AS r(run_id, lo, hi, t_lo, t_hi) ON t.run_id = r.run_id "
    "AND t.step BETWEEN r.lo AND r.hi AND COALESCE(t.{last}, 0) BETWEEN r.t_lo AND r.t_hi"
)
#: A keyed table's rows in its insert's order, from each row's run id and the rows.
_RowsOf = Callable[[Sequence[int], Columns], list[tuple[Any, ...]]]


def _steps_insert(parts: Sequence[Columns]) -> tuple[str, _RowsOf]:
    """The steps insert of *parts*' rows (:func:`_step_columns`) and its rows."""
    columns = _step_columns(parts)
    return _step_sql(columns), functools.partial(_step_rows, columns=columns)


def _comm_insert(_parts: Sequence[Columns]) -> tuple[str, _RowsOf]:
    return commpack.INSERT_SQL, _comm_rows


#: Per table: the row's key, and its insert and rows for some rows.
_KEYED = {"steps": (_STEP_KEY, _steps_insert), "comm_steps": (_COMM_KEY, _comm_insert)}


class _Later:
    """What the batches append, inserted together after their last event:
    rows by statement (one bulk insert each: COPY on Postgres), and the
    steps and buckets whose resends are left out first (the module doc)."""

    def __init__(self, gpus: pgbulk.StoredGpus | None = None) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {}
        #: Postgres: the GPUs known stored (left out of the upsert), those
        #: upserted, and whether any was left out
        self.stored_gpus = gpus
        self.gpus_upserted: list[tuple[Any, ...]] = []
        self.gpus_left_out = False
        #: per keyed table: (run id, rows) in the order sent
        self.keyed: dict[str, list[tuple[int, Columns]]] = {}
        #: runs whose row a run or end event changed
        self.run_rows_changed: set[int] = set()
        #: Postgres: rows of :data:`_TAIL_INSERTS`, made in the group's last statement
        self.tail: dict[str, list[tuple[Any, ...]]] = {}
        #: statements whose rows have their columns' types already (built
        #: from a batch's checked columns): not looked at again before COPY
        self.typed: set[str] = set()

    def add(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            self.rows.setdefault(sql, []).extend(rows)

    def add_keyed(self, table: str, run_id: int, rows: Columns) -> None:
        if rows.n:
            self.keyed.setdefault(table, []).append((run_id, rows))

    async def insert(self, txn: Txn) -> None:
        for table, parts in self.keyed.items():
            key, plan = _KEYED[table]
            together = _together(parts)
            sql, to_rows = plan([rows for _, rows in together])
            have = await _stored(txn, table, parts, key)
            fresh: list[tuple[Any, ...]] = []
            for run_ids, rows in together:
                keys = rows.tuples((), [run_ids, *(rows.column(c) for c in key)])
                new = set(keys)
                built = to_rows(run_ids, rows)
                if len(new) == rows.n and have.isdisjoint(new):  # as a rule: all new
                    have |= new
                    fresh += built
                    continue
                for k, row in zip(keys, built, strict=True):
                    if None not in k:  # without its whole key a row cannot be told apart: kept
                        if k in have:
                            continue
                        have.add(k)  # the first of repeats is kept
                    fresh.append(row)
            self.add(sql, fresh)
            if table == "steps":  # _step_rows: ints (checked as such) and JSON text
                self.typed.add(sql)
        bulk = pgbulk.BULK if txn.dialect.name == "postgres" else {}
        if bulk:
            for sql in _TAIL_INSERTS:
                if sql in self.rows:
                    self.tail[sql] = self.rows.pop(sql)
        for sql, values in self.rows.items():
            if sql == rollup.GPU_SQL and bulk and self.stored_gpus is not None:
                once = pgbulk.gpus_once(values)  # less the GPUs known stored
                values = self.gpus_upserted = self.stored_gpus.unknown(once)
                self.gpus_left_out = len(values) < len(once)
            if sql in bulk:  # an upsert: one statement for the group's rows
                await bulk[sql](txn, values)
            else:
                await txn.executemany(sql, values, typed=sql in self.typed)


def _together(parts: Sequence[tuple[int, Columns]]) -> list[tuple[list[int], Columns]]:
    """*parts* as (each row's run id, rows), the parts that follow each other
    in one batch's columns (its events of a kind, as sent) taken as one."""
    runs: list[tuple[list[int], Columns, Columns, int]] = []  # ids, first, last, rows
    for run_id, rows in parts:
        if runs and rows.follows(runs[-1][2]):
            ids, first, _, n = runs[-1]
            ids += [run_id] * rows.n
            runs[-1] = (ids, first, rows, n + rows.n)
        else:
            runs.append(([run_id] * rows.n, rows, rows, rows.n))
    out = []
    for ids, first, _, n in runs:
        if n != first.n:  # several: one slice of their batch's columns
            assert first.parent is not None
            first = first.parent.slice(first.start, first.start + n)
        out.append((ids, first))
    return out


async def _stored(
    txn: Txn,
    table: str,
    parts: Sequence[tuple[int, Columns]],
    key: Sequence[str],
) -> set[tuple[Any, ...]]:
    """The keys (run id first) of *table*'s rows already stored within the
    stretch of each run that *parts* cover: one query per :data:`_CHUNK` runs."""
    spans: dict[int, list[int]] = {}
    for run_id, rows in parts:
        steps = rows.column("step")
        times = rows.column(key[-1], 0)
        lo_step, hi_step, lo_t, hi_t = min(steps), max(steps), min(times), max(times)
        span = spans.get(run_id)
        if span is None:
            spans[run_id] = [lo_step, hi_step, lo_t, hi_t]
        else:
            span[:] = [
                min(span[0], lo_step),
                max(span[1], hi_step),
                min(span[2], lo_t),
                max(span[3], hi_t),
            ]
    have: set[tuple[Any, ...]] = set()
    if txn.dialect.name == "postgres":
        arrays = [list(spans)] + [[span[j] for span in spans.values()] for j in range(4)]
        if table == "steps":  # the stored steps and the packs, in one round trip
            packs: list[tuple[Any, Any]] = []
            for packed, run_id, step, t0, data in await txn.fetch(_STORED_STEPS_PG_SQL, arrays):
                if packed:
                    packs.append((run_id, data))
                else:
                    have.add((run_id, step, t0))
            return have | _unpacked_keys(spans, packs)
        cols = ", ".join(f"t.{c}" for c in key)
        sql = _STORED_PG_SQL.format(table=table, key=cols, last=key[-1])
        return {tuple(r) for r in await txn.fetch(sql, arrays)}
    if table == "steps":  # a resend of steps packed since (steppack) is found in its pack
        have = await _packed_keys(txn, spans)
    listed = list(spans.items())
    for first in range(0, len(listed), _CHUNK):
        part = listed[first : first + _CHUNK]
        sql = _STORED_SQL[table].format(ranges=" OR ".join([_STORED_RANGE[table]] * len(part)))
        params = [v for run_id, span in part for v in (run_id, *span)]
        have.update(tuple(r) for r in await txn.fetch(sql, params))
    return have


#: On Postgres, the keys of the steps stored within some runs' ranges (as
#: :data:`_STORED_PG_SQL`) and the packed blocks (``step_packs``) that hold
#: indices of those ranges, in one statement (one round trip): each row is
#: ``(packed, run_id, step, t0_ns, data)``, a step's or a pack's.
_STORED_STEPS_PG_SQL = (
    "WITH r AS (SELECT * FROM unnest(?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[], "
    "?::bigint[]) AS r(run_id, lo, hi, t_lo, t_hi)) "
    "SELECT false, t.run_id, t.step, t.t0_ns, NULL::bytea FROM steps t JOIN r "
    "ON t.run_id = r.run_id AND t.step BETWEEN r.lo AND r.hi "
    "AND COALESCE(t.t0_ns, 0) BETWEEN r.t_lo AND r.t_hi "
    "UNION ALL SELECT true, p.run_id, NULL, NULL, p.data FROM step_packs p JOIN r "
    "ON p.run_id = r.run_id AND p.last_step >= r.lo AND p.first_step <= r.hi"
)
#: On SQLite, the packed blocks of steps that hold indices of some runs' ranges (OR-ed).
_PACKED_RANGE = "(run_id = ? AND last_step >= ? AND first_step <= ?)"


async def _packed_keys(txn: Txn, spans: Mapping[int, Sequence[int]]) -> set[tuple[Any, ...]]:
    """The ``(run_id, step, t0_ns)`` of packed steps within *spans* (run id ->
    ``[first step, last step, first t0, last t0]``), on SQLite (Postgres
    reads the packs with the stored steps: :data:`_STORED_STEPS_PG_SQL`)."""
    packs = []
    listed = list(spans.items())
    for first in range(0, len(listed), _CHUNK):
        part = listed[first : first + _CHUNK]
        sql = "SELECT run_id, data FROM step_packs WHERE " + " OR ".join(
            [_PACKED_RANGE] * len(part)
        )
        packs += await txn.fetch(sql, [v for rid, s in part for v in (rid, s[0], s[1])])
    return _unpacked_keys(spans, packs)


def _unpacked_keys(
    spans: Mapping[int, Sequence[int]], packs: Sequence[Sequence[Any]]
) -> set[tuple[Any, ...]]:
    """The ``(run_id, step, t0_ns)`` within *spans* of the steps in *packs*
    (``(run_id, data)`` rows of ``step_packs``)."""
    have: set[tuple[Any, ...]] = set()
    for run_id, data in packs:
        lo, hi, t_lo, t_hi = spans[run_id]
        have.update(
            (run_id, r[0], r[1])
            for r in stepcodec.decode(data)
            if lo <= r[0] <= hi and t_lo <= (r[1] or 0) <= t_hi
        )
    return have


def _in_order(run_id: int | None, rows: Columns, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """*rows* as tuples: *run_id* (unless None), then *names*' values."""
    return rows.tuples(() if run_id is None else (run_id,), [rows.column(n) for n in names])


async def _event(
    txn: Txn,
    node: str,
    ev: Mapping[str, Any],
    where: str,
    runs: Runs,
    out: Applied,
    later: _Later,
) -> None:
    """Apply one event; rows that are only appended go into *later*,
    inserted together after the batches' last event."""
    kind = ev["kind"]
    if kind == "run":
        later.run_rows_changed.add(await _upsert_run(txn, node, ev, where, runs))
        return
    if kind == "end":
        run_id = await _end_run(txn, node, ev, where, runs)
        later.run_rows_changed.add(run_id)
        if run_id not in out.ended_run_ids:
            out.ended_run_ids.append(run_id)
        return
    if kind == "host_samples":
        names = ("mono_ns", "cpu_pct", "cpu_count", "disk_read_bps", "disk_read_iops")
        names += ("page_cache_bytes", "mem_total_bytes", "swap_in_bps", "boot_id")
        assert set(names) == set(HOST_FIELDS)
        later.add(_HOST_SQL, _in_order(None, ev["rows"], names))
        return
    if kind == "gpu_rollups":
        rows = _in_order(None, ev["rows"], ROLLUP_COLUMNS)
        later.add(rollup.GPU_SQL, rollup.gpu_rows(rows))
        later.add(rollup.INSERT_SQL, [rollup.insert_params(r) for r in rows])
        return
    run_id = await _run_id(txn, node, ev, where, runs)
    if kind == "steps":
        assert len(STEP_FIELDS) == 14
        later.add_keyed("steps", run_id, ev["rows"])
    elif kind == "comm":
        assert set(COMM_FIELDS) == {"step", *commpack.COLUMNS}
        later.add_keyed("comm_steps", run_id, _comm_steps(run_id, ev["rows"]))
    elif kind == "run_cpu":
        names = ("mono_ns", "cores")
        assert set(names) == set(RUN_CPU_FIELDS)
        later.add(_RUN_CPU_SQL, _in_order(run_id, ev["rows"], names))
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
