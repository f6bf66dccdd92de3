"""The manual API (``auto=False``): ``prof.step(i)`` and ``s.phase(name)``.

A step runs from ``with prof.step(i)`` entry (t0) to exit (t1), one
micro-batch; its phases are what ``s.phase(name)`` recorded (repeated
phases of one name add up; a phase nested in another of the same name
counts once). Its wait comes from the shared
:class:`~gpuprof_shim.steps.WaitTracker` (a timed ``next()`` inside the step
adds to its ``data`` phase instead). Needs no torch.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from gpuprof_shim.messages import phases_ok
from gpuprof_shim.steps import LOADER_PHASE, StepRecord, WaitTracker, new_step

log = logging.getLogger("gpuprof.shim")

_MAX_INDEX = 1 << 40


class Phase(tuple):  # type: ignore[type-arg]
    """``with s.phase(name):`` — adds its duration (ns) to the step's phase.

    A ``(step, name)`` tuple, made without an ``__init__`` frame (one per
    phase and step); the step keeps when its open phases started.
    """

    __slots__ = ()

    def __enter__(self) -> Phase:
        step, name = self
        open_ = step._open
        if name in open_:  # nested in a phase of the same name: counted once
            nested = step._nested
            if nested is None:
                nested = step._nested = {}
            nested[name] = nested.get(name, 0) + 1
        else:
            open_[name] = step._clock()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        step, name = self
        nested = step._nested
        if nested and nested.get(name):
            nested[name] -= 1
            return
        t = step._open.pop(name, None)
        if t is None or step._done:
            return  # never entered, or the step is over
        ns = step._clock() - t
        phases = step.phases
        phases[name] = phases.get(name, 0) + (ns if ns > 0 else 0)


class Step:
    """One manual step; use as a context manager. See the module docstring."""

    __slots__ = (
        "i",
        "_rec",
        "_clock",
        "_t0",
        "_entries",
        "_ignored",
        "_done",
        "phases",
        "_open",
        "_nested",
    )

    def __init__(self, recorder: ManualRecorder, i: int) -> None:
        self.i = i
        self._rec = recorder
        self._clock = recorder.clock
        self._t0: int | None = None
        self._entries = 0
        self._ignored = False
        self._done = False
        self.phases: dict[str, int] = {}
        self._open: dict[str, int] = {}  # open phase -> its start, ns
        self._nested: dict[str, int] | None = None  # same-name phases inside them

    def phase(self, name: str) -> Phase:
        """A context manager timing phase *name* (any string) inside this step."""
        return Phase((self, name if type(name) is str else str(name)))

    def __enter__(self) -> Step:
        self._entries += 1
        if self._entries == 1 and self._t0 is None and not self._ignored:
            rec = self._rec
            if not rec.closed and rec._current is None:  # no other step in progress
                rec._current = self
                if rec.before_step is not None:
                    rec._before(self.i)
                self._t0 = self._clock()
                rec.waits.in_step = True  # waits.step_started(), inlined
                return self
            self._ignored = True
        log.warning("gpuprof: step %s re-entered or inside another step; not recorded", self.i)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entries -= 1
        if self._entries > 0 or self._ignored or self._done or self._t0 is None:
            return
        self._done = True
        self._rec._end(self, self._t0, self._clock())


class NullStep(Step):
    """What ``prof.step()`` returns when it cannot record (auto mode, or after
    the profile ended): a working context manager that records nothing."""

    def __init__(self, i: int = 0) -> None:
        self.i = i
        self._clock = time.monotonic_ns
        self._t0 = None
        self._entries = 0
        self._ignored = True
        self._done = True
        self.phases = {}
        self._open = {}
        self._nested = None

    def __enter__(self) -> Step:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class ManualRecorder:
    """Creates :class:`Step` objects and turns finished ones into records.

    Args:
        emit: receives each finished :class:`StepRecord`.
        waits: loader-wait bookkeeping (shared with ``wrap_dataloader``).
        clock: monotonic nanoseconds.
    """

    def __init__(
        self,
        emit: Callable[[StepRecord], object],
        waits: WaitTracker,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.emit = emit
        self.waits = waits
        self.clock = clock
        self.closed = False
        self._next_index = 0
        self._current: Step | None = None
        #: Called with the step index right before a step's start is read,
        #: and right after it was emitted (trace windows open and close here).
        self.before_step: Callable[[int], None] | None = None
        self.after_step: Callable[[int], None] | None = None

    def between_steps(self) -> bool:
        """True while no ``with prof.step()`` block is open (the stack
        sampler's gate in manual mode)."""
        return self._current is None

    @property
    def next_index(self) -> int:
        """The index the next step takes unless given one."""
        return self._next_index

    def step(self, i: Any = None) -> Step:
        """A new step with index *i* (a non-negative int; anything else, or
        None, takes the next index after the last one recorded)."""
        if self.closed:
            return NullStep()
        if type(i) is int and 0 <= i <= _MAX_INDEX:
            return Step(self, i)  # the common case
        try:
            index = operator.index(i) if i is not None else -1
        except TypeError:
            index = -1
        if not 0 <= index <= _MAX_INDEX:
            if i is not None:
                log.warning("gpuprof: step index %r is not a non-negative int", i)
            index = self._next_index
        return Step(self, index)

    def _end(self, step: Step, t0: int, t1: int) -> None:
        if self._current is step:
            self._current = None
        if self.closed:
            return
        wait, explicit, loader_ns = self.waits.finish_step(t0, t1)
        phases = dict(step.phases)
        if loader_ns:
            phases[LOADER_PHASE] = phases.get(LOADER_PHASE, 0) + loader_ns
        self._next_index = step.i + 1
        # every phase is a non-negative sum of clock deltas: names seen valid
        # and a total within bounds let the step's event take them as they are
        clean = type(t0) is int and t1 >= t0 and phases_ok(phases)
        self.emit(new_step(step.i, t0, t1, wait, explicit, 1, phases, False, 0, (), clean))
        after = self.after_step
        if after is not None:
            t = self.clock()
            try:
                after(step.i)
            except Exception:
                log.debug("gpuprof: after-step callback failed", exc_info=True)
            # gpuprof's own time after the step is not the next step's loader wait
            self.waits.prev_end_ns += max(0, self.clock() - t)

    def _before(self, i: int) -> None:
        before = self.before_step
        if before is not None:
            try:
                before(i)
            except Exception:
                log.debug("gpuprof: before-step callback failed", exc_info=True)
