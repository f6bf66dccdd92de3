"""The parts auto mode's step machine (:mod:`gpuprof_shim.auto`) builds
steps from: a :class:`Segment` (one step's accumulators, ns), the
:class:`Gap` between steps (no-grad calls and loader time: evaluation or a
step's prelude), and references to optimizers that never keep one alive.
Plain data and small pure helpers; the machine owns the transitions.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuprof_shim.steps import OptimizerUse

#: Most no-grad calls that can be a step's prelude (a teacher, maybe a
#: second frozen model); a longer chain right before training is an eval loop.
PRELUDE_MAX_CALLS = 2
#: A no-grad call ending this close (ns) to the training forward (or to the
#: prelude call) after it is chained to it. Python glue between a teacher
#: and a student takes microseconds; a loader fetch shorter than 1 ms
#: between them would be counted as step time, too short to matter.
ADJACENT_NS = 1_000_000


@dataclass(slots=True)
class Segment:
    """Accumulators of one step, or of activity that may become one (ns)."""

    t0: int = 0
    last_ns: int = 0
    end_ns: int = 0
    forward_ns: int = 0
    backward_ns: int = 0
    optimizer_ns: int = 0
    between_ns: int = 0
    loader_ns: int = 0
    loader_in_forward_ns: int = 0
    own_ns: int = 0  # gpuprof's own work (sending events) inside the step
    gap_own_ns: int = 0  # ... and in the gap before it (not loader wait)
    wait_ns: int = 0
    eval_ns: int = 0
    micro: int = 0
    closure_micro: int = 0
    primary_done: bool = False
    skipped: bool = False
    # optimizer index -> its share of the step, as the event carries it
    optim: dict[int, OptimizerUse] = field(default_factory=dict)

    @property
    def started(self) -> bool:
        return self.t0 != 0

    def absorb(self, tail: Segment) -> None:
        """Take *tail*'s work into this step (another optimizer's turn):
        its backward calls are not micro-batches, its loader time is
        in-step loading."""
        self.forward_ns += tail.forward_ns
        self.backward_ns += tail.backward_ns
        self.optimizer_ns += tail.optimizer_ns
        self.between_ns += tail.between_ns
        self.loader_ns += tail.loader_ns + tail.wait_ns
        self.loader_in_forward_ns += tail.loader_in_forward_ns
        self.own_ns += tail.own_ns + tail.gap_own_ns
        self.eval_ns += tail.eval_ns
        self.last_ns = max(self.last_ns, tail.last_ns)
        optim = self.optim
        for idx, use in tail.optim.items():
            mine = optim.get(idx)
            if mine is None:
                optim[idx] = use  # the tail is dropped after: its entry moves here
            else:
                mine["updates"] += use["updates"]
                mine["skipped"] += use["skipped"]
                mine["ns"] += use["ns"]


class Gap:
    """No-grad calls and loader time (ns) seen while no segment is in progress.

    Loader time is kept as: before the first call (``before_ns``), since the
    last call (``after_ns``), and before each of the last few calls (in
    ``recent``, to tell a prelude's loading from an eval loop's); older
    between-call loading is an eval loop's own (``during_ns``). The first
    ``sealed`` calls are known evaluation (a framework said its eval loop
    ended) and never a prelude.
    """

    __slots__ = (
        "calls",
        "first_ns",
        "before_ns",
        "during_ns",
        "after_ns",
        "recent",
        "sealed",
        "all_chained",
        "iter_ns",
        "after_iter_ns",
        "iter_loading_ns",
        "iter_call",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.first_ns = 0
        self.before_ns = 0
        self.during_ns = 0
        self.after_ns = 0
        self.recent: list[tuple[int, int, int]] = []  # (start, end, loader before it)
        self.sealed = 0
        self.all_chained = True  # every call ended within ADJACENT_NS of the next
        self.iter_ns = 0  # a loader iterator created since the last call, at
        self.after_iter_ns = 0  # loading since then
        self.iter_loading_ns = 0  # a new iterator's loading before a no-grad call ...
        self.iter_call = -1  # ... and that call's index

    def add_call(self, t_start: int, t_end: int) -> None:
        span_start = t_start
        if self.iter_ns:
            # a no-grad call right after a new loader iterator: a validation
            # loader; its start-up (workers, first batch) is the eval loop's
            # (unless this call turns out to be a teacher's: see _start_segment)
            self.after_ns -= self.after_iter_ns
            self.iter_loading_ns, self.iter_call = self.after_iter_ns, self.calls
            span_start = min(t_start, self.iter_ns)
            self.iter_ns = self.after_iter_ns = 0
        if self.recent and t_start - self.recent[-1][1] > ADJACENT_NS:
            self.all_chained = False
        if self.calls:
            loader_before = self.after_ns
        else:
            self.first_ns = span_start
            self.before_ns += self.after_ns
            loader_before = 0
        self.after_ns = 0
        self.calls += 1
        self.recent.append((t_start, max(t_start, t_end), loader_before))
        if len(self.recent) > PRELUDE_MAX_CALLS + 1:
            self.during_ns += self.recent.pop(0)[2]

    def prelude_calls(self, t: int, *, unlimited: bool = False) -> int:
        """How many of the last calls chain into a training forward at *t*
        (0 if none, or if the chain is longer than a prelude can be, unless
        *unlimited*: then every chained call, at most those kept)."""
        chain, nxt = 0, t
        for start, end, _ in reversed(self.recent):
            if nxt - end > ADJACENT_NS or chain >= self.calls - self.sealed:
                break
            chain, nxt = chain + 1, start
        if unlimited:
            if chain == len(self.recent) and self.all_chained and not self.sealed:
                return self.calls  # the whole gap's calls, older ones included
            return chain
        return chain if chain <= PRELUDE_MAX_CALLS else 0

    def eval_span(self, prelude: int) -> int:
        """Span (ns) from the first call to the end of the last one that is
        not part of the prelude; 0 if every call is."""
        if self.calls <= prelude:
            return 0
        return max(0, self.recent[-1 - prelude][1] - self.first_ns)


def ref_to(obj: Any, callback: Callable[[Any], None] | None = None) -> Callable[[], Any]:
    """A weak reference where the object allows one, else a strong one:
    either way a callable that returns the object (or None once it is gone)."""
    try:
        return weakref.ref(obj, callback) if callback else weakref.ref(obj)
    except TypeError:
        return StrongRef(obj)


class StrongRef:
    """A strong reference that reads like a weak one (``ref()``)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def deref(ref: Callable[[], Any]) -> Any:
    return ref()
