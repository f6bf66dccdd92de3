"""Carrying live runs over when the database file is deleted or replaced.

``rm gpuprof.db*`` under a running daemon leaves SQLite writing into the open,
nameless file: every later row would be lost when the daemon exits, and
``gpuprofctl`` (which opens the path) would see nothing. The daemon checks the
path (:meth:`gpuprofd.storage.writes.store.Store.file_state`) at each hello and once a
second, and then switches to a fresh database at the path
(:meth:`gpuprofd.storage.writes.store.Store.reopen`). :func:`read_live_runs` /
:func:`write_live_runs` are what it carries across: the runs still open
(their run row, steps, live insights, CPU samples, DataLoader workers,
kernel windows, comm buckets) and the node's host and GPU samples since the
earliest of them started, so their insights are whole. Finished runs stay
deleted, as the user asked.

A run keeps its id when the new file does not use it (always, after a plain
``rm``); a file put in the old one's place that already holds runs gets the
live runs under new ids (:func:`write_live_runs` returns the mapping).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiosqlite

from gpuprofd.sampling import rollup

#: Tables of per-run rows, by ``run_id`` (kernel_windows/kernel_stats apart:
#: their window ids are renumbered). A run's packed steps go with their
#: blocks' rollups and totals (a block is packed once both are written).
RUN_TABLES = (
    "steps",
    "step_packs",
    "step_rollups",
    "step_totals",
    "insights",
    "run_cpu_samples",
    "run_cpu_packs",
    "host_rollups",  # its packed samples' blocks are rolled from rows no more
    "worker_cpu",
    "comm_steps",
    "stack_samples",
)
#: Node-level tables and their time column: the live runs' stretch is copied.
NODE_TABLES = (
    ("host_samples", "mono_ns"),
    ("host_packs", "t_max_ns"),  # a pack reaching into the stretch: all of it
    ("gpu_samples", "mono_ns"),
    ("gpu_slow_samples", "mono_ns"),
    ("gpu_rollups", "sec_ns"),
)


async def _rows(
    conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()
) -> tuple[list[str], list[tuple[Any, ...]]]:
    async with conn.execute(sql, params) as cur:
        rows = [tuple(r) for r in await cur.fetchall()]
        cols = [d[0] for d in cur.description or ()]
    return cols, rows


def _insert_sql(table: str, cols: Sequence[str]) -> str:
    names = ", ".join(f'"{c}"' for c in cols)
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})"


@dataclass
class Snapshot:
    """The open runs' rows, read from the old file (:func:`read_live_runs`)."""

    runs: tuple[list[str], list[tuple[Any, ...]]] = ([], [])
    tables: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = field(default_factory=dict)
    """Per-run tables, kernel_windows, kernel_stats and the node tables."""


#: A forwarding node's spool (:mod:`gpuprofd.storage.writes.outbox`), carried whole:
#: what the team server has not acknowledged must not go with the old file.
SPOOL_TABLES = ("outbox", "outbox_dead", "forward_given_up")
SPOOL_META = ("node_id", "forward_server")


async def read_live_runs(old: aiosqlite.Connection, run_ids: Sequence[int]) -> Snapshot:
    """The rows of *run_ids* in *old*, the node samples since the earliest
    started, and the forwarding spool (the outbox, its dead letters, what was
    given up, the node's id and its sequence so far)."""
    snap = Snapshot()
    await _read_spool(old, snap)
    if not run_ids:
        return snap
    marks = ", ".join("?" * len(run_ids))
    snap.runs = cols, runs = await _rows(old, f"SELECT * FROM runs WHERE id IN ({marks})", run_ids)
    if not runs:
        return snap
    have = {r[0] for r in (await _rows(old, "SELECT name FROM sqlite_master"))[1]}
    for table in (*RUN_TABLES, "kernel_windows", "kernel_stats", "evidence_windows"):
        if table not in have:  # evidence_windows: schema 20
            continue
        snap.tables[table] = await _rows(
            old, f"SELECT * FROM {table} WHERE run_id IN ({marks})", run_ids
        )
    i_mono = cols.index("start_mono_ns")
    starts = [row[i_mono] for row in runs if row[i_mono] is not None]
    if starts:
        for table, col in NODE_TABLES:
            snap.tables[table] = await _rows(
                old, f"SELECT * FROM {table} WHERE {col} >= ?", (min(starts),)
            )
    return snap


