"""Ingest batches that arrive together, applied together (group commit).

A replica taking a batch a second from each of a thousand nodes would
spend most of its time on the fixed costs of a transaction (its round trips
to the database, one bulk insert per table, one ``NOTIFY``) if each batch
had its own. :class:`IngestGroups` keeps at most :attr:`IngestGroups.max_inflight`
transactions going; batches that arrive while they all run wait and go
together into the next (:func:`gpuprofd.storage.writes.ingest.apply_batches`:
each batch still all or nothing, a bad one refused alone). Under a light
load a batch goes at once, alone; under a heavy one the groups grow, and
with them what one transaction carries.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from typing import Any

from gpuprofd.storage.writes import Applied, Store, pgbulk
from gpuprofd.storage.writes.ingest import apply_batches

#: Transactions in flight at once on Postgres: the replica's pool
#: (``gpuprofd.server.serve.POOL_SIZE``, 8) less the connections its reads,
#: writer and background jobs need. SQLite has one writer: one at a time.
POSTGRES_INFLIGHT = 4
#: Rows one group carries at most: a catching-up node's batch (up to
#: ``MAX_BATCH_ROWS``, 100,000) goes alone; a second of 1,000 8-GPU nodes
#: (~89 rows each) is ~4 groups' worth, so groups stay short transactions.
MAX_GROUP_ROWS = 20_000


def batch_rows(batch: Mapping[str, Any]) -> int:
    """Rows and events of a validated batch: what its group is bounded by."""
    return sum(len(ev.get("rows") or ()) + 1 for ev in batch["events"])


#: A waiting batch: itself, its rows, its answer.
_Item = tuple[Mapping[str, Any], int, "asyncio.Future[Applied]"]


class IngestGroups:
    """The one way a server applies ingest batches (see the module doc)."""

    def __init__(
        self, store: Store, max_inflight: int | None = None, max_rows: int = MAX_GROUP_ROWS
    ) -> None:
        self.store = store
        self.max_inflight = max_inflight or (
            POSTGRES_INFLIGHT if store.dialect.name == "postgres" else 1
        )
        self.max_rows = max_rows
        self._waiting: collections.deque[_Item] = collections.deque()
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: the GPUs this replica stored (Postgres: their upsert is left out after)
        self.gpus = pgbulk.StoredGpus() if store.dialect.name == "postgres" else None
        self.groups = 0
        """Transactions started (tests and benchmarks read it)."""
        self.batches = 0
        """Batches applied or refused."""

    async def apply(self, batch: Mapping[str, Any]) -> Applied:
        """Apply one validated batch, with whatever arrived beside it.

        Raises:
            What :func:`gpuprofd.storage.writes.ingest.apply_batch` raises for
            this batch (nothing of it was stored).
        """
        fut: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        self._waiting.append((batch, batch_rows(batch), fut))
        self._start()
        return await fut

    def _start(self) -> None:
        while self._waiting and self._inflight < self.max_inflight:
            group: list[_Item] = []
            rows = 0
            while self._waiting and (not group or rows + self._waiting[0][1] <= self.max_rows):
                item = self._waiting.popleft()
                group.append(item)
                rows += item[1]
            self._inflight += 1
            self.groups += 1
            task = asyncio.create_task(self._run(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, group: list[_Item]) -> None:
        try:
            results = await apply_batches(self.store, [b for b, _, _ in group], self.gpus)
            for (_, _, fut), result in zip(group, results, strict=True):
                if fut.done():  # its request went away: stored all the same
                    continue
                if isinstance(result, Exception):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
        except BaseException as exc:  # cancelled (shutdown): every batch's answer says so
            for _, _, fut in group:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            self.batches += len(group)
            self._inflight -= 1
            self._start()
