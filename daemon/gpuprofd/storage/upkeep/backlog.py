"""Packing rounds run until a backlog is gone or a time budget is spent."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from gpuprofd.storage.writes import Store

__all__ = ["pack_backlog"]


async def pack_backlog(
    pack_round: Callable[[Store, int], Awaitable[int]],
    store: Store,
    budget_s: float,
    max_blocks: int,
) -> int:
    """*pack_round* (``steppack.pack_round``, ``samplepack.pack_round``) again
    while a round packs its *max_blocks* (more is waiting) and *budget_s* (s,
    wall) has not passed since the first, which always runs: a team server
    whose nodes send more than one round a period packs catches up instead of
    keeping ever more rows. Returns the blocks packed."""
    start = time.monotonic()
    done = 0
    while True:
        got = await pack_round(store, max_blocks)
        done += got
        if got < max_blocks or time.monotonic() - start >= budget_s:
            return done
