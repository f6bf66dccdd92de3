"""The end-of-run block the shim prints: the daemon's summary when it
answered ``bye``, else a reduced one built from the shim's own counters."""

from __future__ import annotations

import itertools
import logging
import operator
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from gpuprof.summary import format_summary
from gpuprof.window import between_steps_ns
from gpuprof_shim.steps import StepRecord

log = logging.getLogger("gpuprof.shim")

_T0, _T1, _WAIT, _CLEAN, _EXPLICIT, _EVAL = (
    operator.attrgetter(f) for f in ("t0", "t1", "wait", "clean", "explicit", "eval_ns")
)


class StepCounter:
    """Counts emitted steps and their iteration time (loader wait + the host
    time between steps outside a timed loader's wait + step, as
    ``gpuprof.summary`` averages it) for the local summary."""

    def __init__(self) -> None:
        self.steps = 0
        self.total_iteration_ns = 0
        self._prev_t1: int | None = None  # the last counted step's end, ns

    def add(self, iteration_ns: int) -> None:
        self.steps += 1
        if iteration_ns > 0:
            self.total_iteration_ns += iteration_ns

    def add_steps(self, steps: Sequence[StepRecord]) -> None:
        """Count a burst of finished steps."""
        if not steps:
            return
        self.steps += len(steps)
        if all(map(_CLEAN, steps)):  # t1 >= t0 and wait >= 0: three sums in C
            total = sum(map(_T1, steps)) - sum(map(_T0, steps)) + sum(map(_WAIT, steps))
        else:
            total = sum(max(0, r.t1 - r.t0 + r.wait) for r in steps)
        if any(map(_EXPLICIT, steps)):  # a timed loader: the time between steps apart
            prev = self._prev_t1
            if prev is not None and all(map(_EXPLICIT, steps)):
                # between_steps_ns for each step, in C: no Python call per step
                prevs = itertools.chain((prev,), map(_T1, steps))
                sub = operator.sub
                spans = map(sub, map(_T0, steps), prevs)
                gaps = map(sub, map(sub, spans, map(_WAIT, steps)), map(_EVAL, steps))
                total += sum(map(max, gaps, itertools.repeat(0)))
            else:
                for r in steps:
                    total += between_steps_ns(prev, r.t0, r.wait, r.eval_ns, r.explicit)
                    prev = r.t1
        self._prev_t1 = steps[-1].t1
        self.total_iteration_ns += total

    @property
    def avg_step_ms(self) -> float | None:
        """Mean iteration (wait + step) in ms, or None before the first step."""
        if not self.steps:
            return None
        return round(self.total_iteration_ns / self.steps / 1e6, 3)


def local_summary(
    *,
    run_name: str,
    status: str,
    counter: StepCounter,
    db: str | None,
    run_id: int | None,
    notes: Sequence[str],
) -> dict[str, Any]:
    """A summary dict shaped like ``gpuprof.summary.make_summary``'s, from
    local counters only: no median, no insights."""
    return {
        "run_id": run_id,
        "run_name": run_name,
        "status": status,
        "steps": counter.steps,
        "avg_step_ms": counter.avg_step_ms,
        "median_step_ms": None,
        "db": db,
        "insights": [],
        "notes": list(notes),
    }


def print_summary(summary: Mapping[str, Any], out: TextIO | None = None) -> bool:
    """Print *summary* with ``format_summary``; False (and nothing printed)
    if it cannot be formatted. Never raises."""
    try:
        text = format_summary(summary)
    except Exception:
        log.debug("gpuprof: could not format the summary", exc_info=True)
        return False
    try:
        print(text, file=out or sys.stdout, flush=True)
    except Exception:
        log.debug("gpuprof: could not print the summary", exc_info=True)
    return True


#: The summary block's line that gives the full report's command.
FULL_REPORT = "  Full report: "


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary block's lines without its two rules (``format_summary``);
    empty if it cannot be formatted. Never raises."""
    try:
        lines = format_summary(summary).splitlines()
    except Exception:
        log.debug("gpuprof: could not format the summary", exc_info=True)
        return []
    return [ln for ln in lines if not ln.startswith("─")]


def report_command(summary: Mapping[str, Any]) -> str | None:
    """The ``gpuprofctl insights ...`` command of the summary block's
    ``Full report:`` line; None when the block has none (no run id)."""
    for line in summary_lines(summary):
        if line.startswith(FULL_REPORT):
            return line[len(FULL_REPORT) :]
    return None
