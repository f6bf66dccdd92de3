"""What every adapter shares: one profile started and stopped from a
framework's callbacks, which must never raise into training."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

from gpuprof_shim.session import Profiler, active_profiler

log = logging.getLogger("gpuprof.shim")


class EndsRunOnExit:
    """``with adapter:`` around training ends the adapter's run when the
    block ends; an exception leaving it marks the run failed (and goes on)."""

    _run: AdapterRun

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._run.stop(exc)
        return False


class AdapterRun:
    """Starts a fresh :class:`Profiler` for each training run a framework
    begins, and stops it exactly once.

    Args:
        adapter: the adapter's name, for messages (``"LightningCallback"``).
        run_name: the profile's run name.
        options: :class:`Profiler` keyword options chosen by the user.
        fixed: options the adapter sets itself (the user may not pass them).

    Raises:
        TypeError: *options* holds one of *fixed*'s keys, or ``auto``
            (adapters need auto mode's phase timing).
        ValueError: an invalid option (checked now, not when training starts).
    """

    def __init__(
        self,
        adapter: str,
        run_name: str,
        options: dict[str, Any],
        fixed: dict[str, Any] | None = None,
    ) -> None:
        fixed = fixed or {}
        reserved = sorted(k for k in options if k == "auto" or k in fixed)
        if reserved:
            raise TypeError(f"gpuprof.{adapter}: the adapter sets {', '.join(reserved)} itself")
        self.adapter = adapter
        self.run_name = run_name
        self.options = {**options, **fixed}
        Profiler(run_name, **self.options)  # validate the options early
        #: The profile of the run in progress (or the last one), if any.
        self.profiler: Profiler | None = None

    @property
    def active(self) -> bool:
        """True while a profile started here is recording."""
        prof = self.profiler
        return prof is not None and active_profiler() is prof

    def start(self) -> Profiler | None:
        """Start a new profile; a profile of this adapter still active (its
        run ended without the end callback, e.g. it raised) is stopped first,
        marked failed. Returns None, logging why, if it could not start
        (another profile is active in this process, or an internal error)."""
        if self.active:
            self.stop(RuntimeError(f"{self.adapter}: training restarted before it ended"))
        try:
            prof = Profiler(self.run_name, **self.options)
            prof.start()
        except Exception as exc:  # never fail training over the profiler
            log.warning("gpuprof.%s: not profiling this run: %s", self.adapter, exc)
            self.profiler = None
            return None
        self.profiler = prof
        return prof

    def stop(self, exc: BaseException | None = None) -> None:
        """Stop the active profile (``exc``: the error that ended training,
        which marks the run failed). Does nothing if none is active."""
        prof = self.profiler
        if prof is None:
            return
        try:
            prof.stop(exc)
        except Exception:
            log.warning("gpuprof.%s: could not stop the profile", self.adapter, exc_info=True)

    def seal_eval(self) -> None:
        """The framework's evaluation loop just ended: its no-grad forwards
        are evaluation time, even one or two right before a training step
        (which auto mode alone would take for a teacher's forward)."""
        prof = self.profiler
        machine = prof.machine if prof is not None else None
        if machine is None or active_profiler() is not prof:
            return
        try:
            machine.seal_eval()
        except Exception:
            log.debug("gpuprof.%s: could not mark evaluation", self.adapter, exc_info=True)

    def mark_step_end(self, *, skipped: bool = False, micro: int | None = None) -> None:
        """End the current step of the active profile (external step source)."""
        prof = self.profiler
        if prof is not None:
            prof.mark_step_end(skipped=skipped, micro=micro)
