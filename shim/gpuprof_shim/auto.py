"""The auto-mode step state machine: turns module calls, backward calls and
optimizer hooks into steps. Pure: it is fed timestamps (monotonic ns) and
never reads torch, so tests drive it with a fake clock.

States and transitions::

    idle ──forward──▶ forward ──backward start──▶ backward ──end──▶ after_backward
      ▲                  ▲                                              │  │
      │                  └──────────── forward (next micro-batch) ──────┘  │
      └──────── optimizer post (step end) ◀── optimizer ◀── optimizer pre ─┘

* A step runs from its first forward (t0) to the optimizer post hook (t1).
* ``micro`` counts backward calls in the step (one per micro-batch).
* Phases (ns, summed over micro-batches): ``forward`` = each micro-batch's
  first forward to its backward start; ``backward`` = backward call
  durations; ``optimizer`` = pre hook to post hook.
* Forwards during backward (activation checkpointing) or the optimizer
  (closures) belong to that phase; extra outermost calls in a forward phase
  (a loss module after the model) belong to it too.
* An optimizer step with no step in progress (a second optimizer stepping
  right after the first) is ignored; its end still closes the loader gap so
  its time is not mistaken for loader wait. Nested optimizer steps (a
  wrapper optimizer stepping an inner one) count once.
* A backward with no forward seen starts a step at the backward.
* Loader wait: see :class:`~gpuprof_shim.steps.WaitTracker` (timed
  ``next()`` calls inside a step become its ``data`` phase).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuprof_shim.steps import LOADER_PHASE, StepRecord, WaitTracker

IDLE = "idle"
FORWARD = "forward"
BACKWARD = "backward"
AFTER_BACKWARD = "after_backward"
OPTIMIZER = "optimizer"


class StepMachine:
    """Auto-mode step tracker; see the module docstring.

    Args:
        emit: called with each finished :class:`StepRecord` (never raises
            into the machine's caller: the session's emitter swallows errors).
        waits: loader-wait bookkeeping shared with ``wrap_dataloader``.
        clock: monotonic nanoseconds; the torch wrappers read it, the
            machine itself only receives timestamps.
    """

    def __init__(
        self,
        emit: Callable[[StepRecord], None],
        waits: WaitTracker,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.emit = emit
        self.waits = waits
        self.clock = clock
        self.state = IDLE
        self.next_index = 0
        self._opt_depth = 0
        self._reset()

    def _reset(self) -> None:
        self.state = IDLE
        self._t0 = 0
        self._last_ns = 0
        self._phase_start = 0
        self._micro = 0
        self._forward_ns = 0
        self._backward_ns = 0
        self._optimizer_ns = 0
        self._between_ns = 0

    @property
    def in_step(self) -> bool:
        return self.state != IDLE

    def accepts_forward(self) -> bool:
        """True when an outermost module call now would start a forward phase
        (cheap check so the wrapper skips work otherwise)."""
        return self.state is IDLE or self.state is AFTER_BACKWARD

    def _start(self, t: int) -> None:
        self._t0 = t
        self._last_ns = t
        self.waits.step_started()

    def on_forward(self, t: int) -> None:
        """An outermost module call (grad enabled) started at *t*."""
        if self.state is IDLE:
            self._start(t)
        elif self.state is AFTER_BACKWARD:
            # the gap before the next micro-batch's forward is its loading
            self._between_ns += max(0, t - self._last_ns)
        else:
            return
        self.state = FORWARD
        self._phase_start = t

    def on_forward_end(self, t: int) -> None:
        """An outermost module call returned (or raised) at *t*."""
        if self.state is not IDLE:
            self._last_ns = max(self._last_ns, t)

    def on_backward_start(self, t: int) -> bool:
        """A backward call started at *t*; returns whether it was counted
        (only then must :meth:`on_backward_end` be called for it)."""
        state = self.state
        if state is BACKWARD or state is OPTIMIZER:
            return False
        if state is IDLE:
            self._start(t)
        elif state is FORWARD:
            self._forward_ns += t - self._phase_start
        self.state = BACKWARD
        self._phase_start = t
        self._micro += 1
        return True

    def on_backward_end(self, t: int) -> None:
        """A counted backward call returned (or raised) at *t*."""
        if self.state is BACKWARD:
            self._backward_ns += t - self._phase_start
            self._last_ns = max(self._last_ns, t)
            self.state = AFTER_BACKWARD

    def on_optimizer_pre(self, t: int) -> None:
        """An ``optimizer.step()`` began at *t* (global pre hook)."""
        self._opt_depth += 1
        if self._opt_depth != 1 or self.state is IDLE:
            return
        if self.state is FORWARD:
            self._forward_ns += max(0, self._last_ns - self._phase_start)
        self.state = OPTIMIZER
        self._phase_start = t

    def on_optimizer_post(self, t: int) -> None:
        """An ``optimizer.step()`` ended at *t* (global post hook): step end."""
        if self._opt_depth > 0:
            self._opt_depth -= 1
            if self._opt_depth > 0:
                return
        if self.state is IDLE:
            self.waits.step_skipped(t)
            return
        if self.state is OPTIMIZER:
            self._optimizer_ns += t - self._phase_start
        self._finish(t)

    def add_loader_wait(self, ns: int) -> None:
        """A timed ``next()`` of the wrapped loader took *ns*."""
        self.waits.add_loader_wait(ns)

    def flush(self, t: int) -> None:
        """Profile exit at *t*: emit the step in progress, if any, ending at
        its last seen activity (or *t* if it stopped inside the optimizer)."""
        state = self.state
        if state is IDLE:
            return
        end = max(self._last_ns, self._phase_start)
        if state is FORWARD:
            self._forward_ns += end - self._phase_start
        elif state is BACKWARD:
            end = t
            self._backward_ns += t - self._phase_start
        elif state is OPTIMIZER:
            end = t
            self._optimizer_ns += t - self._phase_start
        self._opt_depth = 0
        self._finish(end)

    def _finish(self, t1: int) -> None:
        t1 = max(t1, self._t0)
        wait, explicit, loader_ns = self.waits.finish_step(self._t0, t1)
        phases = {
            "forward": self._forward_ns,
            "backward": self._backward_ns,
            "optimizer": self._optimizer_ns,
        }
        # timed next() calls when the loader is wrapped, else the inter-micro-batch gaps
        inside = loader_ns if explicit else self._between_ns
        if inside:
            phases[LOADER_PHASE] = inside
        rec = StepRecord(self.next_index, self._t0, t1, wait, explicit, self._micro, phases)
        self.next_index += 1
        self._reset()
        self.emit(rec)
