"""The auto-mode step state machine: turns module calls, backward calls and
optimizer steps into training steps. Pure: it is fed timestamps (monotonic
ns) and optimizer objects and never reads torch, so tests drive it with a
fake clock. A step's accumulators are a :class:`~gpuprof_shim.auto.segment.Segment`;
what happens between steps is kept by a :class:`~gpuprof_shim.auto.gap.Gap`.

Longer than 500 lines: :class:`StepMachine` is one state machine whose event
methods (the hot path: one call per module call, backward and optimizer step)
read and write the same slotted attributes. Its parts with state of their own
live apart (``segment.py``, ``gap.py``); spreading its methods over modules
(a mixin) would scatter one object's state without separating a job, and a
helper object would cost an attribute lookup per event.

What a step is
    One cycle of the *primary* optimizer: the first optimizer that steps in
    the run. A GAN's discriminator and generator stepping once each per
    iteration make one step, not two; an optimizer's skipped update
    (``GradScaler`` found inf/NaN gradients) still ends the iteration's step.
    Because a second optimizer may step after the primary (the generator
    after the discriminator), a step is closed lazily: it ends at the last
    optimizer step before the primary steps again, and is emitted then (or
    at profile exit). Activity after an optimizer step goes into a new
    *segment* that either joins the open step (another optimizer steps
    next) or becomes the next step (the primary steps next). An optimizer
    that keeps stepping alone while the primary stays quiet (a second
    training stage, the first optimizer still referenced) takes over after
    :data:`SILENT_PRIMARY_CYCLES` turns, or at exit, and its turns are split
    back into steps of their own. Work after the last update (micro-batches
    never followed by one, a ``step()`` that raised) is not a step.
    With ``external=True`` (framework adapters) steps end only when
    :meth:`StepMachine.end_step` is called.

Phases (ns, summed over micro-batches)
    ``forward``: a micro-batch's first forward to its backward start;
    ``backward``: backward call durations; ``optimizer``: time inside
    ``optimizer.step()`` minus forward/backward run by a closure there
    (``optimizer.step(closure)``, LBFGS); ``data``: loading inside the
    step (timed ``next()`` calls; without any, the gap from a backward's
    end to the next micro-batch's forward); ``gpuprof``: the shim's own time
    sending a burst of events.

Micro-batches
    Backward calls outside optimizer steps in the step's segment, plus one if
    a closure ran backward inside the primary optimizer's step (LBFGS calls
    its closure many times on one batch). Backward calls that joined the
    step after the primary stepped (the generator's) are not micro-batches.

Evaluation
    Outermost module calls with grad disabled while no step segment is in
    progress. One or two of them chained into the next training forward
    (each ending within :data:`~gpuprof_shim.auto.gap.ADJACENT_NS` of what follows: a teacher's
    forward right before the student's) are part of that step, counted in
    its forward phase, unless a framework adapter said an eval loop just
    ended (:meth:`StepMachine.seal_eval`). All others (an eval loop, an EMA
    model's forward after the update) are evaluation: the span from the
    first to the last is the next step's ``eval_ns`` (or, after the last
    step, trailing eval) and is not loader wait.

Loader wait
    Timed fetches: the ``next()`` calls of torch DataLoader iterators (timed
    automatically) or of ``prof.wrap_dataloader(...)`` (then only those)
    between the previous step's end and this step's start, an eval loop's own
    loading excluded; fetches inside a step go to its ``data`` phase. Other
    time between steps (logging, checkpointing) is not loader wait.
    Gap mode, for a step with no timed fetch (a loop over a list or a
    generator): the gap from the previous step's end to this step's start,
    minus evaluation.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gpuprof.protocol import MAX_DURATION_NS
from gpuprof_shim.auto.gap import Gap
from gpuprof_shim.auto.segment import Segment
from gpuprof_shim.messages import phase_name
from gpuprof_shim.steps import LOADER_PHASE, OWN_PHASE, StepRecord

log = logging.getLogger("gpuprof.shim")

_get_ident = threading.get_ident
_tuple_new = tuple.__new__

IDLE = "idle"
FORWARD = "forward"
BACKWARD = "backward"
AFTER_BACKWARD = "after_backward"
OPTIMIZER = "optimizer"

#: Steps in a row another optimizer takes while the primary (the first to
#: step) stays quiet before it becomes the primary: a second training stage
#: with its own optimizer. Above a WGAN critic's 5 (or 25) updates per
#: generator update, which must stay one step.
SILENT_PRIMARY_CYCLES = 32
#: Optimizers tracked per run with their own name and counters; later ones
#: are summed under the last slot's name (the protocol carries at most 16).
MAX_OPTIMIZERS = 16


class StepMachine:
    """Auto-mode step tracker; see the module docstring.

    Args:
        emit: called with each finished :class:`StepRecord` (the session's
            emitter swallows its own errors); returns the ns it spent sending
            a burst of events, if it sent one (gpuprof's own time), else 0
            or None.
        start_ns: the profile start (the first step's loader gap begins here).
        clock: monotonic nanoseconds; the torch wrappers read it, the
            machine itself only receives timestamps.
        external: steps end only at :meth:`end_step` (framework adapters),
            not at optimizer cycles.
    """

    # slots: the hot path reads and writes these attributes on every event
    __slots__ = (
        "_closure_ns",
        "_closure_start",
        "_closure_state",
        "_companion_max",
        "_gap",
        "_in_scaler_step",
        "_inner_steps",
        "_last_index",
        "_last_optimizer",
        "_names",
        "_open",
        "_opt_depth",
        "_opt_index",
        "_opt_outer",
        "_outer_is_primary",
        "_opt_pre_ns",
        "_optimizers",
        "_own_ns",
        "_phase_start",
        "_pre_step_gap",
        "_prev_end",
        "_primary",
        "_seg",
        "_several",
        "_spare",
        "_tails",
        "_train_thread",
        "boundary",
        "clock",
        "emit",
        "explicit",
        "external",
        "next_index",
        "on_boundary",
        "on_forward_probe",
        "state",
        "trailing_eval_ns",
        "unfinished_micro",
        "__weakref__",
    )

    def __init__(
        self,
        emit: Callable[[StepRecord], int | None],
        start_ns: int = 0,
        clock: Callable[[], int] = time.monotonic_ns,
        *,
        external: bool = False,
    ) -> None:
        self.emit = emit
        self.clock = clock
        self.external = external
        self.state = IDLE
        self.next_index = 0
        self.explicit = False
        #: Eval time after the last step (a final validation), ns.
        self.trailing_eval_ns = 0
        #: Micro-batches after the last update, left out at exit (not a step).
        self.unfinished_micro = 0
        self._prev_end = start_ns
        self._seg = Segment()
        self._spare: Segment | None = None  # an emitted segment, reset, for the next one
        self._open: Segment | None = None  # primary stepped, not yet emitted
        # other optimizers' turns since: (index, segment, skipped)
        self._tails: list[tuple[int, Segment, bool]] = []
        # most turns each other optimizer took within one step so far
        self._companion_max: dict[int, int] = {}
        self._gap = Gap()
        self._phase_start = 0
        self._train_thread: int | None = None
        self._opt_depth = 0
        self._in_scaler_step = False
        self._opt_outer: Any = None
        self._outer_is_primary = False  # the outer step()'s optimizer is the primary
        self._opt_pre_ns = 0
        self._inner_steps = 0
        self._closure_state = IDLE
        self._closure_start = 0
        self._closure_ns = 0
        self._pre_step_gap = 0
        self._own_ns = 0  # gpuprof's time in emit() not yet charged to a segment
        self._primary: Any = None  # weakref to the primary optimizer (or a strong ref)
        self._optimizers: dict[int, tuple[Any, int]] = {}  # id(optimizer) -> (ref, index)
        self._names: list[str] = []  # index -> "Adam#0"
        self._several = False  # more than one optimizer has stepped
        # a strong reference for one step: fine, the optimizer lives as long anyway
        self._last_optimizer: Any = None
        self._last_index = 0
        self._opt_index = 0  # the index of the optimizer whose step() runs
        #: Called with the next step's index between steps, on the training
        #: thread: after the primary optimizer's ``step()`` ends (or
        #: :meth:`end_step`). The session's trace windows use it.
        self.boundary: Callable[[int], None] | None = None
        #: Called on the training thread when a step ends, with the index of
        #: the step that comes next and the last optimizer stepped
        #: (gpuprof_shim.flops counts one step's FLOPs).
        self.on_boundary: Callable[[int, Any], None] | None = None
        #: Called at the start of a training forward while set (the session
        #: reads the autocast state, then clears it).
        self.on_forward_probe: Callable[[], None] | None = None

    # --- queries the wrappers make on the hot path ---------------------------

    @property
    def in_step(self) -> bool:
        return self.state is not IDLE

    def accepts_forward(self) -> bool:
        """True when an outermost grad-enabled module call now would start or
        continue a forward phase (a cheap check so the wrapper skips work)."""
        state = self.state
        return state is IDLE or state is AFTER_BACKWARD or state is OPTIMIZER

    def wants_eval(self) -> bool:
        """True when a no-grad outermost module call now would be evaluation
        (no step segment in progress); the wrapper then times it and calls
        :meth:`on_eval_call`."""
        return self.state is IDLE

    def between_phases(self) -> bool:
        """True outside forward, backward and the optimizer: between steps
        (the gap: loading, evaluation, checkpoints) or between a step's
        micro-batches. Read by the stack sampler's thread (one attribute)."""
        state = self.state
        return state is IDLE or state is AFTER_BACKWARD

    def gap_step(self) -> int:
        """The index of the step whose loader wait (or ``data`` phase) the
        time now is counted in: the next step to be emitted, or the one after
        it while the last step is still open (closed lazily)."""
        return self.next_index + (1 if self._open is not None else 0)

    # --- events -------------------------------------------------------------

    def _start_segment(self, t: int, *, from_backward: bool = False) -> None:
        seg, gap = self._seg, self._gap
        self._train_thread = _get_ident()
        seg.t0 = t
        seg.last_ns = t
        seg.wait_ns = gap.after_ns
        if gap.calls:
            # a step that starts at its backward ran its forward under no_grad
            # (reentrant activation checkpointing called from the loop): the
            # whole adjacent chain before it is that forward
            prelude = gap.prelude_calls(t, unlimited=from_backward)
            if gap.iter_call >= gap.calls - prelude:
                # the iterator's first batch fed a teacher's forward: loader wait
                seg.wait_ns += gap.iter_loading_ns
            seg.eval_ns = gap.eval_span(prelude)
            # loader time before, after, and between the eval calls and a prelude
            seg.wait_ns += gap.before_ns
            if prelude > len(gap.recent):  # every call of the gap
                seg.t0 = gap.first_ns
                seg.loader_ns += gap.during_ns + sum(r[2] for r in gap.recent)
            elif prelude:
                first_start, _, loader_before = gap.recent[-prelude]
                seg.t0 = first_start  # a teacher's forward: part of this step
                if gap.calls > prelude:
                    seg.wait_ns += loader_before
            self._gap = Gap()
        else:
            gap.after_ns = gap.iter_ns = gap.after_iter_ns = 0
        self._phase_start = seg.t0

    def on_eval_call(self, t_start: int, t_end: int) -> None:
        """An outermost module call with grad disabled ran from *t_start* to
        *t_end* (ignored from a thread other than the training loop's)."""
        if self.state is IDLE and self._is_training_thread():
            self._gap.add_call(t_start, t_end)

    def seal_eval(self) -> None:
        """A framework's evaluation loop just ended (an adapter knows): the
        no-grad calls seen so far in this gap are evaluation, however few
        and however close the next training forward follows."""
        self._gap.sealed = self._gap.calls

    def on_forward(self, t: int, thread: int = 0) -> None:
        """An outermost module call (grad enabled, with parameters) started at
        *t* on the thread whose ident is *thread* (read here if 0)."""
        if self.on_forward_probe is not None:
            self.on_forward_probe()
        state = self.state
        if state is IDLE:
            gap = self._gap
            if gap.calls:
                self._start_segment(t)
            else:  # _start_segment's common case (no no-grad calls before), inlined
                seg = self._seg
                self._train_thread = thread or _get_ident()
                seg.t0 = seg.last_ns = self._phase_start = t
                seg.wait_ns = gap.after_ns
                gap.after_ns = gap.iter_ns = gap.after_iter_ns = 0
        elif state is AFTER_BACKWARD:
            # the gap before the next micro-batch's forward is its loading
            seg = self._seg
            if t > seg.last_ns:
                seg.between_ns += t - seg.last_ns
            self._phase_start = t
        elif state is OPTIMIZER:
            if self._closure_state is IDLE:
                self._closure_state = FORWARD
                self._closure_start = t
                self._seg.between_ns += self._pre_step_gap
                self._pre_step_gap = 0
            return
        else:
            return
        self.state = FORWARD

    def on_forward_end(self, t: int) -> None:
        """An outermost module call returned (or raised) at *t*."""
        if self.state is not IDLE:
            seg = self._seg
            if t > seg.last_ns:
                seg.last_ns = t

    def on_backward_start(self, t: int) -> bool:
        """A backward call started at *t*; returns whether it was counted
        (only then must :meth:`on_backward_end` be called for it)."""
        state = self.state
        seg = self._seg
        if state is BACKWARD:
            return False
        if state is OPTIMIZER:  # inside optimizer.step(closure)
            if self._closure_state is BACKWARD:
                return False
            if self._closure_state is FORWARD and t > self._closure_start:
                seg.forward_ns += t - self._closure_start
                self._closure_ns += t - self._closure_start
            self._closure_state = BACKWARD
            self._closure_start = t
            return True
        if state is IDLE:
            self._start_segment(t, from_backward=True)
            seg.forward_ns += t - seg.t0  # a no-grad forward chained into it, if any
        elif state is FORWARD:
            if t > self._phase_start:
                seg.forward_ns += t - self._phase_start
        elif t > seg.last_ns:  # AFTER_BACKWARD: a second backward on the same micro-batch's graph
            seg.between_ns += t - seg.last_ns
        self.state = BACKWARD
        self._phase_start = t
        seg.micro += 1
        return True

    def on_backward_end(self, t: int) -> None:
        """A counted backward call returned (or raised) at *t*."""
        seg = self._seg
        state = self.state
        if state is BACKWARD:
            if t > self._phase_start:
                seg.backward_ns += t - self._phase_start
            if t > seg.last_ns:
                seg.last_ns = t
            self.state = AFTER_BACKWARD
        elif state is OPTIMIZER and self._closure_state is BACKWARD:
            if t > self._closure_start:
                seg.backward_ns += t - self._closure_start
                self._closure_ns += t - self._closure_start
            seg.closure_micro = 1
            self._closure_state = IDLE

    def on_optimizer_pre(self, t: int, optimizer: Any = None) -> None:
        """``optimizer.step()`` (or ``GradScaler.step(optimizer)``) began at *t*."""
        depth = self._opt_depth
        if depth:
            if optimizer is not None and optimizer is self._opt_outer and not self._in_scaler_step:
                self._abandon_step()  # its last step() raised: no post hook came
            else:  # a step() inside a step() (GradScaler.step calls it)
                self._opt_depth = depth + 1
                self._inner_steps += 1
                return
        self._opt_depth = 1
        self._opt_outer = optimizer
        self._inner_steps = 0
        self._closure_state = IDLE
        self._closure_ns = 0
        if optimizer is self._last_optimizer and optimizer is not None:
            idx = self._last_index  # the common case: the same optimizer as last time
        else:
            idx = self._index_of(optimizer)
        self._opt_index = idx
        if not self.external:
            primary = self._primary
            if primary is None:
                self._set_primary(optimizer)
                primary = self._primary
            is_primary = primary() is optimizer
            if self._open is not None:
                if (
                    not is_primary
                    and self._tails
                    and self._cycles_alone(idx)
                    >= max(SILENT_PRIMARY_CYCLES, self._companion_max.get(idx, 0) + 1)
                ):
                    self._promote(optimizer, idx)  # the primary went quiet: this one takes over
                    is_primary = self._is_primary(optimizer)
                if is_primary:  # the primary's next cycle: the open step is done
                    if self._tails:
                        self._close_open()
                    else:  # _close_open() with nothing to join, inlined
                        seg = self._open
                        self._open = None
                        self._emit_segment(seg, seg.end_ns)
            self._outer_is_primary = is_primary
        seg = self._seg
        state = self.state
        last = seg.last_ns
        if not seg.t0:
            self._start_segment(t)
            last = seg.last_ns
        elif state is FORWARD and last > self._phase_start:
            seg.forward_ns += last - self._phase_start
        # after a backward, the time up to this step() is loading only if a
        # closure then runs the next micro-batch (Lightning fetches it first)
        self._pre_step_gap = t - last if state is AFTER_BACKWARD and t > last else 0
        optim = seg.optim
        if idx not in optim:
            optim[idx] = {"name": self._names[idx], "updates": 0, "skipped": 0, "ns": 0}
        self.state = OPTIMIZER
        own = self._own_ns
        if own:  # events sent just now are gpuprof's time, not the optimizer's
            self._own_ns = 0
            seg.own_ns += own
            t += own
        self._opt_pre_ns = self._phase_start = t

    def on_optimizer_post(self, t: int, optimizer: Any = None, skipped: bool = False) -> None:
        """``optimizer.step()`` ended at *t*; ``skipped``: it did not update."""
        depth = self._opt_depth
        if depth != 1:  # 0: a post without its pre (attached mid-step): ignore
            if depth:
                self._opt_depth = depth - 1  # an inner step() ended
            return
        self._opt_depth = 0
        seg = self._seg
        if self.state is not OPTIMIZER:
            return
        self._opt_outer = None
        if self._closure_state is FORWARD:  # a closure forward with no backward
            closure_fwd = seg.last_ns - self._closure_start
            if closure_fwd > 0:
                seg.forward_ns += closure_fwd
                self._closure_ns += closure_fwd
        self._closure_state = IDLE
        spent = t - self._opt_pre_ns - self._closure_ns
        if spent < 0:
            spent = 0
        seg.optimizer_ns += spent
        idx = self._opt_index
        try:
            use = seg.optim[idx]  # made by on_optimizer_pre
        except KeyError:
            use = seg.optim[idx] = {"name": self._names[idx], "updates": 0, "skipped": 0, "ns": 0}
        use["skipped" if skipped else "updates"] += 1
        use["ns"] += spent
        if t > seg.last_ns:
            seg.last_ns = t
        seg.end_ns = t
        if self.external:
            seg.skipped = seg.skipped or skipped
        else:
            if self._outer_is_primary:  # as on_optimizer_pre found it
                seg.primary_done = True
                seg.skipped = skipped
        if seg.primary_done:
            self._open = seg
            spare = self._spare  # _new_segment(), inlined
            if spare is not None:
                self._spare = None
                self._seg = spare
            else:
                self._seg = Segment()
            self.state = IDLE
            if self.boundary is not None or self.on_boundary is not None:
                self._at_boundary(self.next_index + 1)  # every earlier step is emitted by now
        elif self._open is not None and not self.external:
            # another optimizer's turn after the primary's: kept apart until
            # the primary steps again (then it joins the open step)
            self._tails.append((idx, seg, skipped))
            self._seg = self._new_segment()
            self.state = IDLE
        else:
            # the step goes on (external mode, or an optimizer before the
            # primary): a forward next is the next micro-batch of this step
            self.state = AFTER_BACKWARD

    def on_scaler_step_start(self, t: int, optimizer: Any) -> None:
        """``GradScaler.step(optimizer)`` began at *t*: the optimizer's step
        (or its skip) starts here; the real ``optimizer.step()``, if the
        scaler calls it, nests inside."""
        self.on_optimizer_pre(t, optimizer)
        self._in_scaler_step = self._opt_depth == 1

    def on_scaler_step_end(self, t: int, optimizer: Any) -> None:
        """``GradScaler.step(optimizer)`` returned at *t*; no inner
        ``optimizer.step()`` means the update was skipped (inf/NaN grads)."""
        skipped = self._opt_depth == 1 and self._inner_steps == 0
        self._in_scaler_step = False
        self.on_optimizer_post(t, optimizer, skipped=skipped)

    def end_step(self, t: int, *, skipped: bool = False, micro: int | None = None) -> None:
        """External mode: a step ended at *t* (a framework's step-end callback).
        ``micro`` overrides the counted micro-batches when the framework knows
        them. Does nothing if no activity was seen since the last step."""
        self._close_open()
        seg = self._seg
        if not seg.started:
            return
        if self.state is OPTIMIZER:  # called from inside a step(): count what ran
            seg.optimizer_ns += max(0, t - self._opt_pre_ns - self._closure_ns)
            self._opt_depth = 0
        elif self.state is FORWARD:
            seg.forward_ns += max(0, seg.last_ns - self._phase_start)
        seg.skipped = seg.skipped or skipped
        if micro is not None and micro >= 0:
            seg.micro, seg.closure_micro = micro, 0
        seg.end_ns = max(seg.end_ns, t)
        self.state = IDLE
        self._seg = self._new_segment()
        self._emit_segment(seg, seg.end_ns)
        self._seg.gap_own_ns, self._own_ns = self._own_ns, 0  # sent between steps
        self._at_boundary(self.next_index)

    def mark_explicit(self) -> None:
        """``wrap_dataloader`` started iterating: waits are timed ``next()`` calls."""
        self.explicit = True

    def add_loader_wait(self, ns: int) -> None:
        """A timed ``next()`` of a loader took *ns*."""
        ns = max(0, ns)
        state = self.state
        if state is not IDLE:
            seg = self._seg
            seg.loader_ns += ns
            if state is FORWARD:  # prefetching the next batch mid-forward
                seg.loader_in_forward_ns += ns
        else:
            gap = self._gap
            gap.after_ns += ns
            if gap.iter_ns:
                gap.after_iter_ns += ns

    def on_loader_exhausted(self, t_start: int, t_end: int) -> None:
        """A loader's last ``next()`` (StopIteration) ran from *t_start* to
        *t_end*: shutting down its workers. After no-grad calls it ends the
        eval loop (eval time); otherwise it is loader wait (an epoch's end)."""
        gap = self._gap
        if self.state is IDLE and gap.calls and self._is_training_thread():
            start, _, loader_before = gap.recent[-1]
            gap.recent[-1] = (start, max(t_end, gap.recent[-1][1]), loader_before)
            gap.sealed = gap.calls  # the loop is over: none of its calls is a prelude
        else:
            self.add_loader_wait(t_end - t_start)

    def on_loader_iter(self, t: int) -> None:
        """A loader iterator was created at *t* (an epoch or a validation pass
        begins); if no-grad calls follow, its start-up is eval time."""
        if self.state is IDLE and self._is_training_thread():
            self._gap.iter_ns = t
            self._gap.after_iter_ns = 0

    def flush(self, t: int) -> None:
        """Profile exit at *t*: emit the open step. Work after the last update
        (micro-batches never followed by one, a ``step()`` that raised) is not
        a step: its micro-batches are counted in :attr:`unfinished_micro`.
        No-grad calls left over are trailing eval time."""
        if self._open is not None and self._tails:
            idx, n = max(self._tail_counts().items(), key=lambda kv: kv[1])
            # more turns than it ever took beside the primary: a last training
            # stage, not a GAN's (or a WGAN critic's) last turns
            if n >= 2 and n > self._companion_max.get(idx, 0):
                self._promote(self._optimizer_by_index(idx), idx)
        self._close_open()
        seg = self._seg
        if seg.started:
            self.unfinished_micro += seg.micro + seg.closure_micro
        elif self._gap.calls:
            self.trailing_eval_ns += self._gap.eval_span(0)
        self._seg, self._gap = Segment(), Gap()
        self.state = IDLE
        self._opt_depth = 0

    # --- internals ------------------------------------------------------------

    def _at_boundary(self, next_step: int) -> None:
        """A step just ended and step *next_step* has not begun: call
        :attr:`boundary` (trace windows start and stop here), then
        :attr:`on_boundary` (the FLOP count). Its time is gpuprof's own, in
        the gap before the next step (not loader wait)."""
        boundary, on_boundary = self.boundary, self.on_boundary
        if boundary is None and on_boundary is None:
            return
        t = self.clock()
        try:
            if boundary is not None:
                boundary(next_step)
        except Exception:
            log.debug("gpuprof: step boundary callback failed", exc_info=True)
        try:
            if on_boundary is not None:
                on_boundary(next_step, self._last_optimizer)
        except Exception:
            log.debug("gpuprof: step boundary callback failed", exc_info=True)
        self._seg.gap_own_ns += max(0, self.clock() - t)

    def _is_training_thread(self) -> bool:
        """True on the thread of the last training forward/backward (or if
        none was seen yet)."""
        ident = threading.get_ident()
        if self._train_thread is None:
            return True
        return ident == self._train_thread

    def _abandon_step(self) -> None:
        """An ``optimizer.step()`` raised (the loop caught it and went on): no
        update happened. What ran since counts as micro-batches of the step
        still in progress, not as closure work."""
        seg = self._seg
        seg.micro += seg.closure_micro
        seg.closure_micro = 0
        self._opt_depth = 0
        self._opt_outer = None
        self._in_scaler_step = False
        self._closure_state = IDLE
        if self.state is OPTIMIZER:
            self.state = AFTER_BACKWARD

    def _emit_open(self) -> None:
        seg, self._open = self._open, None
        if seg is not None:
            self._emit_segment(seg, seg.end_ns)

    def _close_open(self) -> None:
        """The open step is complete: the other optimizers' turns since the
        primary stepped join it (a GAN's generator), then it is emitted."""
        seg = self._open
        if self._tails:
            if seg is not None:
                for _, tail, _ in self._tails:
                    seg.absorb(tail)
                    seg.end_ns = max(seg.end_ns, tail.end_ns)
                for idx, n in self._tail_counts().items():
                    self._companion_max[idx] = max(self._companion_max.get(idx, 0), n)
            self._tails = []
        if seg is not None:
            self._open = None
            self._emit_segment(seg, seg.end_ns)

    def _tail_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for i, _, _ in self._tails:
            counts[i] = counts.get(i, 0) + 1
        return counts

    def _cycles_alone(self, idx: int) -> int:
        """How often optimizer *idx* stepped since the primary last did."""
        return self._tail_counts().get(idx, 0)

    def _promote(self, optimizer: Any, idx: int) -> None:
        """Optimizer *idx* cycled on its own while the primary stayed quiet
        (a second training stage with a new optimizer, the old one still
        referenced): it becomes the primary, and its cycles so far are split
        back into steps of their own."""
        tails, self._tails = self._tails, []
        first = next(k for k, (i, _, _) in enumerate(tails) if i == idx)
        for _, tail, _ in tails[:first]:  # before its first turn: the open step's
            assert self._open is not None
            self._open.absorb(tail)
            self._open.end_ns = max(self._open.end_ns, tail.end_ns)
        self._emit_open()
        head: Segment | None = None
        for i, tail, skipped in tails[first:]:
            if i == idx:
                if head is not None:
                    self._emit_segment(head, head.end_ns)
                head = tail
                head.primary_done, head.skipped = True, skipped
            else:
                assert head is not None
                head.absorb(tail)
                head.end_ns = max(head.end_ns, tail.end_ns)
        self._open = head  # its last cycle, complete once it steps again
        self._set_primary(optimizer)
        log.debug(
            "gpuprof: %s stepped %d times alone: it now defines the step",
            self._names[idx],
            len(tails) - first,
        )

    def _emit_segment(self, seg: Segment, t1: int) -> None:
        """Emit *seg*, ended at *t1*, as the next step; *seg* is reset and
        reused (it must not be referenced afterwards)."""
        t0 = seg.t0
        if t1 < t0:
            t1 = t0
        # timed fetches that are this step's loading (an eval loop's are not)
        wait, loader_ns = seg.wait_ns, seg.loader_ns  # both >= 0
        if self.explicit or wait or loader_ns:
            explicit = True
            inside = loader_ns
        else:
            explicit = False
            wait = t0 - self._prev_end - seg.eval_ns - seg.gap_own_ns
            if wait < 0:
                wait = 0
            inside = seg.between_ns
        self._prev_end = t1
        forward = seg.forward_ns - seg.loader_in_forward_ns
        if forward < 0:
            forward = 0
        backward, optimizer = seg.backward_ns, seg.optimizer_ns
        phases = {"forward": forward, "backward": backward, "optimizer": optimizer}
        # Every phase (and each optimizer's ns) is a sum of non-negative clock
        # deltas, so a total within the protocol's bound puts each within it:
        # the step's event takes them as they are (one sum, not a check per
        # phase at each burst); the optimizers' names were made valid when
        # first seen.
        total = forward + backward + optimizer
        if inside:
            phases[LOADER_PHASE] = inside
            total += inside
        own = seg.own_ns
        if own:
            phases[OWN_PHASE] = own
            total += own
        optim = seg.optim
        # in order of the optimizers' indexes (one optimizer: as it is)
        optimizers = [optim[idx] for idx in sorted(optim)] if self._several else [*optim.values()]
        i = self.next_index
        self.next_index = i + 1
        # new_step(), inlined: this runs once per step
        rec = _tuple_new(
            StepRecord,
            (
                i,
                t0,
                t1,
                wait,
                explicit,
                seg.micro + seg.closure_micro,
                phases,
                seg.skipped,
                seg.eval_ns,
                optimizers,
                None,
                False,
                (),
                t0.__class__ is int and total <= MAX_DURATION_NS,
            ),
        )
        # nothing refers to seg any more: reset, it is the next segment
        seg.t0 = seg.last_ns = seg.end_ns = 0
        seg.forward_ns = seg.backward_ns = seg.optimizer_ns = seg.between_ns = 0
        seg.loader_ns = seg.loader_in_forward_ns = seg.own_ns = seg.gap_own_ns = 0
        seg.wait_ns = seg.eval_ns = seg.micro = seg.closure_micro = 0
        seg.primary_done = seg.skipped = False
        optim.clear()
        self._spare = seg
        spent = self.emit(rec)  # a burst sent now is gpuprof's own time, kept apart
        if spent:
            self._own_ns += spent

    def _new_segment(self) -> Segment:
        """A fresh segment: the last emitted one, reset, if there is one."""
        spare = self._spare
        if spare is None:
            return Segment()
        self._spare = None
        return spare

    def _index_of(self, optimizer: Any) -> int:
        if optimizer is self._last_optimizer and optimizer is not None:
            return self._last_index  # the common case: the same optimizer as last time
        idx = self._lookup_index(optimizer)
        self._last_optimizer, self._last_index = optimizer, idx
        return idx

    def _lookup_index(self, optimizer: Any) -> int:
        entry = self._optimizers.get(id(optimizer))
        if entry is not None and _deref(entry[0]) is optimizer:
            return entry[1]
        idx = len(self._names)
        if idx >= MAX_OPTIMIZERS:  # more optimizers than the protocol lists: share the last slot
            idx = MAX_OPTIMIZERS - 1
            self._names[idx] = "other"
            segments = [self._seg, self._open, *(tail for _, tail, _ in self._tails)]
            for seg in segments:  # the shared slot's entries in steps not yet emitted
                use = seg.optim.get(idx) if seg is not None else None
                if use is not None:
                    use["name"] = "other"
        else:
            self._names.append(phase_name(f"{type(optimizer).__name__}#{idx}"))
            self._several = idx > 0
        self._optimizers[id(optimizer)] = (_ref(optimizer), idx)
        return idx

    def _optimizer_by_index(self, idx: int) -> Any:
        for ref, i in self._optimizers.values():
            if i == idx:
                return _deref(ref)
        return None

    def _set_primary(self, optimizer: Any) -> None:
        self._primary = _ref(optimizer, self._primary_gone)

    def _primary_gone(self, _ref: Any = None) -> None:
        """The primary optimizer was garbage-collected (replaced): the next
        optimizer that steps becomes the primary."""
        self._primary = None

    def _is_primary(self, optimizer: Any) -> bool:
        primary = self._primary
        return primary is not None and primary() is optimizer


def _ref(obj: Any, callback: Callable[[Any], None] | None = None) -> Callable[[], Any]:
    """A weak reference where the object allows one, else a strong one:
    either way a callable that returns the object (or None once it is gone)."""
    try:
        return weakref.ref(obj, callback) if callback else weakref.ref(obj)
    except TypeError:
        return _Strong(obj)


class _Strong:
    """A strong reference that reads like a weak one (``ref()``)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def _deref(ref: Callable[[], Any]) -> Any:
    return ref()
