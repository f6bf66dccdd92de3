"""Step events go out in bursts: one ``batch`` message per burst of steps.

A ZeroMQ send costs the training thread tens of µs (a syscall to wake
ZeroMQ's I/O thread, more when the daemon shares the cores); one per burst
of :data:`SEND_EVERY_STEPS` steps costs each step well under a µs. A burst
goes out when it is full, when :data:`SEND_EVERY_NS` has passed since the
last one (checked as each step ends), and at exit before ``bye``, so a live
view lags by at most that long plus one step and nothing is left unsent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gpuprof_shim import memory, messages
from gpuprof_shim.comm import CommTimer
from gpuprof_shim.sender import Sender
from gpuprof_shim.steps import StepRecord

log = logging.getLogger("gpuprof.shim")

#: Steps per burst at most: 64 steps are ~16 KiB, far inside the protocol's
#: bounds, and make the send's cost per step negligible.
SEND_EVERY_STEPS = 64
#: A burst goes out once this long (ns) has passed since the last one.
SEND_EVERY_NS = 50_000_000


class StepBatcher:
    """Queues finished steps and sends them as ``batch`` messages: what both
    modes' step recorders emit each finished step to (:meth:`add`), so the
    work per step is an append and everything else is done once per burst.

    Args:
        sender: the data channel (its counts are per event); None without a
            daemon (the bursts still go to *on_burst*).
        run_key: the run the steps belong to.
        comm: the DDP bucket timer, whose timings join the steps at each
            burst (its CUDA events had time to finish by then), if any.
        extra: returns a data event to send with the burst (the learnt
            ``model_info``), or None.
        read_memory: torch's CUDA allocator figures, read once per burst
            (:func:`gpuprof_shim.memory.cuda_memory`).
        every_steps: most steps per burst (default :data:`SEND_EVERY_STEPS`).
        every_ns: longest time between bursts, ns, checked as steps end
            (default :data:`SEND_EVERY_NS`).
        clock: monotonic ns, read around a burst sent by :meth:`add`; None:
            bursts are not timed.
        on_burst: gets each burst's steps, in order, before they are sent
            (the session marks traced steps, counts them, feeds W&B) and
            returns them as they are to be sent.
    """

    def __init__(
        self,
        sender: Sender | None,
        run_key: str,
        *,
        comm: CommTimer | None = None,
        extra: Callable[[], dict[str, Any] | None] = lambda: None,
        read_memory: Callable[[], tuple[int, int, int] | None] = memory.cuda_memory,
        every_steps: int | None = None,
        every_ns: int | None = None,
        clock: Callable[[], int] | None = time.monotonic_ns,
        on_burst: Callable[[list[StepRecord]], list[StepRecord]] = lambda steps: steps,
    ) -> None:
        self.sender = sender
        self.run_key = run_key
        self.comm = comm
        self.extra = extra
        self.read_memory = read_memory
        # read here, not bound at import: tests set the module's figures
        self.every_steps = SEND_EVERY_STEPS if every_steps is None else every_steps
        self.every_ns = SEND_EVERY_NS if every_ns is None else every_ns
        self.clock = clock
        self.on_burst = on_burst
        self._pending: list[StepRecord] = []
        self._room = self.every_steps  # steps that still fit in the burst
        self._due_ns = self.every_ns  # a step ending from then on sends the burst (as if sent at 0)

    @property
    def pending(self) -> int:
        """Steps queued, not yet sent."""
        return len(self._pending)

    def add(self, rec: StepRecord) -> int:
        """Queue one finished step; send the burst if it is full or due.
        Never raises (gpuprof's own problems are logged).

        Returns:
            the ns spent sending a burst (gpuprof's own time), 0 if none went
            out or bursts are not timed.
        """
        self._pending.append(rec)
        room = self._room - 1
        self._room = room
        if room > 0 and rec.t1 < self._due_ns:
            return 0
        clock = self.clock
        t = clock() if clock is not None else 0
        try:
            self.flush(rec.t1)
        except Exception:
            log.debug("gpuprof: could not send a burst of steps", exc_info=True)
        return max(0, clock() - t) if clock is not None else 0

    def flush(self, now_ns: int, final: bool = False) -> None:
        """Send the queued steps now (*final*: at exit, nothing may stay).

        The burst's last step carries torch's CUDA memory figures: one read
        per burst, and the peak figure is cumulative, so no peak is missed.
        Steps whose DDP buckets' CUDA events are still running stay queued
        for the next burst (:meth:`gpuprof_shim.comm.CommTimer.attach`).
        """
        pending, self._pending = self._pending, []
        self._room = self.every_steps
        self._due_ns = now_ns + self.every_ns
        sender = self.sender
        if pending:
            if sender is not None:
                mem = self.read_memory()
                if mem is not None:
                    pending[-1] = pending[-1]._replace(mem=mem)
            if self.comm is not None:
                ready = self.comm.attach(pending, now_ns=now_ns, final=final)
                pending, self._pending = pending[:ready], pending[ready:]
                self._room = self.every_steps - len(self._pending)
            pending = self.on_burst(pending)
        if sender is None:
            return
        events = messages.step_events(pending)
        info = self.extra()
        if info is not None:
            events.append(info)
        if events:
            sender.send_batch(self.run_key, events)
