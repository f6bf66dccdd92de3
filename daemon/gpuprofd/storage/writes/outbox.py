"""The forwarding outbox: what a node stores is also, in the same
transaction, an event waiting for the team server (DESIGN.md, "Team server
and forwarding"). The node's database is the spool: an event leaves the
``outbox`` table only when the server acknowledged it (:func:`ack`), when the
server refused it for good (:func:`dead_letter`: kept in ``outbox_dead``),
or when the outbox is over its byte bound (:func:`enforce_limit`: counted
in ``forward_given_up``, never silently).

An outbox row's ``seq`` is the node's sequence number in the batch format
(:mod:`gpuprofd.storage.writes.batch`): an ``AUTOINCREMENT`` key, so it only grows,
across restarts too, and the commit order of the one writer is its order.
Which ops put what in the outbox is said by each op's :class:`Forward`
(:data:`STEPS`, :data:`HOST`, ... below; :mod:`gpuprofd.storage.writes.runsdb`
attaches them); ``run`` and ``end`` events carry no body: their fields are
read from ``runs`` when they are sent (:func:`load_batch`), so a resent
event carries the run as it is now.

Pure encoders and async reads/writes over a :class:`~gpuprofd.storage.writes.store.Store`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gpuprofd.sampling.rollup import row_from_params
from gpuprofd.storage import commpack
from gpuprofd.storage.samplecodec import HOST_COLUMNS  # a host_samples row, less its boot
from gpuprofd.storage.stepcodec import COLUMNS as _STEP_COLUMNS  # a steps row, in order
from gpuprofd.storage.writes.batch import (
    BATCH_VERSION,
    END_FIELDS,
    ENDED_STATUSES,
    MAX_BATCH_ROWS,
    MAX_EVENTS,
    RUN_FIELDS,
    RUN_KINDS,
)
from gpuprofd.storage.writes.ops import Forward, Op, Part, Txn
from gpuprofd.storage.writes.store import Store

#: What a full outbox gives up first (lowest first): raw samples, then the
#: per-second GPU rollups and kernel windows, then insights (a later event
#: replaces them), then steps; ``run`` and ``end`` events are never given up
#: (they have no body: dropping them frees nothing, and without a run's
#: event the server refuses the rest of it).
PRIORITY_RAW = 0
PRIORITY_ROLLUP = 1
PRIORITY_INSIGHTS = 2
PRIORITY_STEPS = 3
PRIORITY_RUN = 4
#: Largest batch body before compression, bytes: a catching-up node sends
#: batches of this size (a 1-hour backlog of an 8-GPU node, ~150 MB, in ~40 posts).
MAX_BATCH_BYTES = 4 * 1024 * 1024

_JSON_STEP_COLUMNS = ("phases", "optimizers")
_HOST_COLUMNS = (*HOST_COLUMNS, "boot_id")
_WORKER_COLUMNS = (
    "loader_seq",
    "worker_id",
    "pid",
    "first_mono_ns",
    "last_mono_ns",
    "cpu_s",
    "ctx_voluntary",
    "ctx_involuntary",
)
_COMM_COLUMNS = ("step", *commpack.COLUMNS)


def _params(op: Op, part: int = 0) -> Sequence[Any]:
    """The op's row: its params, or the first row of its *part*-th atomic part."""
    return op.parts[part].rows[0] if op.parts else op.params


def _step(op: Op, _value: Any) -> tuple[int | None, Any, int]:
    params = _params(op)
    row = dict(zip(_STEP_COLUMNS, params[1:], strict=True))
    for col in _JSON_STEP_COLUMNS:
        if row[col] is not None:
            row[col] = orjson.loads(row[col])
    return params[0], {"rows": [row]}, 1


def _comm(op: Op, _value: Any) -> tuple[int | None, Any, int]:
    run_id, step, *_, packed = op.parts[1].rows[0]
    rows = commpack.bucket_rows([(step, packed)])
    out = [dict(zip(_COMM_COLUMNS, r, strict=True)) for r in rows]
    return run_id, {"rows": out}, len(out)


def _host(op: Op, _value: Any) -> tuple[int | None, Any, int]:
    return None, {"rows": [dict(zip(_HOST_COLUMNS, op.params, strict=True))]}, 1


def _run_cpu(op: Op, _value: Any) -> tuple[int | None, Any, int]:
    run_id, mono_ns, cores = op.params
    return run_id, {"rows": [{"mono_ns": mono_ns, "cores": cores}]}, 1


def _worker_cpu(op: Op, _value: Any) -> tuple[int | None, Any, int]:
    return op.params[0], {"rows": [dict(zip(_WORKER_COLUMNS, op.params[1:], strict=True))]}, 1


