"""Upkeep: the passes that keep a gpuprof database small and its tiers
filled, and the loop they run in.

This package's names are its face; callers import them from here:

- :func:`every` (the one loop every periodic pass runs in) and
  :class:`Retention` (the node daemon's passes, with how often they run):
  :mod:`~gpuprofd.storage.upkeep.maintenance`;
- pruning: raw GPU rows past the raw window (ops of
  :mod:`gpuprofd.storage.writes.runsdb`), per-bucket comm rows outside each
  run's kept steps (:mod:`~gpuprofd.storage.upkeep.commprune`);
- compaction: continuous kernel windows merged as they age
  (:mod:`~gpuprofd.storage.upkeep.kcompact`), a run's older steps packed per
  block (:mod:`~gpuprofd.storage.upkeep.steppack`);
- rollups: the step and host tiers the whole-run charts read
  (:mod:`~gpuprofd.storage.upkeep.steprollup`,
  :mod:`~gpuprofd.storage.upkeep.hostrollup`; each also says how its rows
  are read back);
- retention: a team server's ``--keep-days``
  (:mod:`~gpuprofd.storage.upkeep.retention`);
- rotation: live runs carried over to a new database file when the old one
  is deleted or replaced (:mod:`~gpuprofd.storage.upkeep.dbrotate`).
"""

from __future__ import annotations

from gpuprofd.storage.upkeep import (
    commprune,
    dbrotate,
    hostrollup,
    kcompact,
    retention,
    steppack,
    steprollup,
)
from gpuprofd.storage.upkeep.commprune import COMM_KEEP_EVERY, COMM_STEPS_KEPT, CommPruner
from gpuprofd.storage.upkeep.maintenance import (
    DEFAULT_RAW_WINDOW_S,
    PRUNE_INTERVAL_S,
    Retention,
    every,
)
from gpuprofd.storage.upkeep.retention import apply_retention

__all__ = [
    "COMM_KEEP_EVERY",
    "COMM_STEPS_KEPT",
    "DEFAULT_RAW_WINDOW_S",
    "PRUNE_INTERVAL_S",
    "CommPruner",
    "Retention",
    "apply_retention",
    "commprune",
    "dbrotate",
    "every",
    "hostrollup",
    "kcompact",
    "retention",
    "steppack",
    "steprollup",
]
