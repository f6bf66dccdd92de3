"""Host sampler: CPU use (all cores and per core), disk reads (bytes/s and
IOPS), page cache and RAM size, swap-in rate, the CPU each live run's
process tree (the training process and its DataLoader workers) uses, and
the CPU seconds of each DataLoader worker the shim reported, every 0.5 s,
via psutil.

psutil calls run in a worker thread (``asyncio.to_thread``) so the event loop
never blocks on ``/proc``. psutil and the clock are injected for tests.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil as _psutil

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5
#: A process that exited, or one we may not read: skipped, not an error.
#: (``ZombieProcess``, exited but not yet reaped, is a ``NoSuchProcess``.)
_GONE = (_psutil.NoSuchProcess, _psutil.AccessDenied)
#: DataLoader worker processes followed at once, over all runs: 8 ranks × 2
#: loaders × 64 workers is 1024; reports beyond this are dropped (counted).
MAX_TRACKED_WORKERS = 4096
#: Worker pools reported but not yet looked at (drained every tick, 0.5 s).
MAX_PENDING_POOLS = 1024
#: ... and their workers in all: each costs a psutil look-up (~25 µs for a pid
#: that names nothing), so 1024 pools of 1024 would stall a tick for 25 s.
MAX_PENDING_WORKERS = MAX_TRACKED_WORKERS
#: psutil's ``create_time`` is boot time + start ticks (10 ms) in wall-clock
#: seconds, and the wall clock may be stepped: a process created more than
#: this long after its pid was reported is a later process reusing the pid.
CREATE_TIME_SLACK_S = 1.0


@dataclass(frozen=True)
class HostSample:
    """One host reading. A reading the platform does not offer is None, never 0."""

    mono_ns: int
    cpu_pct: float
    """Mean CPU use over all cores since the previous sample, 0-100 %."""
    cpu_count: int
    disk_read_bps: float | None
    """Disk bytes read per second since the previous sample; None if unknown."""
    run_cpu_cores: Mapping[int, float] = field(default_factory=dict)
    """run id → CPU cores (1.0 = one core busy) its process tree used since the
    previous sample; processes first seen in this sample count from the next."""
    per_core_pct: tuple[float, ...] = ()
    """CPU use of each core since the previous sample, 0-100 % each."""
    disk_read_iops: float | None = None
    """Disk read operations per second (IOPS) since the previous sample."""
    page_cache_bytes: int | None = None
    """Page-cache size now, bytes (``virtual_memory().cached``; None on macOS
    and Windows, which do not report it)."""
    mem_total_bytes: int | None = None
    """Total physical RAM, bytes."""
    swap_in_bps: float | None = None
    """Bytes swapped in from disk per second since the previous sample
    (``swap_memory().sin``); None where unsupported (Windows reports 0 always)."""
    worker_cpu: tuple[WorkerCpuReading, ...] = ()
    """DataLoader workers whose CPU seconds are new or grew since the previous sample."""


@dataclass(frozen=True)
class WorkerCpuReading:
    """One DataLoader worker's CPU use so far (a ``worker_cpu`` row)."""

    run_id: int
    loader_seq: int
    """The training process's number for the worker pool (one loader iterator)."""
    worker_id: int
    """torch's id of the worker in its pool (``get_worker_info().id``)."""
    pid: int
    first_mono_ns: int
    """When the training process saw the pool started (its ``workers`` event)."""
    last_mono_ns: int
    """When :attr:`cpu_s` was read."""
    cpu_s: float
    """User + system CPU seconds the worker process used since it started."""
    ctx_voluntary: int | None = None
    """Context switches since it started where it gave up the CPU (slept,
    blocked on I/O or a queue); None where the platform does not say."""
    ctx_involuntary: int | None = None
    """... where it was preempted while it wanted the CPU: many of these
    mean a worker starved of CPU, not one waiting on something."""


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