def _rollup(op: Op, _value: Any) -> tuple[int | None, Any, int]:
    return None, {"rows": [row_from_params(op.parts[0].rows[0], op.parts[1].rows[0])]}, 1


def _run(op: Op, value: Any) -> tuple[int | None, Any, int]:
    """A run's row changed: its event's fields are read when it is sent."""
    return (op.run_id if op.run_id is not None else value), None, 0


STEPS = Forward("steps", PRIORITY_STEPS, _step)
COMM = Forward("comm", PRIORITY_RAW, _comm)
HOST = Forward("host_samples", PRIORITY_RAW, _host)
RUN_CPU = Forward("run_cpu", PRIORITY_RAW, _run_cpu)
WORKER_CPU = Forward("worker_cpu", PRIORITY_RAW, _worker_cpu)
ROLLUP = Forward("gpu_rollups", PRIORITY_ROLLUP, _rollup)
RUN = Forward("run", PRIORITY_RUN, _run)
END = Forward("end", PRIORITY_RUN, _run)


def kernels(run_id: int, msg: Mapping[str, Any]) -> Forward:
    """The ``kernels`` event of one validated kernels message (its window and rows)."""
    window = {
        "t0_ns": msg["t0"],
        "t1_ns": msg["t1"],
        "source": msg["source"],
        "steps": msg.get("steps"),
        "rows_dropped": msg.get("rows_dropped", 0),
    }
    if msg.get("evidence") is not None:  # the finding's request it answers (gpuprof.evidence)
        window["evidence"] = dict(msg["evidence"])
    body = {"window": window, "rows": [list(r) for r in msg["rows"]], "replaces": []}
    return Forward("kernels", PRIORITY_ROLLUP, lambda op, v: (run_id, body, len(body["rows"])))


def stacks(run_id: int, msg: Mapping[str, Any]) -> Forward:
    """The ``stacks`` event of one validated stacks message: its source and
    rows (each ``[path, line, function, call, step, count]``), added to the
    server's counts once (the batch's sequence keeps a resend from adding twice)."""
    body = {"source": msg["source"], "rows": [list(r) for r in msg["rows"]]}
    return Forward("stacks", PRIORITY_RAW, lambda op, v: (run_id, body, len(body["rows"])))


def insights(run_id: int, found: Sequence[Mapping[str, Any]]) -> Forward:
    """The ``insights`` event replacing a run's findings with *found*
    (``rule``, ``severity``, ``title``, ``detail``, ``fix``, ``evidence`` each)."""
    body = {"insights": [dict(i) for i in found]}
    return Forward("insights", PRIORITY_INSIGHTS, lambda op, v: (run_id, body, len(found)))


# --- the node's identity ----------------------------------------------------


async def node_id(store: Store) -> str:
    """This database's node id (made once, a UUID, kept in ``meta``): the
    server keys the node's sequence numbers by it, so a database that starts
    over is a new node."""
    row = await store.fetchone("SELECT value FROM meta WHERE key = 'node_id'")
    if row is not None:
        return str(row[0])
    await store.write(
        "INSERT INTO meta (key, value) VALUES ('node_id', ?) ON CONFLICT (key) DO NOTHING",
        (str(uuid.uuid4()),),
    )
    row = await store.fetchone("SELECT value FROM meta WHERE key = 'node_id'")
    assert row is not None
    return str(row[0])


async def remember_server(store: Store, url: str) -> None:
    """Keep the server this outbox is for (``gpuprofctl drain``'s default)."""
    await store.write(
        "INSERT INTO meta (key, value) VALUES ('forward_server', ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (url,),
    )


async def remembered_server(store: Any) -> str | None:
    """The server the outbox was last forwarded to, if any (a Reader or Store)."""
    row = await store.fetchone("SELECT value FROM meta WHERE key = 'forward_server'")
    return None if row is None else str(row[0])


# --- batches ----------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """One outbox row (``body`` as stored: JSON text, or None for run/end)."""

    seq: int
    kind: str
    run_id: int | None
    body: str | None
    n_rows: int
    bytes: int


@dataclass
class Batch:
    """The next batch: its events' outbox rows (all of them, sent or not) and
    the body to post (None when none of them can be sent: every run gone)."""

    rows: list[Waiting]
    body: bytes | None
    events: int
    """Events in :attr:`body` (rows whose run is gone are not sent, but acknowledged with it)."""
    gone: list[Waiting]
    """Rows about runs no longer in the database: dropped with the batch."""

    @property
    def last_seq(self) -> int:
        return self.rows[-1].seq


