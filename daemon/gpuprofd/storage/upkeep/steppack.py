"""Packing of a run's older steps: per block of
:data:`~gpuprofd.storage.reads.steprows.STEP_PACK` step indices one
``step_packs`` row (:mod:`gpuprofd.storage.stepcodec`: columnar, compressed,
lossless) instead of ~1,000 ``steps`` rows and their two index entries.

A ``steps`` row costs ~164 bytes with its indexes: a day of 500 ms steps is
~28 MB per rank (1.18 MB per GPU-hour); packed, a step costs ~1-30 bytes. The
reads are :mod:`gpuprofd.storage.reads.steprows`' (every reader of steps).

Per run the pass keeps as rows:

* the steps whose index is within :data:`STEPS_RAW_KEPT` of the run's latest
  (the window the group rules, the history rule and the live charts read
  by index, running or ended);
* the blocks the step rollup pass has not written into both ``step_rollups``
  and ``step_totals`` yet (their SQL reads rows);

and packs the other blocks oldest first, one block per transaction (read,
insert packed, delete: a crash leaves the block whole either way; a replica
that packed it first wins by the key, the other deletes nothing), at most
:data:`MAX_BLOCKS_PER_ROUND` blocks a round, so the writer is held briefly.
A step stored for a block after it was packed stays a row (read beside it);
a block holding a row whose ``phases`` is not JSON stays rows (logged).
"""

from __future__ import annotations

import logging
from typing import Any

from gpuprof.insights.base import WARMUP_STEPS
from gpuprof.insights.history import HISTORY_STEPS
from gpuprofd.storage.reads import GROUP_STEPS_MAX
from gpuprofd.storage.reads.steprows import STEP_PACK
from gpuprofd.storage.reads.steptotals import STEP_BLOCK
from gpuprofd.storage.stepcodec import COLUMNS, encode
from gpuprofd.storage.writes import Store
from gpuprofd.storage.writes.ops import Txn

log = logging.getLogger(__name__)

#: Steps at the end of each run kept as rows: more than the group rules'
#: window and the history rule's (the last 1,000 steps and the warm-up), so
#: those reads find rows by index.
STEPS_RAW_KEPT = max(4000, GROUP_STEPS_MAX, HISTORY_STEPS + WARMUP_STEPS + 1)
#: Most blocks one round packs (~20 ms of the writer each on a 2-core box):
#: 100,000 steps, an 8-rank day's whole backlog in ~14 rounds.
MAX_BLOCKS_PER_ROUND = 100

#: Each run's highest step index stored as a row, its last packed block and
#: the last block of each tier.
_PENDING_SQL = (
    "SELECT r.id AS id, (SELECT MAX(step) FROM steps WHERE run_id = r.id) AS top, "
    "(SELECT MAX(block) FROM step_packs WHERE run_id = r.id) AS packed, "
    "(SELECT MAX(block) FROM step_rollups WHERE run_id = r.id) AS rolled, "
    "(SELECT MAX(block) FROM step_totals WHERE run_id = r.id) AS totalled "
    "FROM runs r ORDER BY r.id"
)
_NEXT_SQL = "SELECT MIN(step) AS s FROM steps WHERE run_id = ? AND step >= ?"
_BLOCK_SQL = (
    f"SELECT {', '.join(COLUMNS)} FROM steps WHERE run_id = ? AND step >= ? AND step < ? "
    "ORDER BY CASE WHEN t0_ns IS NULL THEN 0 ELSE 1 END, t0_ns, rowid"
)
_INSERT_SQL = (
    "INSERT INTO step_packs (run_id, block, n, first_step, last_step, t0_min_ns, t0_max_ns, "
    "t1_max_ns, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, block) DO NOTHING"
)
_DELETE_SQL = "DELETE FROM steps WHERE run_id = ? AND step >= ? AND step < ?"


def packable_end(top: int | None, rolled: int | None, totalled: int | None) -> int:
    """The step index below which a run's blocks may be packed: outside the
    last :data:`STEPS_RAW_KEPT` of its highest index *top* and within both
    tiers' last blocks (*rolled*, *totalled*, in :data:`STEP_BLOCK` s)."""
    if top is None or rolled is None or totalled is None:
        return 0
    end = min(top - STEPS_RAW_KEPT + 1, (min(rolled, totalled) + 1) * STEP_BLOCK)
    return int(max(0, end // STEP_PACK * STEP_PACK))


async def _pack(txn: Txn, run_id: int, block: int) -> int:
    """Pack block *block* of run *run_id* in *txn*; the rows packed."""
    lo, hi = block * STEP_PACK, (block + 1) * STEP_PACK
    rows = [tuple(r) for r in await txn.fetch(_BLOCK_SQL, (run_id, lo, hi))]
    if not rows:
        return 0
    t0s = [r[1] for r in rows if r[1] is not None]
    t1s = [r[2] for r in rows if r[2] is not None]
    steps = [r[0] for r in rows]
    pack: tuple[Any, ...] = (
        run_id,
        block,
        len(rows),
        min(steps),
        max(steps),
        min(t0s, default=None),
        max(t0s, default=None),
        max(t1s, default=None),
        encode(rows),
    )
    if not await txn.execute(_INSERT_SQL, pack):
        return 0  # packed by another replica meanwhile: its rows are gone already
    await txn.execute(_DELETE_SQL, (run_id, lo, hi))
    return len(rows)


async def pack_round(store: Store, max_blocks: int = MAX_BLOCKS_PER_ROUND) -> int:
    """Pack what each run has packable (see the module doc), at most
    *max_blocks* blocks; returns the blocks packed."""
    done = 0
    for r in await store.fetchall(_PENDING_SQL):
        end = packable_end(r["top"], r["rolled"], r["totalled"])
        start = 0 if r["packed"] is None else (int(r["packed"]) + 1) * STEP_PACK
        while done < max_blocks and start < end:
            got = await store.fetchone(_NEXT_SQL, (r["id"], start))
            if got is None or got["s"] is None or int(got["s"]) >= end:
                break
            block = int(got["s"]) // STEP_PACK

            async def pack(txn: Txn, run_id: int = int(r["id"]), b: int = block) -> int:
                return await _pack(txn, run_id, b)

            try:
                await store.transaction(pack, "pack-steps")
            except ValueError as exc:  # a row's phases not JSON: the block stays rows
                log.warning("steps of run %s block %d left unpacked: %s", r["id"], block, exc)
            else:
                done += 1
            start = (block + 1) * STEP_PACK
    if done:
        log.debug("%d block(s) of steps packed", done)
    return done
