"""Tiering of continuous kernel windows: old windows merged into coarse ones.

``continuous_traces_hz=f`` sends up to *f* ``kernels`` windows per second,
each up to :data:`gpuprof.kernels.MAX_ROWS` rows: at 1 Hz and ~100 kernels a
window that is ~8.6 M ``kernel_stats`` rows per rank per day. Like the GPU
samples (raw for a recent window, per-second rollups for the run), recent
continuous windows are kept as sent and older ones are merged, per run, into
windows of a fixed length (:data:`TIERS`): rows summed per (name, kind, cls),
``t0`` the first part's, ``t1`` the last part's, ``steps`` the union (or, past
:data:`STEPS_LIST_MAX`, its count and range), capped at ``MAX_ROWS`` rows with
the ``(other)`` row of :func:`gpuprof.kernels.fold_counted`. Snapshot and
``nsys`` windows are few and kept as they are.

Per-step figures stay right: a merged window's device ns over its step count
is the step-weighted mean of its parts' per-step ns, and
:func:`gpuprof.insights.kernels.kernel_drifts` splits the run's halves by
steps, not by window count.

One merge is one atomic store op (:meth:`gpuprofd.storage.writes.store.Store.write_atomic`):
the parts' rows and windows are deleted (each delete must remove exactly the
rows the merge read) and the merged window is inserted under the smallest
part's id, in one transaction; a crash leaves either the parts or the merged
window, never both or neither.

Pure, apart from :func:`compact_once` (reads through the store, writes
through its writer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gpuprof.kernels import MAX_ROWS, KernelAgg, fold_counted
from gpuprofd.storage import unreadable
from gpuprofd.storage.writes import Part, Store

log = logging.getLogger(__name__)

NS_PER_S = 1_000_000_000
#: (age, length): continuous windows that ended more than *age* seconds ago
#: are merged into windows of *length* seconds (aligned on the monotonic
#: clock). ``None`` age: the daemon's raw window (``--raw-window``, 15 min by
#: default, as raw GPU samples). One-minute windows keep a day's kernel_drift
#: series at 1,440 points; after 2 h, 10-minute windows (144 a day): a 24-hour
#: run sent at 1 Hz with 100 rows a window keeps ~1,000 rows per GPU-hour of
#: the 360,000 received, and loads in 0.18 s instead of 102 s (bench/storage.py).
TIERS: tuple[tuple[float | None, float], ...] = ((None, 60.0), (2 * 3600.0, 600.0))
#: A merged window lists its steps up to this many (10 Hz for 10 min is 6,000);
#: beyond it ``steps`` is stored as ``{"n": count, "first": i, "last": j}``.
STEPS_LIST_MAX = 10_000
#: Most part windows merged per transaction: bounds how long one compaction
#: holds the store's writer (600 windows x ~100 rows deletes in ~0.1 s).
MAX_PARTS = 600
#: Most merges per :func:`compact_once` pass (the next pass takes the rest).
MAX_MERGES_PER_PASS = 200

_WINDOWS_SQL = (
    "SELECT id, run_id, t0_ns, t1_ns, steps, rows_dropped FROM kernel_windows "
    "WHERE source = 'continuous' AND t1_ns < ? ORDER BY run_id, t0_ns, id"
)
_STATS_SQL = (
    "SELECT window_id, name, kind, cls, count, total_ns, self_ns, flops FROM kernel_stats "
    "WHERE run_id = ? AND window_id IN ({ids})"
)


@dataclass(frozen=True)
class StoredWindow:
    """One stored window to merge: its id, run, span (ns), steps JSON value and rows."""

    id: int
    run_id: int
    t0: int
    t1: int
    steps: Any
    rows_dropped: int = 0


def _steps(text: Any, run_id: int, window_id: int) -> Any:
    """A window's stored ``steps``: a list or a range form; none where it is
    not one (damaged: logged, :func:`gpuprofd.storage.unreadable.json_cell`)."""
    return unreadable.json_cell(
        text, "kernel_windows.steps", run_id, window_id, shape=(list, dict), empty=list
    )


def step_count(steps: Any) -> int:
    """How many steps a stored ``steps`` value covers: a list's length, or a
    range form's ``n`` (:data:`STEPS_LIST_MAX`); 0 when unknown."""
    if isinstance(steps, Mapping):
        return int(steps.get("n") or 0)
    return len(steps or ())