async def waiting(
    store: Any,
    *,
    max_events: int = MAX_EVENTS,
    max_rows: int = MAX_BATCH_ROWS,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[Waiting]:
    """The oldest outbox rows, in sequence order, within the bounds (at least one)."""
    rows = await store.fetchall(
        "SELECT seq, kind, run_id, body, n_rows, bytes FROM outbox ORDER BY seq LIMIT ?",
        (max_events,),
    )
    out: list[Waiting] = []
    n_rows = size = 0
    for r in rows:
        w = Waiting(int(r[0]), str(r[1]), r[2], r[3], int(r[4]), int(r[5]))
        if out and (n_rows + w.n_rows > max_rows or size + w.bytes > max_bytes):
            break
        out.append(w)
        n_rows += w.n_rows
        size += w.bytes
    return out


_RUN_COLUMNS = tuple(dict.fromkeys(("id", "run_uuid", *RUN_FIELDS, *END_FIELDS)))


async def _runs(store: Store, run_ids: set[int]) -> dict[int, dict[str, Any]]:
    """The rows of *run_ids* that still exist; a run without a UUID (stored
    by a gpuprofd before UUIDs) is given one now."""
    out: dict[int, dict[str, Any]] = {}
    listed = sorted(run_ids)
    for first in range(0, len(listed), 500):
        part = listed[first : first + 500]
        marks = ", ".join("?" * len(part))
        sql = f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE id IN ({marks})"
        for row in await store.fetchall(sql, part):
            out[int(row["id"])] = dict(zip(_RUN_COLUMNS, tuple(row), strict=True))
    for run_id, row in out.items():
        if row["run_uuid"] is None:
            made = str(uuid.uuid4())
            await store.write(
                "UPDATE runs SET run_uuid = ? WHERE id = ? AND run_uuid IS NULL", (made, run_id)
            )
            got = await store.fetchone("SELECT run_uuid FROM runs WHERE id = ?", (run_id,))
            row["run_uuid"] = got[0] if got is not None else made
    return out


def _run_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    fields = {f: row[f] for f in RUN_FIELDS}
    options = fields.get("options")
    fields["options"] = orjson.loads(options) if isinstance(options, str) else options
    return fields


def _event(w: Waiting, runs: Mapping[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The batch event of outbox row *w*; None when its run is gone."""
    ev: dict[str, Any] = {"seq": w.seq, "kind": w.kind}
    if w.kind in RUN_KINDS:
        run = runs.get(w.run_id) if w.run_id is not None else None
        if run is None:
            return None
        ev["run"] = run["run_uuid"]
        if w.kind == "run" or (w.kind == "end" and run["status"] not in ENDED_STATUSES):
            ev["kind"] = "run"  # (an end whose run was taken up again: it is running)
            ev["fields"] = _run_fields(run)
            return ev
        if w.kind == "end":
            fields = {f: run[f] for f in END_FIELDS}
            if isinstance(fields["summary"], str):
                fields["summary"] = orjson.loads(fields["summary"])
            ev["fields"] = fields
            return ev
    if w.body is not None:
        ev.update(orjson.loads(w.body))
    return ev


async def load_batch(store: Store, node: str, host: str | None, rows: list[Waiting]) -> Batch:
    """The batch body (JSON, uncompressed) of outbox *rows* for *node*."""
    run_ids = {w.run_id for w in rows if w.kind in RUN_KINDS and w.run_id is not None}
    runs = await _runs(store, run_ids) if run_ids else {}
    events: list[dict[str, Any]] = []
    gone: list[Waiting] = []
    for w in rows:
        ev = _event(w, runs)
        if ev is None:
            gone.append(w)
        else:
            events.append(ev)
    body = None
    if events:
        body = orjson.dumps({"v": BATCH_VERSION, "node": node, "host": host, "events": events})
    return Batch(rows, body, len(events), gone)


# --- acknowledged, refused, given up ------------------------------------------


async def run_seqs(store: Any, run_id: int) -> list[int]:
    """The sequence numbers of every event of run *run_id* waiting in the outbox, in order."""
    rows = await store.fetchall("SELECT seq FROM outbox WHERE run_id = ? ORDER BY seq", (run_id,))
    return [int(r[0]) for r in rows]


async def ack(store: Store, acked_seq: int) -> None:
    """Forget every event up to *acked_seq* (the server applied them)."""
    await store.write("DELETE FROM outbox WHERE seq <= ?", (acked_seq,))


_DEAD_SQL = (
    "INSERT INTO outbox_dead (seq, kind, run_id, priority, body, n_rows, bytes, wall_ns, "
    "status, reason, dead_wall_ns) SELECT seq, kind, run_id, priority, body, n_rows, bytes, "
    "wall_ns, ?, ?, ? FROM outbox WHERE seq = ? ON CONFLICT (seq) DO NOTHING"
)


async def dead_letter(
    store: Store, seqs: Sequence[int], status: int, reason: str, now: int
) -> None:
    """Move the events *seqs* to ``outbox_dead`` with the server's *status*
    and *reason* (never sent again; ``gpuprofctl status`` says so)."""
    parts = (
        Part(_DEAD_SQL, [(status, reason[:2000], now, s) for s in seqs]),
        Part("DELETE FROM outbox WHERE seq = ?", [(s,) for s in seqs]),
    )
    await store.write_atomic(parts, "dead-letter")


_GIVEN_UP_SQL = (
    "INSERT INTO forward_given_up (run_id, kind, events, bytes) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (run_id, kind) DO UPDATE SET events = forward_given_up.events + "
    "excluded.events, bytes = forward_given_up.bytes + excluded.bytes"
)


async def give_up(store: Store, rows: Sequence[Waiting | tuple[int, str, int | None, int]]) -> int:
    """Delete outbox *rows* that will not be sent, counted per run and kind;
    return how many were given up. Rows no longer there (acknowledged or
    dead-lettered since they were read) are not counted: they were not lost."""
    seqs = sorted({r.seq if isinstance(r, Waiting) else r[0] for r in rows})

    async def delete(txn: Txn) -> int:
        counts: dict[tuple[int, str], list[int]] = {}
        for first in range(0, len(seqs), 500):
            part = seqs[first : first + 500]
            marks = ", ".join("?" * len(part))
            sql = f"DELETE FROM outbox WHERE seq IN ({marks}) RETURNING kind, run_id, bytes"
            for kind, run_id, size in await txn.fetch(sql, part):
                c = counts.setdefault((run_id or 0, str(kind)), [0, 0])
                c[0] += 1
                c[1] += int(size)
        values = [(run, kind, n, b) for (run, kind), (n, b) in counts.items()]
        for value in values:
            await txn.execute(_GIVEN_UP_SQL, value)
        return sum(n for n, _ in counts.values())

    return int(await store.transaction(delete, "outbox given up"))


async def total_bytes(store: Any) -> int:
    row = await store.fetchone("SELECT COALESCE(SUM(bytes), 0) FROM outbox")
    return int(row[0]) if row is not None else 0


async def enforce_limit(store: Store, max_bytes: int, chunk: int = 5000, after_seq: int = 0) -> int:
    """Give up the oldest events of the lowest priority until the outbox
    holds at most *max_bytes* (run and end events are kept), leaving those
    up to *after_seq* alone (the batch being sent). Returns the events given up."""
    over = await total_bytes(store) - max_bytes
    given = 0
    for priority in range(PRIORITY_RUN):
        while over > 0:
            rows = await store.fetchall(
                "SELECT seq, kind, run_id, bytes FROM outbox WHERE priority = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (priority, after_seq, chunk),
            )
            if not rows:
                break
            take = []
            for seq, kind, run_id, size in rows:
                if over <= 0:
                    break
                take.append((int(seq), str(kind), run_id, int(size)))
                over -= int(size)
            given += await give_up(store, take)
    return given


@dataclass(frozen=True)
class OutboxState:
    """What waits, what was refused, what was given up (``gpuprofctl status``)."""

    events: int
    bytes: int
    oldest_wall_ns: int | None
    dead_events: int
    dead_reason: str | None
    """The latest refusal's reason."""
    given_up_events: int
    given_up_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def state(store: Any) -> OutboxState:
    """The outbox now (a Store or a Reader)."""
    w = await store.fetchone("SELECT COUNT(*), COALESCE(SUM(bytes), 0), MIN(wall_ns) FROM outbox")
    d = await store.fetchone("SELECT COUNT(*) FROM outbox_dead")
    last = await store.fetchone("SELECT reason FROM outbox_dead ORDER BY dead_wall_ns DESC LIMIT 1")
    g = await store.fetchone(
        "SELECT COALESCE(SUM(events), 0), COALESCE(SUM(bytes), 0) FROM forward_given_up"
    )
    return OutboxState(
        events=int(w[0]),
        bytes=int(w[1]),
        oldest_wall_ns=None if w[2] is None else int(w[2]),
        dead_events=int(d[0]),
        dead_reason=None if last is None else str(last[0]),
        given_up_events=int(g[0]),
        given_up_bytes=int(g[1]),
    )


async def given_up_for_run(store: Any, run_id: int) -> int:
    """Events of *run_id* a full outbox gave up (the run's summary says so)."""
    row = await store.fetchone(
        "SELECT COALESCE(SUM(events), 0) FROM forward_given_up WHERE run_id = ?", (run_id,)
    )
    return int(row[0]) if row is not None else 0
