"""What the auto-mode step machine sees between steps: the no-grad module
calls and loader time while no step is in progress, and which of those calls
are a step's prelude (a teacher's forward chained into the student's) and
which are evaluation (see *Evaluation* and *Loader wait* in
:mod:`gpuprof_shim.auto.machine`). Pure: fed timestamps (monotonic ns)."""

from __future__ import annotations

#: Most no-grad calls that can be a step's prelude (a teacher, maybe a
#: second frozen model); a longer chain right before training is an eval loop.
PRELUDE_MAX_CALLS = 2
#: A no-grad call ending this close (ns) to the training forward (or to the
#: prelude call) after it is chained to it. Python glue between a teacher
#: and a student takes microseconds; a loader fetch shorter than 1 ms
#: between them would be counted as step time, too short to matter.
ADJACENT_NS = 1_000_000


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
        """A no-grad outermost module call ran from *t_start* to *t_end* (ns)."""
        span_start = t_start
        if self.iter_ns:
            # a no-grad call right after a new loader iterator: a validation
            # loader; its start-up (workers, first batch) is the eval loop's
            # (unless this call turns out to be a teacher's: see
            # StepMachine._start_segment)
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
