"""A run's steps as numpy columns: what :func:`gpuprof.insights.build_context`
computes its per-step figures from (a day is 172,800 steps: one pass per
column, not a dictionary walk per figure).

:func:`step_columns` builds them from step rows (dicts, the shape
``build_context`` documents); a columnar database read can build
:class:`StepColumns` directly and pass it instead. Pure (numpy, imported
on first use: the training process imports gpuprof too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepColumns:
    """One entry per step, in step order. Times in ns (int64)."""

    t0: Any
    """int64: the step's start (monotonic ns)."""
    t1: Any
    """int64: its end."""
    wait: Any
    """int64: the loader wait before it, ns."""
    explicit: Any
    """bool: the wait was timed by a wrapped DataLoader."""
    micro: Any
    """int64: micro-batches (1 where not given)."""
    step: Any
    """int64: the index it was recorded with (0 where ``numbered`` is False)."""
    numbered: bool
    """Every step carried an int ``step``."""
    traced: Any
    """bool: a profiler snapshot ran in it."""
    skipped: Any
    """bool: its optimizer update was skipped."""
    eval: Any
    """int64: evaluation ns attributed to it (0: none)."""
    mem_reserved: Any
    """int64: torch's reserved bytes (0 where ``has_mem`` is False)."""
    mem_peak: Any
    """int64: torch's peak allocated bytes."""
    has_mem: Any
    """bool: the step carried torch's allocator figures."""
    phases: Mapping[str, Any]
    """Phase name → int64 ns per step (0 where absent), names in the order
    they first appear."""
    has_phase: Mapping[str, Any]
    """Phase name → bool per step: the step listed that phase."""
    optimizers: tuple[Sequence[Mapping[str, Any]], ...] = ()
    """The steps' non-empty ``optimizers`` lists, in step order."""

    def __len__(self) -> int:
        return len(self.t0)

    def take(self, keep: Any) -> StepColumns:
        """The steps where the bool array *keep* is True (``optimizers``,
        summed over every step, kept whole)."""
        cols = {
            f: getattr(self, f)[keep]
            for f in (
                "t0",
                "t1",
                "wait",
                "explicit",
                "micro",
                "step",
                "traced",
                "skipped",
                "eval",
                "mem_reserved",
                "mem_peak",
                "has_mem",
            )
        }
        return StepColumns(
            **cols,
            numbered=self.numbered,
            phases={n: v[keep] for n, v in self.phases.items()},
            has_phase={n: v[keep] for n, v in self.has_phase.items()},
            optimizers=self.optimizers,
        )

    def between_steps_ns(self) -> Any:
        """int64 per step: the host time between the previous step's end and
        this step's start that neither its timed loader wait nor evaluation
        holds (a checkpoint, logging, a ``time.sleep``), ns; 0 for the first
        step, for a step whose wait was not timed (its ``wait`` is already
        the whole gap) and where the clocks overlap
        (:func:`gpuprof.window.between_steps_ns` over columns). Steps must be
        consecutive (call before :meth:`take`)."""
        import numpy as np

        out = np.zeros(len(self.t0), dtype=np.int64)
        if len(out) > 1:
            gap = self.t0[1:] - self.t1[:-1] - self.wait[1:] - self.eval[1:]
            out[1:] = np.where(self.explicit[1:], np.maximum(gap, 0), 0)
        return out

    def phase_order(self) -> list[str]:
        """The phase names these steps list, in the order they first appear."""
        import numpy as np

        first = {n: int(np.argmax(v)) for n, v in self.has_phase.items() if v.any()}
        rank = {n: i for i, n in enumerate(self.phases)}
        return sorted(first, key=lambda n: (first[n], rank[n]))


def step_columns(steps: Sequence[Mapping[str, Any]] | StepColumns) -> StepColumns:
    """*steps* (rows in :func:`gpuprof.insights.build_context`'s shape) as
    :class:`StepColumns`; columns are returned as given.

    Raises:
        KeyError: a step without ``t0``, ``t1`` or ``wait``.
    """
    if isinstance(steps, StepColumns):
        return steps
    import numpy as np

    n = len(steps)
    # one pass for the figures every step has: int64, one row per step
    core = np.array(
        [
            (
                s["t0"],
                s["t1"],
                s["wait"],
                s.get("micro", 1),
                s.get("eval") or 0,
                s.get("explicit") or 0,
                s.get("traced") or 0,
                s.get("skipped") or 0,
            )
            for s in steps
        ],
        dtype=np.int64,
    ).reshape(n, 8)
    numbers = [s.get("step") for s in steps]
    numbered = all(type(i) is int for i in numbers)
    mems = [(i, m[1], m[2]) for i, s in enumerate(steps) if (m := s.get("mem"))]
    mem = np.array(mems, dtype=np.int64).reshape(len(mems), 3)
    has_mem = np.zeros(n, dtype=bool)
    has_mem[mem[:, 0]] = True
    mem_reserved, mem_peak = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    mem_reserved[mem[:, 0]], mem_peak[mem[:, 0]] = mem[:, 1], mem[:, 2]
    phase_rows = [s.get("phases") or {} for s in steps]
    # steps with the same phase names (a run's steps mostly have) are read
    # column-wise: one numpy array per set of names, not a lookup per phase
    by_names: dict[tuple[str, ...], list[int]] = {}
    for i, p in enumerate(phase_rows):
        if p:
            by_names.setdefault(tuple(p), []).append(i)
    phases: dict[str, Any] = {}
    has_phase: dict[str, Any] = {}
    for names, where in by_names.items():
        idx = np.array(where, dtype=np.int64)
        values = np.array([tuple(phase_rows[i].values()) for i in where], dtype=np.int64)
        for j, name in enumerate(names):
            if name not in phases:
                phases[name] = np.zeros(n, dtype=np.int64)
                has_phase[name] = np.zeros(n, dtype=bool)
            phases[name][idx] = values[:, j]
            has_phase[name][idx] = True
    return StepColumns(
        t0=core[:, 0].copy(),
        t1=core[:, 1].copy(),
        wait=core[:, 2].copy(),
        explicit=core[:, 5] != 0,
        micro=core[:, 3].copy(),
        step=np.array(numbers if numbered else [0] * n, dtype=np.int64).reshape(n),
        numbered=numbered,
        traced=core[:, 6] != 0,
        skipped=core[:, 7] != 0,
        eval=core[:, 4].copy(),
        mem_reserved=mem_reserved,
        mem_peak=mem_peak,
        has_mem=has_mem,
        phases=phases,
        has_phase=has_phase,
        optimizers=tuple(o for s in steps if (o := s.get("optimizers"))),
    )