def merge_steps(parts: Iterable[Any]) -> Any:
    """The union of the parts' ``steps`` values: a sorted list while it has at
    most :data:`STEPS_LIST_MAX` entries, else ``{"n", "first", "last"}`` (range
    forms count their ``n``: continuous windows never share a step)."""
    listed: set[int] = set()
    extra = 0
    lo: list[int] = []
    hi: list[int] = []
    for s in parts:
        if isinstance(s, Mapping):
            extra += int(s.get("n") or 0)
            if s.get("first") is not None:
                lo.append(int(s["first"]))
                hi.append(int(s["last"]))
        elif s:
            listed.update(int(i) for i in s)
    if not extra and len(listed) <= STEPS_LIST_MAX:
        return sorted(listed)
    if listed:
        lo.append(min(listed))
        hi.append(max(listed))
    return {"n": len(listed) + extra, "first": min(lo, default=None), "last": max(hi, default=None)}


def merge_rows(rows: Iterable[KernelAgg], max_rows: int = MAX_ROWS) -> tuple[list[KernelAgg], int]:
    """Rows summed per (name, kind, cls) (count, total_ns, self_ns, flops
    added; flops None only when every part's was), most device time first,
    cut to *max_rows* with ``(other)`` rows; and how many rows were cut."""
    acc: dict[tuple[str, str, str], list[Any]] = {}
    for r in rows:
        a = acc.get((r.name, r.kind, r.cls))
        if a is None:
            acc[(r.name, r.kind, r.cls)] = [r.count, r.total_ns, r.self_ns, r.flops]
            continue
        a[0] += r.count
        a[1] += r.total_ns
        a[2] += r.self_ns
        if r.flops is not None:
            a[3] = (a[3] or 0.0) + r.flops
    summed = [KernelAgg(n, k, c, a[0], a[1], a[2], a[3]) for (n, k, c), a in acc.items()]
    return fold_counted(summed, max_rows)


def merge_windows(
    parts: Sequence[StoredWindow], rows: Mapping[int, Sequence[KernelAgg]]
) -> tuple[dict[str, Any], list[KernelAgg]]:
    """One window (``t0``, ``t1``, ``source`` "continuous", ``steps``,
    ``rows_dropped``) and its rows from *parts* (in time order) and their rows
    by window id. ``rows_dropped`` adds the parts' and the rows cut here."""
    merged, cut = merge_rows(r for p in parts for r in rows.get(p.id, ()))
    window = {
        "t0": min(p.t0 for p in parts),
        "t1": max(p.t1 for p in parts),
        "source": "continuous",
        "steps": merge_steps(p.steps for p in parts),
        "rows_dropped": sum(p.rows_dropped for p in parts) + cut,
    }
    return window, merged


