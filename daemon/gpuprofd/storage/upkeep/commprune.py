"""Retention of per-bucket comm rows: each run's recent steps, and every Nth.

Under DDP every synchronizing step stores one ``comm_steps`` row holding its
gradient buckets packed (:mod:`gpuprofd.storage.commpack`): a day of 500 ms
steps is 172,800 rows per rank (with 280 buckets ~48 M bucket rows). What
reads them: the group rules, over a group's last
:data:`gpuprofd.storage.reads.GROUP_STEPS_MAX` common steps, and the run's bucket
counts and bytes per step (means over the steps that have rows). So per run
the daemon keeps

* the **recent window**: the steps whose index is within
  :data:`COMM_STEPS_KEPT` of the run's latest step (by time; the step index
  the shim sends, so ``latest - COMM_STEPS_KEPT < step <= latest``), which
  holds the group rules' window whether the run is running or ended;
* **every** :data:`COMM_KEEP_EVERY`-th **step** (``step % N == 0``) forever,
  for history;

and deletes the other steps' rows as they leave the window. The exposed comm of
every step stays in its ``steps.phases`` (``comm``): ``gpuprofctl runs``'
COMM%, the summary's Comm line and the per-run rules do not need the buckets.

Deletes run in the daemon's periodic pruning (with the raw GPU samples),
through the store's writer, in passes of at most :data:`MAX_ROWS_PER_PASS`
step rows: each pass is one statement on the table's key, committed on its
own, so a crash leaves every row either kept or deleted, and the writer is held for
a bounded time. Where a run's pruning has got to is kept in memory only; a
restarted daemon finds it again from the rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gpuprofd.storage.reads import GROUP_STEPS_MAX
from gpuprofd.storage.writes import Store

log = logging.getLogger(__name__)

#: Steps at the end of each run whose bucket rows are kept: the group rules'
#: window (gpuprofd.storage.reads.GROUP_STEPS_MAX, the last 2,000 common steps).
COMM_STEPS_KEPT = GROUP_STEPS_MAX
#: ... and every this-many-th step's rows, forever: a 500 ms-step day keeps
#: 1,728 such steps (1 %), enough to see how the buckets behaved hours ago.
COMM_KEEP_EVERY = 100
#: Most step rows one pass deletes (~2 MB of packed rows).
MAX_ROWS_PER_PASS = 2_000
#: Most passes per pruning round (the next round takes the rest): 200 k steps,
#: two hundred times what 8 ranks at 2 steps/s add in a minute.
MAX_PASSES_PER_ROUND = 100

_RUNS_SQL = (
    "SELECT id, status FROM runs WHERE EXISTS (SELECT 1 FROM comm_steps c "
    "WHERE c.run_id = runs.id) ORDER BY id"
)
_LATEST_SQL = "SELECT step FROM steps WHERE run_id = ? ORDER BY t0_ns DESC LIMIT 1"
_FIRST_SQL = "SELECT MIN(step) FROM comm_steps WHERE run_id = ?"
#: Where a pass ends: the step of the row after the first *max_rows* prunable
#: rows from the run's watermark (none: fewer are left before the window).
_PASS_END_SQL = (
    "SELECT step FROM comm_steps WHERE run_id = ? AND step >= ? AND step < ? "
    "AND step % ? != 0 ORDER BY step LIMIT 1 OFFSET ?"
)
_DELETE_SQL = "DELETE FROM comm_steps WHERE run_id = ? AND step >= ? AND step < ? AND step % ? != 0"


@dataclass
class CommPruner:
    """Prunes ``comm_steps`` (see the module doc); holds each run's progress."""

    steps_kept: int = COMM_STEPS_KEPT
    keep_every: int = COMM_KEEP_EVERY
    max_rows: int = MAX_ROWS_PER_PASS
    done_below: dict[int, int] = field(default_factory=dict)
    """Run id -> a step index below which its prunable rows are gone."""
    finished: set[int] = field(default_factory=set)
    """Ended runs with nothing left to prune (not looked at again)."""

    def __post_init__(self) -> None:
        if self.steps_kept < 1 or self.keep_every < 1 or self.max_rows < 1:
            raise ValueError("steps_kept, keep_every and max_rows must be >= 1")

    async def prune_pass(self, store: Store) -> bool:
        """Delete at most :attr:`max_rows` rows of one run; False when no
        run had anything to prune."""
        for row in await store.fetchall(_RUNS_SQL):
            run_id, running = int(row["id"]), row["status"] == "running"
            if run_id in self.finished and not running:
                continue
            self.finished.discard(run_id)
            latest = await store.fetchone(_LATEST_SQL, (run_id,))
            if latest is None or latest["step"] is None:
                continue
            cut = int(latest["step"]) - self.steps_kept + 1  # steps >= cut: the window
            start = self.done_below.get(run_id)
            if start is None:
                first = await store.fetchone(_FIRST_SQL, (run_id,))
                start = int(first[0]) if first is not None and first[0] is not None else cut
            if start >= cut:
                self.done_below[run_id] = start
                if not running:
                    self.finished.add(run_id)
                continue
            nxt = await store.fetchone(
                _PASS_END_SQL, (run_id, start, cut, self.keep_every, self.max_rows)
            )
            # a step with more rows than max_rows (none: the protocol caps them) goes whole
            end = cut if nxt is None else max(int(nxt["step"]), start + 1)
            await store.write(_DELETE_SQL, (run_id, start, end, self.keep_every))
            self.done_below[run_id] = end
            return True
        return False

    async def prune_round(self, store: Store, max_passes: int = MAX_PASSES_PER_ROUND) -> int:
        """Passes until nothing is left or *max_passes* ran; returns the passes run."""
        n = 0
        while n < max_passes and await self.prune_pass(store):
            n += 1
        return n