async def _read_spool(old: aiosqlite.Connection, snap: Snapshot) -> None:
    tables = {r[0] for r in (await _rows(old, "SELECT name FROM sqlite_master"))[1]}
    if "outbox" not in tables:  # a database older than forwarding
        return
    for table in SPOOL_TABLES:
        snap.tables[table] = await _rows(old, f"SELECT * FROM {table}")
    marks = ", ".join("?" * len(SPOOL_META))
    snap.tables["meta"] = await _rows(
        old, f"SELECT key, value FROM meta WHERE key IN ({marks})", SPOOL_META
    )
    if "sqlite_sequence" in tables:
        snap.tables["sqlite_sequence"] = await _rows(
            old, "SELECT name, seq FROM sqlite_sequence WHERE name = 'outbox'"
        )


async def _write_spool(new: aiosqlite.Connection, snap: Snapshot, ids: dict[int, int]) -> None:
    """The old file's spool into *new*. A fresh file takes the node's id and
    goes on with its sequence (the server has seen those numbers); a file
    that is already another node's keeps its id, and the events waiting are
    queued in it again as its own. Run ids follow *ids*; an event of a run
    not carried over stays as it was (the forwarder counts it gone)."""
    meta = dict(snap.tables.get("meta", ([], []))[1])
    if not snap.tables.get("outbox") and not meta:
        return
    async with new.execute("SELECT value FROM meta WHERE key = 'node_id'") as c:
        own = await c.fetchone()
    fresh = own is None or own[0] == meta.get("node_id")
    for key, value in meta.items():
        if fresh or key != "node_id":
            await new.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                "SET value = excluded.value",
                (key, value),
            )
    for table in SPOOL_TABLES:
        tcols, trows = snap.tables.get(table, ([], []))
        if not trows:
            continue
        r = tcols.index("run_id")
        rows = [(*t[:r], ids.get(t[r], t[r]) if t[r] else t[r], *t[r + 1 :]) for t in trows]
        if table == "outbox" and not fresh:  # new numbers, after the file's own
            cols = [c for c in tcols if c != "seq"]
            i = tcols.index("seq")
            rows = [(*t[:i], *t[i + 1 :]) for t in rows]
        else:
            cols = list(tcols)
        verb = "INSERT OR IGNORE" if table == "outbox_dead" else "INSERT"
        if table == "forward_given_up":
            verb = "INSERT OR REPLACE"
        await new.executemany(_insert_sql(table, cols).replace("INSERT", verb, 1), rows)
    seq = snap.tables.get("sqlite_sequence", ([], []))[1]
    if fresh and seq:  # nothing waiting: the next event still follows the last one sent
        await new.execute(
            "UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'outbox'", (seq[0][1],)
        )
        await new.execute(
            "INSERT INTO sqlite_sequence (name, seq) SELECT 'outbox', ? WHERE NOT EXISTS "
            "(SELECT 1 FROM sqlite_sequence WHERE name = 'outbox')",
            (seq[0][1],),
        )


