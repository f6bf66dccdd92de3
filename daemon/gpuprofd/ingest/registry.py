"""The live runs this daemon is tracking, by run key (in memory)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LiveRun:
    """A running run's in-memory state."""

    run_id: int
    run_key: str
    run_name: str
    pid: int | None
    start_wall_ns: int | None
    start_mono_ns: int | None
    cuda_uuid: str | None = None
    received: int = 0
    """Valid data events received for this run (steps and marks)."""
    steps: int = 0
    """Step events received."""
    store_dropped: int = 0
    """Events the daemon received but could not store: not queued (busy) or
    refused by the database (:attr:`store_refused`)."""
    store_refused: int = 0
    """Of :attr:`store_dropped`, those the database refused (a full disk)."""
    store_error: str | None = None
    """Why the database last refused one of them (its error), None when it
    refused none."""
    persisted_received: int = 0
    last_t1_ns: int | None = None
    last_step: dict[str, Any] | None = None
    """The newest ``step`` message received (for ``/metrics``), None before one."""
    local_pid: bool = True
    """``pid`` is in this daemon's PID namespace; if not (a container), liveness
    is judged by silence instead of by the pid."""
    last_event_mono_ns: int = field(default_factory=time.monotonic_ns)
    ending: bool = False
    """A bye or the lost check is finalizing this run."""
    notes: list[str] = field(default_factory=list)
    """Told in the run's summary at its end (e.g. its database file was replaced)."""
    seq: int = 0
    """The highest shim sequence number stored for the run (``batch``'s ``seq``)."""
    helloed: bool = False
    """The run said hello to this daemon: only then are its numbered messages
    stored (before, a new daemon would take them out of order: they are resent)."""
    _arrivals: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def note_event(self, msg: dict[str, Any]) -> None:
        """Count one received event and wake anyone waiting in :meth:`wait_received`."""
        self.received += 1
        self.last_event_mono_ns = time.monotonic_ns()
        if msg["type"] == "step":
            self.steps += 1
            self.last_t1_ns = max(self.last_t1_ns or 0, msg["t1"])
            self.last_step = msg
        self._arrivals.set()

    async def wait_received(self, target: int, timeout_s: float) -> bool:
        """Wait until :attr:`received` ≥ *target* or *timeout_s* passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.received < target:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._arrivals.clear()
            try:
                await asyncio.wait_for(self._arrivals.wait(), remaining)
            except TimeoutError:
                return self.received >= target
        return True

    def as_ping(self) -> dict[str, Any]:
        """This run as ``ping`` lists it."""
        return {
            "run_id": self.run_id,
            "run_name": self.run_name,
            "pid": self.pid,
            "steps": self.steps,
        }


#: How long after a run's end its DataLoader workers' last stack counts are
#: still stored (s): a worker sends its last second's counts as it exits, and
#: the loader of a loop's last epoch shuts its workers down after the loop
#: (seen on the demo: ~0.1-1 s after the end, its workers busy augmenting).
LATE_LOADER_STACKS_S = 30.0


class RunRegistry:
    """Live runs by key, plus a bounded memory of keys known to be unknown
    and of the runs that ended lately (:meth:`ended_run_id`)."""

    NEGATIVE_CACHE_SIZE = 1024

    def __init__(self) -> None:
        self.live: dict[str, LiveRun] = {}
        self._unknown: dict[str, str] = {}
        self._ended: dict[str, tuple[int, float]] = {}

    def get(self, run_key: str) -> LiveRun | None:
        return self.live.get(run_key)

    def add(self, run: LiveRun) -> None:
        self.live[run.run_key] = run
        self._unknown.pop(run.run_key, None)

    def pids(self) -> dict[int, int]:
        """run id → pid of every live run whose pid is in our namespace."""
        return {r.run_id: r.pid for r in self.live.values() if r.pid and r.local_pid}

    def remove(self, run_key: str) -> LiveRun | None:
        return self.live.pop(run_key, None)

    def unknown_reason(self, run_key: str) -> str | None:
        """Why events for *run_key* are dropped (``unknown_run`` or
        ``run_ended``), if a lookup already decided; None if not known yet."""
        return self._unknown.get(run_key)

    def end(self, run: LiveRun) -> None:
        """*run* ended: no longer live; its late events dropped as
        ``run_ended``, but for :meth:`ended_run_id`'s while."""
        self.remove(run.run_key)
        self.mark_unknown(run.run_key, "run_ended")
        self._ended[run.run_key] = (run.run_id, time.monotonic())
        while len(self._ended) > self.NEGATIVE_CACHE_SIZE:
            self._ended.pop(next(iter(self._ended)))

    def ended_run_id(self, run_key: str) -> int | None:
        """The id of the run of *run_key* if it ended in this daemon within
        :data:`LATE_LOADER_STACKS_S`; else None."""
        got = self._ended.get(run_key)
        if got is None or time.monotonic() - got[1] > LATE_LOADER_STACKS_S:
            return None
        return got[0]

    def mark_unknown(self, run_key: str, reason: str = "unknown_run") -> None:
        self._unknown[run_key] = reason
        while len(self._unknown) > self.NEGATIVE_CACHE_SIZE:
            self._unknown.pop(next(iter(self._unknown)))