def plan(
    windows: Sequence[StoredWindow],
    now_ns: int,
    raw_window_s: float,
    tiers: Sequence[tuple[float | None, float]] = TIERS,
) -> list[list[StoredWindow]]:
    """Groups of *windows* (continuous, in (run, t0) order) to merge now:
    per tier, the windows that ended more than the tier's age before
    *now_ns*, grouped by run and by the tier-length slot their ``t0`` falls
    in; groups of one are left alone (already merged, or alone in the slot).
    A window is in at most one group (the coarsest tier it is old enough
    for); groups hold at most :data:`MAX_PARTS` windows."""
    taken: set[int] = set()
    out: list[list[StoredWindow]] = []
    for age_s, length_s in sorted(tiers, key=lambda t: -t[1]):
        cutoff = now_ns - int((raw_window_s if age_s is None else age_s) * NS_PER_S)
        slot_ns = int(length_s * NS_PER_S)
        groups: dict[tuple[int, int], list[StoredWindow]] = {}
        for w in windows:
            if w.t1 < cutoff and w.id not in taken:
                groups.setdefault((w.run_id, w.t0 // slot_ns), []).append(w)
        for group in groups.values():
            for i in range(0, len(group), MAX_PARTS):
                chunk = group[i : i + MAX_PARTS]
                if len(chunk) > 1:
                    out.append(chunk)
                    taken.update(p.id for p in chunk)
    return out


def merge_parts(
    parts: Sequence[StoredWindow], rows: Mapping[int, Sequence[KernelAgg]], n_stats: int
) -> list[Part]:
    """The statements that replace *parts* by their merge, all or none:
    delete the parts' *n_stats* stats rows and their windows (each must
    delete exactly those: a row written since the read aborts the merge),
    insert the merged window under the smallest part id, then its rows."""
    window, merged = merge_windows(parts, rows)
    run_id, new_id = parts[0].run_id, min(p.id for p in parts)
    ids = [p.id for p in parts]
    marks = ", ".join("?" * len(ids))
    steps_json = orjson.dumps(window["steps"]).decode()
    return [
        Part(
            f"DELETE FROM kernel_stats WHERE run_id = ? AND window_id IN ({marks})",
            ((run_id, *ids),),
            expect_rows=n_stats,
        ),
        Part(
            f"DELETE FROM kernel_windows WHERE run_id = ? AND id IN ({marks})",
            ((run_id, *ids),),
            expect_rows=len(ids),
        ),
        Part(
            "INSERT INTO kernel_windows (id, run_id, t0_ns, t1_ns, source, steps, rows_dropped) "
            "VALUES (?, ?, ?, ?, 'continuous', ?, ?)",
            ((new_id, run_id, window["t0"], window["t1"], steps_json, window["rows_dropped"]),),
        ),
        Part(
            "INSERT INTO kernel_stats (window_id, run_id, name, kind, cls, count, total_ns, "
            "self_ns, flops) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(new_id, run_id, *r.to_wire()) for r in merged],
            expect_rows=len(merged),
        ),
    ]


async def compact_once(store: Store, now_ns: int, raw_window_s: float) -> int:
    """Merge what :func:`plan` finds (at most :data:`MAX_MERGES_PER_PASS`
    groups), one transaction per group, awaiting each commit so ingest ops
    interleave. A group whose merge fails (rows changed meanwhile, a disk
    error) is logged and left as it was. Returns the part windows merged."""
    rows = await store.fetchall(_WINDOWS_SQL, (now_ns - int(raw_window_s * NS_PER_S),))
    windows = [
        StoredWindow(r[0], r[1], r[2], r[3], _steps(r[4], r[1], r[0]), r[5] or 0) for r in rows
    ]
    merged = 0
    for group in plan(windows, now_ns, raw_window_s)[:MAX_MERGES_PER_PASS]:
        ids = [p.id for p in group]
        stats = await store.fetchall(
            _STATS_SQL.format(ids=", ".join("?" * len(ids))), (group[0].run_id, *ids)
        )
        by_id: dict[int, list[KernelAgg]] = {}
        for wid, *row in stats:
            by_id.setdefault(wid, []).append(KernelAgg.from_stored(row))
        parts = merge_parts(group, by_id, len(stats))
        if not parts[-1].rows:  # no rows: nothing to insert (executemany of none)
            parts = parts[:-1]
        try:
            await store.write_atomic(parts, label=f"compact {len(group)} kernel windows")
        except Exception as exc:  # noqa: BLE001 - left as it was; the next pass retries
            log.warning("kernel window compaction of %d windows skipped: %s", len(group), exc)
            continue
        merged += len(group)
    return merged
