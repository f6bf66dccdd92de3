"""Tell gpuprofd which processes are a DataLoader's workers (the ``workers`` event).

gpuprofd measures each worker's CPU (psutil, by pid); only the training
process knows which of its children are DataLoader workers (torch.compile's
worker pool and ``subprocess`` children are not). When a loader iterator
that runs worker processes is created (each epoch, unless
``persistent_workers=True`` keeps one pool for the whole run), its workers'
pids are sent once, numbered by a per-process ``loader_seq`` so each pool is
its own group. Reading the pids costs a few attribute reads per epoch; the
send never blocks (see :mod:`gpuprof_shim.sender`), and nothing here raises.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from gpuprof.protocol import MAX_PID, MAX_WORKERS
from gpuprof_shim import messages

log = logging.getLogger("gpuprof.shim")


def worker_pids(it: object) -> list[tuple[int, int]]:
    """``(worker_id, pid)`` of the started workers of *it*, a torch
    ``_MultiProcessingDataLoaderIter`` (worker_id is the index torch gives the
    worker: ``get_worker_info().id``); empty for any other iterator. Never
    imports torch: an iterator of that class means torch is loaded already."""
    mod = sys.modules.get("torch.utils.data.dataloader")
    cls = getattr(mod, "_MultiProcessingDataLoaderIter", None)
    if cls is None or not isinstance(it, cls):
        return []
    procs = getattr(it, "_workers", None)
    if not isinstance(procs, list):
        return []
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for worker_id, proc in enumerate(procs[:MAX_WORKERS]):
        pid = getattr(proc, "pid", None)  # None: not started
        if type(pid) is int and 0 < pid <= MAX_PID and pid not in seen:
            seen.add(pid)
            out.append((worker_id, pid))
    return out


class WorkerReporter:
    """Sends one ``workers`` event per new worker pool of a loader iterator.

    A persistent-workers loader hands back the same iterator (and pool) every
    epoch: a pool already sent for that iterator is not sent again.

    Args:
        run_key: the run the events belong to.
        send: the sender's non-blocking ``send`` (True if queued).
        clock: monotonic nanoseconds.
        getpid: ``os.getpid``, injected for tests that simulate a fork.
    """

    def __init__(
        self,
        run_key: str,
        send: Callable[[dict[str, Any]], bool],
        clock: Callable[[], int],
        getpid: Callable[[], int] = os.getpid,
    ) -> None:
        self.run_key = run_key
        self._send = send
        self._clock = clock
        self._getpid = getpid
        self._pid = getpid()
        self._seq = itertools.count()  # next() is atomic under the GIL
        self._sent: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()
        self.groups = 0
        """Worker pools reported (events handed to the sender)."""
        self.errors = 0
        """Iterators whose workers could not be read or sent (internal errors)."""

    def on_iterator(self, it: object) -> None:
        """Report *it*'s worker pool if it has one not reported yet; never raises."""
        try:
            if self._getpid() != self._pid:
                return  # a fork child (a worker iterating its own loader): not the run's pool
            pids = worker_pids(it)
            if not pids:
                return
            pool = tuple(pid for _, pid in pids)
            if self._sent.get(it) == pool:
                return  # persistent workers: the same pool as the last epoch
            self._sent[it] = pool
            self.groups += 1
            self._send(messages.workers(self.run_key, next(self._seq), pids, self._clock()))
        except Exception:
            self.errors += 1
            log.debug("gpuprof: could not report DataLoader workers", exc_info=True)
