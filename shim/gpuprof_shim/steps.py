"""What both modes produce: one finished step, and the loader-wait
bookkeeping that decides each step's ``wait``. All times are
``time.monotonic_ns()`` nanoseconds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple, TypedDict

from gpuprof.comm import BucketTiming
from gpuprof.protocol import DATA_PHASE, OWN_TIME_PHASE


class OptimizerUse(TypedDict):
    """One optimizer's share of a step: a plain dict, as the ``step`` event's
    ``optimizers`` entry carries it (made once per step and optimizer, sent
    as it is).

    Keys:
        name: class name and order of first step in the run, e.g. ``"Adam#0"``.
        updates: ``step()`` calls that updated the parameters.
        skipped: ``step()`` calls skipped (``GradScaler`` found inf/NaN gradients).
        ns: time inside ``step()``, closures' forward/backward excluded, ns.
    """

    name: str
    updates: int
    skipped: int
    ns: int


class StepRecord(NamedTuple):
    """One training step, ready to become a ``step`` message. A tuple (the
    shim makes one per step, and a tuple is several times cheaper to make
    and free than an object); what changes later (the burst's memory
    figures, DDP buckets, ``traced``) is set with ``_replace``.

    Attributes:
        i: step index, from 0.
        t0: step start (first forward, or ``prof.step`` entry), ns.
        t1: step end (optimizer post hook, or ``prof.step`` exit), ns.
        wait: loader wait before/within the step, ns (see :class:`WaitTracker`).
        explicit: True if ``wait`` is timed ``next()`` calls, False if it is
            the gap since the previous step ended.
        micro: micro-batches (backward calls) in the step.
        phases: phase name -> summed duration, ns (never changed in place).
        skipped: the primary optimizer's update was skipped (inf/NaN gradients).
        eval_ns: evaluation (no-grad forwards) in the gap before the step, ns;
            not part of ``wait``.
        optimizers: each optimizer's updates and time in this step (auto mode).
        mem: torch's CUDA allocator after the step, ``(allocated, reserved,
            peak)`` bytes (:func:`gpuprof_shim.memory.cuda_memory`); None when
            CUDA is not in use or the figures were not read for this step.
        traced: gpuprof instrumented this step (FlopCounterMode counted its
            FLOPs), so its time is not representative.
        comm: the DDP gradient buckets' collectives timed in this step
            (:class:`gpuprof.comm.BucketTiming`), in launch order; empty
            when none were timed.
        clean: ``phases`` and ``optimizers`` already hold what the protocol
            accepts (names seen valid, int ns within bounds), ``t1 >= t0``
            and ``wait >= 0``, so the step's event takes them as they are.
    """

    i: int
    t0: int
    t1: int
    wait: int
    explicit: bool
    micro: int
    phases: Mapping[str, int] = MappingProxyType({})
    skipped: bool = False
    eval_ns: int = 0
    optimizers: Sequence[OptimizerUse] = ()
    mem: tuple[int, int, int] | None = None
    traced: bool = False
    comm: Sequence[BucketTiming] = ()
    clean: bool = False

    @property
    def duration_ns(self) -> int:
        return self.t1 - self.t0


_tuple_new = tuple.__new__


def new_step(
    i: int,
    t0: int,
    t1: int,
    wait: int,
    explicit: bool,
    micro: int,
    phases: Mapping[str, int],
    skipped: bool,
    eval_ns: int,
    optimizers: Sequence[OptimizerUse],
    clean: bool,
) -> StepRecord:
    """``StepRecord(...)`` with no ``mem``, ``traced`` or ``comm``, made by
    ``tuple.__new__`` directly: the class's own ``__new__`` is a Python frame
    entered from C, about twice the cost, and this runs once per step."""
    return _tuple_new(  # type: ignore[no-any-return]
        StepRecord,
        (
            i,
            t0,
            t1,
            wait,
            explicit,
            micro,
            phases,
            skipped,
            eval_ns,
            optimizers,
            None,
            False,
            (),
            clean,
        ),
    )


#: Phase that receives loader time spent *inside* a step (a micro-batch
#: fetched between backward and the next forward under gradient accumulation).
LOADER_PHASE = DATA_PHASE
#: Phase with gpuprof's own time inside a step (sending a burst of events).
OWN_PHASE = OWN_TIME_PHASE


class WaitTracker:
    """Decides each step's loader wait.

    Until :meth:`mark_explicit` is called (``prof.wrap_dataloader`` started
    iterating), a step's wait is the gap from the previous step's end (or
    the profile start, for the first step) to its start. After it, the wait
    is the sum of the timed ``next()`` calls between the previous step's
    end and this step's start, and the gap is no longer used.

    Timed ``next()`` calls made while a step is in progress are already part
    of its duration; counting them as wait would count them twice, so they
    go to the step's :data:`LOADER_PHASE` phase instead.
    """

    def __init__(self, start_ns: int) -> None:
        self.prev_end_ns = start_ns
        self.pending_ns = 0
        self.in_step_ns = 0
        self.explicit = False
        self.in_step = False

    def mark_explicit(self) -> None:
        self.explicit = True

    def step_started(self) -> None:
        """A step began: loader time from now on is inside it."""
        self.in_step = True

    def add_loader_wait(self, ns: int) -> None:
        """Count one timed ``next()`` of *ns* nanoseconds."""
        if self.in_step:
            self.in_step_ns += max(0, ns)
        else:
            self.pending_ns += max(0, ns)

    def finish_step(self, t0: int, t1: int) -> tuple[int, bool, int]:
        """Close the step that ran from *t0* to *t1*.

        Returns:
            ``(wait_ns, explicit, in_step_loader_ns)``; resets the counters
            and starts the next gap at *t1*.
        """
        if self.explicit:
            wait = self.pending_ns
        else:
            wait = max(0, t0 - self.prev_end_ns)
        inside = self.in_step_ns
        self.pending_ns = self.in_step_ns = 0
        self.in_step = False
        self.prev_end_ns = t1
        return wait, self.explicit, inside