class ProcessTreeCpu:
    """CPU use of each training process plus its descendants, in cores.

    Counts cumulative CPU seconds, not ``cpu_percent``: per run, the sum over
    the live tree of each process's user + system time **plus** the time of
    the children it has reaped (``children_user``/``children_system``: the
    kernel adds a waited-for child's whole time to its parent). A DataLoader
    worker that lives half an epoch, or exits between two samples, is then
    counted in full: psutil's ``cpu_percent`` reads 0 on a process's first
    call and loses whatever a process did after the last call before it
    exited, which undercounted respawning workers by most of their CPU.
    The first sample of a run only records its total.
    """

    def __init__(
        self, psutil: ModuleType | Any = _psutil, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self._ps = psutil
        self._clock = clock
        self._roots: dict[int, Any] = {}
        self._last: dict[int, tuple[int, float]] = {}  # run id -> (mono ns, CPU s)

    def _tree(self, pid: int) -> list[Any]:
        root = self._roots.get(pid)
        if root is None or not root.is_running():  # new, or the pid was reused
            root = self._roots[pid] = self._ps.Process(pid)
        return [root, *root.children(recursive=True)]

    @staticmethod
    def _cpu_s(proc: Any) -> float:
        t = proc.cpu_times()
        return float(
            t.user
            + t.system
            + getattr(t, "children_user", 0.0)
            + getattr(t, "children_system", 0.0)
        )

    def sample(self, pids: Mapping[int, int], now_ns: int | None = None) -> dict[int, float]:
        """Cores used per run id since the previous call; *pids* maps run id →
        pid, *now_ns* is the sample's monotonic time (default: the clock). A
        run seen for the first time, or whose process is gone or not ours to
        read, is left out."""
        now = self._clock() if now_ns is None else now_ns
        out: dict[int, float] = {}
        for run_id, pid in pids.items():
            try:
                tree = self._tree(pid)
            except _GONE:
                self._roots.pop(pid, None)
                self._last.pop(run_id, None)
                continue
            total = 0.0
            for proc in tree:
                try:
                    total += self._cpu_s(proc)
                except _GONE:
                    continue  # exited between listing and reading: its parent reaps it
            last = self._last.get(run_id)
            self._last[run_id] = (now, total)
            if last is not None and now > last[0]:
                # a descendant reaped outside the tree takes its time along: never < 0
                out[run_id] = max(0.0, total - last[1]) / ((now - last[0]) / 1e9)
        for run_id in set(self._last) - set(pids):
            del self._last[run_id]
        for pid in set(self._roots) - set(pids.values()):
            del self._roots[pid]
        return out


@dataclass
class _Worker:
    proc: Any
    run_id: int
    loader_seq: int
    worker_id: int
    first_mono_ns: int
    cpu_s: float | None = None
    """Last value reported; None before the first reading."""


class WorkerCpu:
    """CPU seconds of each DataLoader worker the shims reported.

    :meth:`add` (on the event loop) queues a reported pool; :meth:`sample` (in
    the sampler's thread) looks at new pools and reads every followed worker.
    One ``psutil.Process`` is kept per worker: its ``cpu_times()`` are
    cumulative since the process started (no priming, unlike
    ``cpu_percent``), and its creation time tells a reused pid apart from
    the worker (checked on first sight against the report's arrival, later by
    ``is_running``). Workers that exited, can't be read or belong to a run
    that ended are forgotten. Each epoch's new pool is followed as it comes.

    Args:
        psutil: the psutil module (injected for tests).
        wall_clock: wall-clock seconds (``time.time``), compared with ``create_time``.
    """

    def __init__(
        self, psutil: ModuleType | Any = _psutil, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self._ps = psutil
        self._wall = wall_clock
        #: (run id, loader_seq, ((worker_id, pid), ...), shim's t_ns, arrival wall s)
        self._pending: deque[tuple[int, int, tuple[tuple[int, int], ...], int, float]] = deque()
        self._followed: dict[tuple[int, int, int], _Worker] = {}  # (run id, pid, loader_seq)
        self._pending_lock = threading.Lock()
        self._pending_workers = 0
        self.dropped = 0
        """Workers not followed because the limits were reached."""

    def add(self, run_id: int, msg: Mapping[str, Any]) -> None:
        """Queue a validated ``workers`` message of *run_id* (whose pids are in
        this daemon's PID namespace). Safe to call while :meth:`sample` runs."""
        pool = tuple((w["worker_id"], w["pid"]) for w in msg["workers"])
        with self._pending_lock:
            if (
                len(self._pending) >= MAX_PENDING_POOLS
                or self._pending_workers + len(pool) > MAX_PENDING_WORKERS
            ):
                self.dropped += len(pool)
                return
            self._pending_workers += len(pool)
            self._pending.append((run_id, msg["loader_seq"], pool, msg["t_ns"], self._wall()))

    @property
    def followed(self) -> int:
        """Worker processes followed now."""
        return len(self._followed)

    def _take_pending(self, run_pids: Mapping[int, int]) -> None:
        while self._pending:
            with self._pending_lock:
                run_id, seq, pool, t_ns, arrived_s = self._pending.popleft()
                self._pending_workers -= len(pool)
            for worker_id, pid in pool:
                key = (run_id, pid, seq)
                if key in self._followed or run_id not in run_pids:
                    continue
                if len(self._followed) >= MAX_TRACKED_WORKERS:
                    self.dropped += 1
                    continue
                try:
                    proc = self._ps.Process(pid)
                    if proc.create_time() > arrived_s + CREATE_TIME_SLACK_S:
                        continue  # the worker exited and its pid was reused already
                    if run_pids[run_id] not in {p.pid for p in proc.parents()}:
                        continue  # not the run's: itself, the daemon, another user's process
                except _GONE:
                    continue  # exited before the first look (a very short epoch)
                self._followed[key] = _Worker(proc, run_id, seq, worker_id, t_ns)

    def sample(self, run_pids: Mapping[int, int], now_ns: int) -> list[WorkerCpuReading]:
        """Read every followed worker; return those whose CPU seconds are new
        or changed (blocking: run in a thread). *run_pids* maps each live run
        to its training process's pid: a reported pid is followed only if it
        descends from that process (DataLoader workers are its children, or
        its forkserver's); workers of runs not in it are forgotten."""
        self._take_pending(run_pids)
        out: list[WorkerCpuReading] = []
        for key, w in list(self._followed.items()):
            if w.run_id not in run_pids:
                del self._followed[key]
                continue
            try:
                # not running: exited, or its pid now names another process
                times = w.proc.cpu_times() if w.proc.is_running() else None
            except _GONE:
                times = None
            if times is None:
                del self._followed[key]
                continue
            cpu_s = float(times.user + times.system)
            if cpu_s == w.cpu_s:
                continue
            w.cpu_s = cpu_s
            vol, invol = _switches(w.proc)
            out.append(
                WorkerCpuReading(
                    w.run_id,
                    w.loader_seq,
                    w.worker_id,
                    key[1],
                    w.first_mono_ns,
                    now_ns,
                    cpu_s,
                    vol,
                    invol,
                )
            )
        return out


def _switches(proc: Any) -> tuple[int | None, int | None]:
    """(voluntary, involuntary) context switches of *proc* since it started;
    (None, None) where not offered or the process is gone."""
    try:
        c = proc.num_ctx_switches()
    except (*_GONE, AttributeError, NotImplementedError, OSError):
        return None, None
    return _int_or_none(getattr(c, "voluntary", None)), _int_or_none(
        getattr(c, "involuntary", None)
    )


class HostSampler:
    """Turns psutil's cumulative counters into per-interval rates.

    The first :meth:`sample` call only primes the counters (psutil's first
    ``cpu_percent`` is a meaningless 0) and returns None.
    """

    def __init__(
        self,
        psutil: ModuleType | Any = _psutil,
        clock: Callable[[], int] = time.monotonic_ns,
        run_pids: Callable[[], Mapping[int, int]] = dict,
    ) -> None:
        self._ps = psutil
        self._clock = clock
        self._run_pids = run_pids
        """run id → pid of the live runs; read on the event loop, never in the thread."""
        self._trees = ProcessTreeCpu(psutil)
        self.workers = WorkerCpu(psutil)
        """The DataLoader workers followed; ingest adds the reported pools."""
        self._primed = False
        self._last: dict[str, int | None] = {}
        self._last_ns: int | None = None

    def _counters(self) -> dict[str, int | None]:
        """The cumulative counters rates are taken of: disk bytes and operations
        read, bytes swapped in. None: not offered here, or the read failed."""
        out: dict[str, int | None] = {"read_bytes": None, "read_count": None, "swap_in": None}
        try:
            io = self._ps.disk_io_counters()
        except (OSError, RuntimeError):
            io = None
        if io is not None:
            out["read_bytes"] = _int_or_none(getattr(io, "read_bytes", None))
            out["read_count"] = _int_or_none(getattr(io, "read_count", None))
        if not getattr(self._ps, "WINDOWS", False):  # psutil: sin is always 0 on Windows
            try:
                out["swap_in"] = _int_or_none(getattr(self._ps.swap_memory(), "sin", None))
            except (OSError, RuntimeError):
                pass
        return out

    def _memory(self) -> tuple[int | None, int | None]:
        """(page-cache bytes, total RAM bytes); None where not offered."""
        try:
            vm = self._ps.virtual_memory()
        except (OSError, RuntimeError):
            return None, None
        return _int_or_none(getattr(vm, "cached", None)), _int_or_none(getattr(vm, "total", None))

    def _rates(self, counters: dict[str, int | None], now: int) -> dict[str, float | None]:
        """Per-second rate of each counter since the previous call (None
        without two readings; a counter that went backwards reads 0)."""
        last, last_ns = self._last, self._last_ns
        self._last, self._last_ns = counters, now
        out: dict[str, float | None] = {}
        for name, value in counters.items():
            prev = last.get(name)
            if value is None or prev is None or last_ns is None or now <= last_ns:
                out[name] = None
            else:
                out[name] = max(value - prev, 0) / ((now - last_ns) / 1e9)
        return out

    def sample(self, run_pids: Mapping[int, int] | None = None) -> HostSample | None:
        """Read the counters; None on the priming call (blocking: run in a thread).

        Args:
            run_pids: run id → pid of the runs whose process-tree CPU to measure.
        """
        now = self._clock()
        run_cores = self._trees.sample(run_pids or {}, now)
        per_cpu = [float(p) for p in self._ps.cpu_percent(percpu=True)]
        rates = self._rates(self._counters(), now)
        if not self._primed:
            self._primed = True
            return None
        cache, total = self._memory()
        workers = self.workers.sample(run_pids or {}, now)
        return HostSample(
            mono_ns=now,
            cpu_pct=sum(per_cpu) / len(per_cpu) if per_cpu else 0.0,
            cpu_count=len(per_cpu) or (self._ps.cpu_count() or 0),
            disk_read_bps=rates["read_bytes"],
            run_cpu_cores=run_cores,
            per_core_pct=tuple(per_cpu),
            disk_read_iops=rates["read_count"],
            page_cache_bytes=cache,
            mem_total_bytes=total,
            swap_in_bps=rates["swap_in"],
            worker_cpu=tuple(workers),
        )

    async def run(
        self, sink: Callable[[HostSample], None], interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        """Sample every *interval_s* seconds until cancelled, passing each to *sink*."""
        while True:
            try:
                sample = await asyncio.to_thread(self.sample, dict(self._run_pids()))
            except Exception:  # noqa: BLE001 - a sampler hiccup must not stop sampling
                log.exception("host sample failed")
                sample = None
            if sample is not None:
                sink(sample)
            await asyncio.sleep(interval_s)