async def write_live_runs(new: aiosqlite.Connection, snap: Snapshot) -> dict[int, int]:
    """Write *snap* into *new* in one transaction; return old run id → id in *new*."""
    cols, runs = snap.runs
    ids: dict[int, int] = {}
    await new.execute("BEGIN IMMEDIATE")
    try:
        if not runs:
            await _write_spool(new, snap, ids)
            await new.execute("COMMIT")
            return ids
        i_id, i_key = cols.index("id"), cols.index("run_key")
        i_uuid = cols.index("run_uuid") if "run_uuid" in cols else None
        for row in runs:
            # the same run already there (the old file copied back in place):
            # the old file's rows are a superset, so they replace it
            async with new.execute("SELECT id FROM runs WHERE run_key = ?", (row[i_key],)) as c:
                same = await c.fetchone()
            if same is not None:
                await _delete_run(new, same[0])
            if i_uuid is not None and row[i_uuid] is not None:
                # a copy of this database made while the run was open holds its
                # UUID too: the live run keeps it (a team server knows it by it)
                await new.execute(
                    "UPDATE runs SET run_uuid = NULL WHERE run_uuid = ?", (row[i_uuid],)
                )
            async with new.execute("SELECT 1 FROM runs WHERE id = ?", (row[i_id],)) as c:
                taken = await c.fetchone() is not None
            if taken:
                vals = [v for i, v in enumerate(row) if i != i_id]
                cur = await new.execute(_insert_sql("runs", [c for c in cols if c != "id"]), vals)
                ids[row[i_id]] = int(cur.lastrowid or 0)
            else:
                await new.execute(_insert_sql("runs", cols), row)
                ids[row[i_id]] = row[i_id]
        for table in RUN_TABLES:
            tcols, trows = snap.tables.get(table, ([], []))
            if trows:
                r = tcols.index("run_id")
                await new.executemany(
                    _insert_sql(table, tcols), [(*t[:r], ids[t[r]], *t[r + 1 :]) for t in trows]
                )
        await _write_kernels(new, snap, ids)
        await _write_spool(new, snap, ids)
        for table, _ in NODE_TABLES:
            tcols, trows = snap.tables.get(table, ([], []))
            if trows and table == "gpu_rollups":  # a view: its GPUs' rows, then the seconds
                at = [tcols.index(c) for c in rollup.ROLLUP_COLUMNS]
                rows = [tuple(t[i] for i in at) for t in trows]
                await new.executemany(rollup.GPU_SQL, rollup.gpu_rows(rows))
                await new.executemany(rollup.INSERT_SQL, [rollup.insert_params(r) for r in rows])
            elif trows:
                await new.executemany(_insert_sql(table, tcols), trows)
        await new.execute("COMMIT")
    except BaseException:
        await new.execute("ROLLBACK")
        raise
    return ids


async def _write_kernels(new: aiosqlite.Connection, snap: Snapshot, ids: dict[int, int]) -> None:
    """Kernel windows get new ids in *new*; their stats follow them."""
    wcols, windows = snap.tables.get("kernel_windows", ([], []))
    if not windows:
        return
    scols, stats = snap.tables.get("kernel_stats", ([], []))
    w_id, w_run = wcols.index("id"), wcols.index("run_id")
    keep = [c for c in wcols if c != "id"]
    window_ids: dict[int, int] = {}
    for w in windows:
        vals = [ids[v] if i == w_run else v for i, v in enumerate(w) if i != w_id]
        cur = await new.execute(_insert_sql("kernel_windows", keep), vals)
        window_ids[w[w_id]] = int(cur.lastrowid or 0)
    ecols, links = snap.tables.get("evidence_windows", ([], []))
    if links:  # an evidence window's link follows its window's new id
        e_win, e_run = ecols.index("window_id"), ecols.index("run_id")
        moved = []
        for e in links:
            row = list(e)
            row[e_win], row[e_run] = window_ids.get(e[e_win]), ids[e[e_run]]
            moved.append(row)
        await new.executemany(_insert_sql("evidence_windows", ecols), moved)
    if not stats:
        return
    s_win, s_run = scols.index("window_id"), scols.index("run_id")
    rows = []
    for s in stats:
        if s[s_win] in window_ids:
            row = list(s)
            row[s_win], row[s_run] = window_ids[s[s_win]], ids[s[s_run]]
            rows.append(row)
    if rows:
        await new.executemany(_insert_sql("kernel_stats", scols), rows)


async def _delete_run(conn: aiosqlite.Connection, run_id: int) -> None:
    for table in (*RUN_TABLES, "kernel_stats", "kernel_windows", "evidence_windows"):
        await conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
    await conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
