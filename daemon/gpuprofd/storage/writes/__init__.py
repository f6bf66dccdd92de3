"""The write path: everything that puts rows in a gpuprof database.

This package's names are its face; callers import them from here:

- :class:`Store`: one writer task owns every write (a bounded queue of
  :class:`Op` s, batched into transactions); it also answers reads as a
  :class:`gpuprofd.storage.reader.Reader`;
- :class:`Op`, :class:`Part`, :class:`Forward`, :class:`Txn`,
  :class:`AtomicCheckError`: what a writer hands the store;
- :mod:`~gpuprofd.storage.writes.runsdb`: the daemon's writes about runs,
  steps, samples and insights, as ops;
- :mod:`~gpuprofd.storage.writes.outbox`: a forwarding node's spool, written
  in the same transaction as what it stores;
- :mod:`~gpuprofd.storage.writes.batch` (the ingest batch a node sends, and
  its check) and :mod:`~gpuprofd.storage.writes.ingest` (a team server
  applying one).
"""

from __future__ import annotations

from gpuprofd.storage.writes import batch, costs, ingest, outbox, runsdb
from gpuprofd.storage.writes.batch import RUN_KINDS, BatchError, validate
from gpuprofd.storage.writes.ingest import NOTIFY_CHANNEL, Applied, IngestConflict, apply_batch
from gpuprofd.storage.writes.ops import AtomicCheckError, Forward, Op, Part, Txn
from gpuprofd.storage.writes.store import BATCH_MAX_OPS, OUTBOX_ROW_BYTES, Store

__all__ = [
    "BATCH_MAX_OPS",
    "NOTIFY_CHANNEL",
    "OUTBOX_ROW_BYTES",
    "RUN_KINDS",
    "Applied",
    "AtomicCheckError",
    "BatchError",
    "Forward",
    "IngestConflict",
    "Op",
    "Part",
    "Store",
    "Txn",
    "apply_batch",
    "batch",
    "costs",
    "ingest",
    "outbox",
    "runsdb",
    "validate",
]
