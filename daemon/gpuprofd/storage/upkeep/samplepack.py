"""Packing of the older 2 Hz samples: per block of
:data:`~gpuprofd.storage.reads.samplerows.SAMPLE_PACK_NS` of a boot's
monotonic clock, one ``host_packs`` row for the boot's host samples and one
``run_cpu_packs`` row per run for its CPU samples
(:mod:`gpuprofd.storage.samplecodec`: columnar, compressed, lossless) instead
of 1,200 rows each and their index entries. The reads are
:mod:`gpuprofd.storage.reads.samplerows`' (every reader of those samples).

A host sample row costs ~60 bytes with its index and a run CPU sample ~45: a
day of both is ~0.45 MB per GPU-hour on an 8-GPU node; packed, a sample costs
a few bytes. Per boot (of the runs the database holds) the pass keeps as rows:

* the samples within :data:`SAMPLES_RAW_KEPT_NS` of the boot's newest (the
  live charts' and ``gpuprofctl top``'s, and the newest the host rollup pass
  looks for);
* the samples of blocks the host rollup pass has yet to roll for a run of the
  boot (its SQL over rows is the cheaper way:
  :mod:`gpuprofd.storage.upkeep.hostrollup`; a run that starts in a span
  packed already is rolled from the packs);

and packs the other blocks oldest first, one block per transaction (read,
insert packed, delete: a crash leaves the block whole either way; a replica
that packed it first wins by the key, the other deletes nothing), at most
:data:`MAX_BLOCKS_PER_ROUND` a round. A sample stored for a block after it was
packed stays a row (read beside it).
"""

from __future__ import annotations

import logging
from typing import Any

from gpuprofd.storage.reads.samplerows import HOST, RUN_CPU, SAMPLE_PACK_NS, Table
from gpuprofd.storage.samplecodec import encode
from gpuprofd.storage.upkeep.hostrollup import HOST_BLOCK_NS, NEWEST_SQL
from gpuprofd.storage.writes import Store
from gpuprofd.storage.writes.ops import Txn

log = logging.getLogger(__name__)

#: The newest span of a boot's samples kept as rows, ns: two blocks (20 min),
#: what a live chart and ``gpuprofctl top`` read.
SAMPLES_RAW_KEPT_NS = 2 * SAMPLE_PACK_NS
#: Most blocks one round packs (a block is ~10 ms of the writer on a 2-core
#: box): an 8-rank day's backlog (9 x 144 blocks) in ~13 rounds.
MAX_BLOCKS_PER_ROUND = 100

#: Each run: its boot, its window, its last host-rolled block, its last CPU pack.
_RUNS_SQL = (
    "SELECT r.id AS id, r.status AS status, r.boot_id AS boot_id, "
    "r.start_mono_ns AS start_ns, r.end_mono_ns AS end_ns, "
    "(SELECT MAX(block) FROM host_rollups WHERE run_id = r.id) AS rolled, "
    "(SELECT MAX(block) FROM run_cpu_packs WHERE run_id = r.id) AS packed "
    "FROM runs r ORDER BY r.id"
)
_HOST_PACKED_SQL = "SELECT MAX(block) AS b FROM host_packs WHERE boot_key = ?"


