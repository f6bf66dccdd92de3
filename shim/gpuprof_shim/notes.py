"""The summary's notes that come from the shim's own parts (FLOP counter,
trace windows, DDP comm timing, clock alignment, the step machine, the
database actually used), added to the summary printed at exit."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_notes(
    summary: dict[str, Any],
    *,
    flop_note: str | None,
    tracer: Any,
    comm: Any,
    aligner: Any,
    unfinished_micro: int,
    requested_db: str,
    socket_dir: Path,
) -> None:
    """Append each part's lines to ``summary["notes"]`` (in this order)."""
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
