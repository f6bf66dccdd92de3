"""Which of the user's functions the DataLoader workers spend their time in.

While a profile is open, each multi-process DataLoader iterator starts its
workers with a stand-in for the loader's ``worker_init_fn``
(:class:`WorkerInit`): it runs the user's own init function, if any, then
starts a :class:`~gpuprof_shim.stacks.StackSampler` on the worker's loop
thread and sends its counts (aggregated, never raw stacks) as ``stacks``
events of source ``loader`` every :data:`SEND_EVERY_S` and when the worker
exits. A worker is a forked (or spawned) process: the ZeroMQ context of the
training process must not cross the fork, so the worker makes its own
socket, used only from the sampler thread and at exit. Nothing here raises
into the worker: a failure to sample is logged at debug level only.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import os
import sys
import threading
from collections.abc import Callable
from types import CodeType
from typing import Any

from gpuprof.protocol import MAX_STACK_ROWS, encode
from gpuprof_shim import messages
from gpuprof_shim.stacks import FrameKey, StackSampler, wire_rows

log = logging.getLogger("gpuprof.shim")

#: A worker's counts go out this often (s): workers of a short epoch live a
#: few seconds, and their exit sends the rest.
SEND_EVERY_S = 1.0
#: How long a worker's exit waits at most for its last counts to leave (ms).
EXIT_LINGER_MS = 500
#: The sampler of this process (a worker has one; None elsewhere).
_running: _WorkerSampling | None = None
_running_lock = threading.Lock()


class _WorkerSampling:
    """One worker process's sampler and its own PUSH socket."""

    def __init__(self, endpoint: str, run_key: str) -> None:
        import zmq

        self.run_key = run_key
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, 64)
        self._sock.setsockopt(zmq.LINGER, EXIT_LINGER_MS)
        self._sock.connect(endpoint)
        self._noblock = zmq.NOBLOCK
        self.sent = 0
        self.dropped = 0
        self.sampler = StackSampler(
            threading.get_ident(),
            gate=lambda: True,  # a worker loads or waits for work: both are its time
            step=lambda: 0,
            flush=self._send,
            flush_every_s=SEND_EVERY_S,
            stop=_worker_loop_code(),
        )

    def _send(self, counts: dict[FrameKey, int]) -> None:
        rows = wire_rows(counts)
        for k in range(0, len(rows), MAX_STACK_ROWS):
            msg = messages.stacks(self.run_key, "loader", rows[k : k + MAX_STACK_ROWS])
            try:
                self._sock.send(encode(msg), self._noblock)
                self.sent += 1
            except Exception:
                self.dropped += 1

    def start(self) -> None:
        self.sampler.start()
        # multiprocessing runs these as the worker's process ends (not atexit)
        multiprocessing.util.Finalize(self, self.close, exitpriority=10)

    def close(self) -> None:
        """Stop sampling, send what is left, close the socket (waiting at
        most :data:`EXIT_LINGER_MS` for it to leave)."""
        try:
            self.sampler.stop()
        finally:
            self._sock.close()
            self._ctx.term()


def _worker_loop_code() -> tuple[CodeType, ...]:
    """The code of torch's DataLoader worker loop (frames outside it are the
    training process's, inherited through the fork), if torch has one."""
    worker = sys.modules.get("torch.utils.data._utils.worker")
    loop = getattr(worker, "_worker_loop", None)
    code = getattr(loop, "__code__", None)
    return (code,) if isinstance(code, CodeType) else ()


class WorkerInit:
    """The ``worker_init_fn`` a profiled DataLoader's workers start with:
    calls *init_fn* (the loader's own, or None) with the worker id, then
    starts sampling this worker (only in a worker process: *parent_pid* is
    the training process). Picklable when *init_fn* is (``spawn`` workers).

    Args:
        init_fn: the loader's ``worker_init_fn``; its exceptions propagate
            unchanged (torch reports them as the worker's failure).
        endpoint: gpuprofd's ingest ``ipc://`` address.
        run_key: the run the samples belong to.
        parent_pid: the training process's pid.
    """

    def __init__(
        self, init_fn: Callable[[int], Any] | None, endpoint: str, run_key: str, parent_pid: int
    ) -> None:
        self.init_fn = init_fn
        self.endpoint = endpoint
        self.run_key = run_key
        self.parent_pid = parent_pid

    def __call__(self, worker_id: int) -> None:
        if self.init_fn is not None:
            self.init_fn(worker_id)
        start_in_worker(self.endpoint, self.run_key, self.parent_pid)


def start_in_worker(endpoint: str, run_key: str, parent_pid: int) -> bool:
    """Start this worker's sampler (once per process); True if started.
    Never raises; does nothing in the training process itself."""
    global _running
    if os.getpid() == parent_pid:
        return False
    try:
        with _running_lock:
            if _running is not None and _running.run_key == run_key:
                return False
            sampling = _WorkerSampling(endpoint, run_key)
            sampling.start()
            _running = sampling
        return True
    except Exception:
        log.debug("gpuprof: could not sample this DataLoader worker", exc_info=True)
        return False


def _new_state_in_child() -> None:
    """A fork child of a worker (or of the training process) samples nothing
    of its parent's: the parent's sampler thread is not running here."""
    global _running, _running_lock
    _running = None
    _running_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_state_in_child)


class LoaderInits:
    """Gives each multi-process DataLoader iterator :class:`WorkerInit` while
    it starts its workers (:meth:`prepare`, around ``DataLoader.__iter__``),
    then puts the loader's own ``worker_init_fn`` back."""

    def __init__(self, endpoint: str, run_key: str) -> None:
        self.endpoint = endpoint
        self.run_key = run_key
        self.parent_pid = os.getpid()

    def prepare(self, loader: Any) -> Callable[[], None] | None:
        """Swap *loader*'s ``worker_init_fn`` for a :class:`WorkerInit` when
        it runs worker processes; returns the undo (None: nothing swapped)."""
        if not isinstance(getattr(loader, "num_workers", 0), int) or loader.num_workers <= 0:
            return None
        own = loader.worker_init_fn
        if isinstance(own, WorkerInit):
            return None
        loader.worker_init_fn = WorkerInit(own, self.endpoint, self.run_key, self.parent_pid)

        def undo() -> None:
            loader.worker_init_fn = own

        return undo
