"""The summary's notes that come from the shim's own parts (FLOP counter,
trace windows, DDP comm timing, clock alignment, the step machine, the
database actually used, an auto-mode run that found no step), added to the
summary printed at exit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Why an auto-mode run found no step, and what to do, by its step source.
NO_STEPS = {
    "optimizer": (
        "0 steps: auto mode counts a step at each optimizer.step() (or a framework "
        "callback's step end) and this run made none; for inference or a custom loop, "
        "use gpuprof.profile(..., auto=False) and `with prof.step(i):` around each iteration"
    ),
    "external": (
        "0 steps: with step_source='external' a step ends at each mark_step_end() "
        "(a framework callback's step end) and none came"
    ),
}


def no_steps_note(*, auto: bool, step_source: str, steps: int, failed: bool) -> str | None:
    """The one line saying why an auto-mode run that ended normally counted
    no step, and what to do; None for any other run."""
    if not auto or steps or failed:
        return None
    return NO_STEPS.get(step_source)


def add_notes(
    summary: dict[str, Any],
    *,
    no_steps: str | None = None,
    flop_note: str | None,
    tracer: Any,
    comm: Any,
    aligner: Any,
    unfinished_micro: int,
    requested_db: str,
    socket_dir: Path,
) -> None:
    """Put *no_steps* first in ``summary["notes"]``, then append each
    part's lines (in this order)."""
    if no_steps:  # first: it explains the rest of an empty summary
        summary.setdefault("notes", []).insert(0, no_steps)
    notes: list[str] = []
    if flop_note:
        notes.append(flop_note)
    if tracer is not None and tracer.notes:
        notes.extend(tracer.notes)
    if comm is not None:
        notes.extend(comm.summary_notes() or [])
    aligner_note = getattr(aligner, "note", None)
    if isinstance(aligner_note, str) and aligner_note:
        notes.append(aligner_note)
    if unfinished_micro:
        notes.append(
            f"{unfinished_micro} micro-batch{'es' if unfinished_micro > 1 else ''} after the "
            "last optimizer update (no update followed) not counted as a step"
        )
    if summary.get("db") and summary["db"] != requested_db:
        notes.append(
            f"stored in {summary['db']}, the database of the gpuprofd at {socket_dir}, "
            f"not {requested_db}"
        )
    if notes:
        summary.setdefault("notes", []).extend(notes)
