"""The profile's two optional helpers beside step recording, and how they are
wired in: the torch.profiler trace windows (:class:`TraceWindows`, over a
:class:`~gpuprof_shim.trace.windows.Tracer`) and the clock alignment against rank 0
(:class:`ClockSync`, over a :class:`~gpuprof_shim.clock_align.ClockAligner`).
Neither ever raises into training."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpuprof_shim import messages
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.manual import ManualRecorder
from gpuprof_shim.trace.evidence import EvidenceSlot
from gpuprof_shim.trace.options import TraceOptions
from gpuprof_shim.trace.windows import Tracer

log = logging.getLogger("gpuprof.shim")


class TraceWindows:
    """Trace windows at step boundaries (see :mod:`gpuprof_shim.trace.windows`).

    Args:
        options: the parsed trace options (enabled).
        run_key, run_name: the run's identity, for the ``kernels`` events.
        send: sends one event now; False if dropped.
        clock: monotonic nanoseconds.
        evidence: the slot evidence requests arrive in; None: none taken.
    """

    def __init__(
        self,
        options: TraceOptions,
        *,
        run_key: str,
        run_name: str,
        send: Callable[[Any], bool],
        clock: Callable[[], int],
        evidence: EvidenceSlot | None = None,
    ) -> None:
        self.tracer = Tracer(
            options, run_key=run_key, run_name=run_name, send=send, clock=clock, evidence=evidence
        )

    def attach(self, machine: StepMachine | None, recorder: ManualRecorder | None) -> None:
        """Open the tracer and hook it to the steps: auto mode's machine
        (windows open and close at its boundaries; the profile's start is the
        one before step 0) or the manual recorder (around each step)."""
        tracer = self.tracer
        tracer.open()
        if machine is not None:
            machine.boundary = tracer.boundary
            tracer.start_window(0)
        elif recorder is not None:
            recorder.before_step = tracer.start_window
            recorder.after_step = tracer.after_step

    def traced(self, t0: int, t1: int) -> bool:
        """True if a torch.profiler window ran between *t0* and *t1*."""
        return self.tracer.traced(t0, t1)

    def close(self) -> None:
        """Stop the profiler and remove its guard (idempotent)."""
        self.tracer.close()


class ClockSync:
    """Measures this rank's clock offset against rank 0 in the background,
    once per profile, and sends it as a ``clock`` event while the run is
    open. Not with ``time_comm=False``: the offsets only serve the comm
    timings.

    Args:
        run_key: the run the event belongs to.
        send: sends one event (the data channel), or None without a daemon.
        is_open: whether the profile still records.
        enabled: ``time_comm``.
    """

    def __init__(
        self,
        run_key: str,
        send: Callable[[Any], bool] | None,
        is_open: Callable[[], bool],
        *,
        enabled: bool = True,
    ) -> None:
        self.run_key = run_key
        self.send = send
        self.is_open = is_open
        self.enabled = enabled
        #: The :class:`~gpuprof_shim.clock_align.ClockAligner`, once started.
        self.aligner: Any = None
        self._tried = False

    def start_if_distributed(self, dist: Any) -> None:
        """Start now if *dist* (``torch.distributed``, if imported) has a
        process group; otherwise the first DDP found starts it (:meth:`start`)."""
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self.start()
        except Exception:
            log.debug("gpuprof: could not read torch.distributed's state", exc_info=True)

    def start(self) -> None:
        """Start the alignment (once; a later call does nothing)."""
        if self._tried or self.send is None or not self.enabled:
            return
        self._tried = True
        try:
            from gpuprof_shim.clock_align import ClockAligner
        except ImportError:
            return
        try:
            self.aligner = ClockAligner(self._on_offset)
            self.aligner.start()
        except Exception:
            log.debug("gpuprof: clock alignment not started", exc_info=True)

    def _on_offset(self, offset: Any) -> None:
        """The aligner's result (its thread): send it while the run is open."""
        send = self.send
        if send is not None and self.is_open():
            send(messages.clock(self.run_key, offset))

    def close(self) -> None:
        aligner = self.aligner
        if aligner is not None:
            try:
                aligner.close()
            except Exception:
                log.debug("gpuprof: could not close clock alignment", exc_info=True)