def roll_from(
    status: str, start_ns: int | None, end_ns: int | None, rolled: int | None
) -> int | None:
    """The first monotonic ns of a run's samples the host rollup pass has
    yet to roll (its next block's start); None: it rolls no more (ended, its
    last whole block rolled) or none (no start)."""
    if start_ns is None:
        return None
    first = -(-start_ns // HOST_BLOCK_NS) if rolled is None else rolled + 1
    if status != "running" and end_ns is not None and first >= end_ns // HOST_BLOCK_NS:
        return None
    return first * HOST_BLOCK_NS


def packable_end(newest_ns: int | None, pending: list[int | None]) -> int:
    """The block index below which samples may be packed: every block
    ending :data:`SAMPLES_RAW_KEPT_NS` before the boot's newest sample
    *newest_ns* and before each *pending* roll start (:func:`roll_from`)."""
    if newest_ns is None:
        return 0
    end = min([newest_ns - SAMPLES_RAW_KEPT_NS] + [p for p in pending if p is not None])
    return max(0, end // SAMPLE_PACK_NS)


def _block_sql(t: Table) -> str:
    return (
        f"SELECT {', '.join(t.columns)} FROM {t.rows} WHERE {t.key} {t.match} ? "
        "AND mono_ns >= ? AND mono_ns < ? ORDER BY mono_ns, rowid"
    )


def _next_sql(t: Table) -> str:
    return f"SELECT MIN(mono_ns) AS t FROM {t.rows} WHERE {t.key} {t.match} ? AND mono_ns >= ?"


async def _pack(txn: Txn, t: Table, key: Any, block: int) -> int:
    """Pack block *block* of *key*'s samples of *t* in *txn*; the rows packed."""
    lo, hi = block * SAMPLE_PACK_NS, (block + 1) * SAMPLE_PACK_NS
    rows = [tuple(r) for r in await txn.fetch(_block_sql(t), (key, lo, hi))]
    if not rows:
        return 0
    pack = (t.packed(key), block, len(rows), rows[0][0], rows[-1][0], encode(t.columns, rows))
    insert = (
        f"INSERT INTO {t.packs} ({t.pack_key}, block, n, t_min_ns, t_max_ns, data) "
        f"VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT ({t.pack_key}, block) DO NOTHING"
    )
    if not await txn.execute(insert, pack):
        return 0  # packed by another replica meanwhile: its rows are gone already
    await txn.execute(
        f"DELETE FROM {t.rows} WHERE {t.key} {t.match} ? AND mono_ns >= ? AND mono_ns < ?",
        (key, lo, hi),
    )
    return len(rows)


async def _pack_key(store: Store, t: Table, key: Any, start: int, end: int, budget: int) -> int:
    """Pack *key*'s blocks from *start* up to block *end* (excluded), at most
    *budget*; the blocks packed."""
    done = 0
    at = start * SAMPLE_PACK_NS
    while done < budget and start < end:  # (a run packed to its end: no query)
        got = await store.fetchone(_next_sql(t), (key, at))
        if got is None or got["t"] is None or int(got["t"]) // SAMPLE_PACK_NS >= end:
            break
        block = int(got["t"]) // SAMPLE_PACK_NS

        async def pack(txn: Txn, b: int = block) -> int:
            return await _pack(txn, t, key, b)

        try:
            await store.transaction(pack, "pack-samples")
        except ValueError as exc:  # a value neither a number nor JSON: the block stays rows
            log.warning("%s of %s block %d left unpacked: %s", t.rows, key, block, exc)
        else:
            done += 1
        at = (block + 1) * SAMPLE_PACK_NS
    return done


async def pack_round(store: Store, max_blocks: int = MAX_BLOCKS_PER_ROUND) -> int:
    """Pack what each boot and run has packable (see the module doc), at
    most *max_blocks* blocks; returns the blocks packed."""
    runs = await store.fetchall(_RUNS_SQL)
    by_boot: dict[str | None, list[Any]] = {}
    for r in runs:
        by_boot.setdefault(r["boot_id"], []).append(r)
    done = 0
    for boot, its in by_boot.items():
        row = await store.fetchone(NEWEST_SQL, (boot,))
        newest = None if row is None or row["t"] is None else int(row["t"])
        pending = {
            r["id"]: roll_from(r["status"], r["start_ns"], r["end_ns"], r["rolled"]) for r in its
        }
        end = packable_end(newest, list(pending.values()))
        got = await store.fetchone(_HOST_PACKED_SQL, (HOST.packed(boot),))
        start = 0 if got is None or got["b"] is None else int(got["b"]) + 1
        done += await _pack_key(store, HOST, boot, start, end, max_blocks - done)
        for r in its:
            end = packable_end(newest, [pending[r["id"]]])
            start = 0 if r["packed"] is None else int(r["packed"]) + 1
            done += await _pack_key(store, RUN_CPU, r["id"], start, end, max_blocks - done)
    if done:
        log.debug("%d block(s) of samples packed", done)
    return done
