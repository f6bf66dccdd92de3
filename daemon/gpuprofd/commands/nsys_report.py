"""Read the SQLite file ``nsys export --type sqlite`` writes (read-only) and
fold its device activity into :class:`gpuprof.kernels.KernelAgg` rows aligned
with a run's steps.

The export's schema (NVIDIA, "SQLite Export Schema Reference",
https://docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html):
``StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)`` holds every
string; ``CUPTI_ACTIVITY_KIND_KERNEL`` one row per kernel run with ``start`` /
``end`` (ns), ``deviceId``, ``streamId``, and its names as ``StringIds`` ids
(``demangledName``, ``shortName``; ``mangledName`` only in recent versions —
the Analysis Guide: "the ability to display mangled names is a recent
addition to the report file format"); ``CUPTI_ACTIVITY_KIND_MEMCPY``
(``copyKind``, ``bytes``) and ``CUPTI_ACTIVITY_KIND_MEMSET`` the copies and
fills. "Tables are created lazily", so a report without a kind of activity
lacks its table. Versions differ in which name columns exist, so the name
column is looked up (:data:`NAME_COLUMNS`), and a name column holding text
instead of ids is read as text.
"""

from __future__ import annotations

import bisect
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprof.kernels import KernelAgg, fold_counted, kernel_class, shorten_name
from gpuprof.protocol import MAX_DURATION_NS, clean_text
from gpuprofd.core.errors import BadInputError
from gpuprofd.storage.sqlite import connect_ro

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
STRINGS_TABLE = "StringIds"
#: Kernel name columns, preferred first: the demangled name is what
#: torch.profiler (Kineto) shows, so runs compare across sources; the short
#: name (no template arguments) where an export lacks it.
NAME_COLUMNS = ("demangledName", "shortName", "mangledName", "name")
#: ``StringIds`` text columns, documented first.
STRING_VALUE_COLUMNS = ("value", "name", "string")
#: Tables whose presence marks an Nsight Systems export (any one).
NSYS_MARKERS = frozenset(
    {
        STRINGS_TABLE,
        KERNEL_TABLE,
        MEMCPY_TABLE,
        MEMSET_TABLE,
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "TARGET_INFO_SESSION_START_TIME",
        "TARGET_INFO_GPU",
        "ThreadNames",
        "NVTX_EVENTS",
    }
)
#: CUPTI's ``CUpti_ActivityMemcpyKind`` (cupti_activity.h), the export's
#: ``copyKind``, named as Kineto names copies (``Memcpy HtoD``).
MEMCPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
#: Rows read per fetch; progress is reported every this many.
CHUNK_ROWS = 200_000


@dataclass(frozen=True)
class Activity:
    """One device activity (kernel, copy or fill): its name, class, start and
    end (ns, the report's clock) and device."""

    name: str
    cls: str
    start: int
    end: int
    device: int | None


@dataclass
class Report:
    """What :func:`open_report` found in an export."""

    path: Path
    conn: sqlite3.Connection
    tables: frozenset[str]
    name_column: str | None
    """The kernel name column used (None: no kernel table)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Rows per activity table present (kernel, memcpy, memset)."""
    session_start_utc_ns: int | None = None
    """``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` when present."""
    notes: list[str] = field(default_factory=list)
    bad_rows: int = 0
    """Activity rows :func:`activities` left out: non-integer times, ``end <
    start``, or longer than ``gpuprof.protocol.MAX_DURATION_NS``."""

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def close(self) -> None:
        self.conn.close()


def _not_nsys(path: Path, why: str) -> BadInputError:
    return BadInputError(
        f"{path} is not an Nsight Systems SQLite export ({why}); make one with "
        "`nsys export --type sqlite REPORT.nsys-rep`"
    )


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def open_report(path: Path) -> Report:
    """Open *path* read-only and check it is an nsys SQLite export.

    Raises:
        BadInputError: missing, not SQLite, or not an nsys export (one line).
    """
    if not path.exists():
        raise BadInputError(f"no file at {path}")
    if path.is_dir():
        raise BadInputError(f"{path} is a directory, not an nsys SQLite export")
    try:
        conn = connect_ro(path)
        tables = frozenset(
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        )
    except sqlite3.DatabaseError as exc:
        raise _not_nsys(path, f"not a readable SQLite file: {exc}") from None
    try:
        if "meta" in tables and "runs" in tables:
            raise _not_nsys(path, "it is a gpuprof database")
        if not tables & NSYS_MARKERS:
            raise _not_nsys(path, "none of its tables is one nsys writes")
        activity = tables & {KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE}
        report = Report(path, conn, tables, None)
        for table in sorted(activity):
            cols = set(_columns(conn, table))
            if not {"start", "end"} <= cols:
                raise _not_nsys(path, f"{table} has no start/end columns")
            if table == KERNEL_TABLE:
                report.name_column = next((c for c in NAME_COLUMNS if c in cols), None)
                if report.name_column is None:
                    raise _not_nsys(path, f"{table} has none of the name columns {NAME_COLUMNS}")
            report.counts[table] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        if "TARGET_INFO_SESSION_START_TIME" in tables:
            if "utcEpochNs" in _columns(conn, "TARGET_INFO_SESSION_START_TIME"):
                row = conn.execute(
                    "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1"
                ).fetchone()
                if row and isinstance(row[0], int):
                    report.session_start_utc_ns = row[0]
        return report
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _not_nsys(path, f"unreadable: {exc}") from None
    except BadInputError:
        conn.close()
        raise


def _strings(report: Report) -> Callable[[object], str]:
    """Resolve a name column value: a ``StringIds`` id, or text already."""
    table: dict[int, str] = {}
    if STRINGS_TABLE in report.tables:
        cols = _columns(report.conn, STRINGS_TABLE)
        value = next((c for c in STRING_VALUE_COLUMNS if c in cols), None)
        if value is not None and "id" in cols:
            table = dict(report.conn.execute(f'SELECT id, "{value}" FROM {STRINGS_TABLE}'))

    def resolve(v: object) -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, int):
            return str(table.get(v, f"(string {v})"))
        return "(unnamed)"

    return resolve


def _memcpy_name(kind: object) -> str:
    """``Memcpy HtoD`` etc. from CUPTI's copy kind, as Kineto names copies
    (so tables of both sources share names)."""
    if isinstance(kind, int) and kind in MEMCPY_KINDS:
        return f"Memcpy {MEMCPY_KINDS[kind]}"
    return "Memcpy"


def activities(
    report: Report, progress: Callable[[int, int], None] | None = None
) -> Iterator[Activity]:
    """Every kernel, copy and fill of the report (rows with non-integer
    times, ``end < start`` or a duration over ``MAX_DURATION_NS`` skipped and
    counted in ``report.bad_rows``; names made printable); *progress(done, total)* every
    :data:`CHUNK_ROWS` rows."""
    resolve = _strings(report)
    done = 0
    for table in (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE):
        if table not in report.counts:
            continue
        cols = set(_columns(report.conn, table))
        device = "deviceId" if "deviceId" in cols else "NULL"
        if table == KERNEL_TABLE:
            extra = f'"{report.name_column}"'
        elif table == MEMCPY_TABLE:
            extra = "copyKind" if "copyKind" in cols else "NULL"
        else:
            extra = "NULL"
        cur = report.conn.execute(f'SELECT start, "end", {device}, {extra} FROM {table}')
        while rows := cur.fetchmany(CHUNK_ROWS):
            for start, end, dev, x in rows:
                if (
                    type(start) is not int
                    or type(end) is not int
                    or not 0 <= end - start <= MAX_DURATION_NS
                ):
                    report.bad_rows += 1
                    continue
                if table == KERNEL_TABLE:
                    name = shorten_name(clean_text(resolve(x), 4096).strip() or "(unnamed)")
                    cls = kernel_class(name)
                elif table == MEMCPY_TABLE:
                    name, cls = _memcpy_name(x), "memcpy"
                else:
                    name, cls = "Memset", "memset"
                yield Activity(name, cls, start, end, dev if type(dev) is int else None)
            done += len(rows)
            if progress is not None:
                progress(done, report.total)


def time_range(report: Report, device: int | None = None) -> tuple[int, int] | None:
    """(earliest start, latest end) of the report's activity, ns of its clock
    (of *device* only when given); None without any."""
    lo: int | None = None
    hi: int | None = None
    for table in report.counts:
        where = ""
        params: tuple[int, ...] = ()
        if device is not None and "deviceId" in _columns(report.conn, table):
            where, params = " WHERE deviceId = ?", (device,)
        row = report.conn.execute(
            f'SELECT MIN(start), MAX("end") FROM {table}{where}', params
        ).fetchone()
        if row and type(row[0]) is int and type(row[1]) is int:
            lo = row[0] if lo is None else min(lo, row[0])
            hi = row[1] if hi is None else max(hi, row[1])
    return None if lo is None or hi is None else (lo, hi)


def devices(report: Report) -> list[int]:
    """The device ids the report's activity ran on."""
    out: set[int] = set()
    for table in report.counts:
        if "deviceId" in _columns(report.conn, table):
            out.update(
                r[0]
                for r in report.conn.execute(f"SELECT DISTINCT deviceId FROM {table}")
                if type(r[0]) is int
            )
    return sorted(out)


@dataclass(frozen=True)
class Step:
    """A step of the run: its index and monotonic ns span."""

    index: int
    t0: int
    t1: int


def choose_alignment(
    span: tuple[int, int],
    steps: Sequence[Step],
    run_start_wall_ns: int | None = None,
    run_start_mono_ns: int | None = None,
    session_start_utc_ns: int | None = None,
) -> tuple[str, int] | None:
    """How to map the report's clock onto the run's steps (ordered by t0):
    ``("monotonic", 0)`` when the report's timestamps overlap the steps (the
    run's ``CLOCK_MONOTONIC``); else ``("wall", shift)`` when the report's
    session UTC start and the run's wall/monotonic anchor map it onto them
    (timestamps relative to the session start; as accurate as the two clocks
    agree, about a millisecond on one host); else None (no alignment)."""
    if not steps:
        return None
    lo, hi = span
    candidates: list[tuple[str, int]] = [("monotonic", 0)]
    if (
        run_start_wall_ns is not None
        and run_start_mono_ns is not None
        and session_start_utc_ns is not None
    ):
        candidates.append(("wall", session_start_utc_ns - run_start_wall_ns + run_start_mono_ns))
    for how, shift in candidates:
        if lo + shift <= steps[-1].t1 and hi + shift >= steps[0].t0:
            return how, shift
    return None


@dataclass
class Collected:
    """A report's activity summed per window."""

    windows: list[tuple[dict[str, Any], list[KernelAgg]]]
    """``(window, rows)`` as the daemon stores them: one per step with
    activity (``t0``/``t1`` the step's span in the run's monotonic ns, up to
    the next step's start), or one for the whole report when not aligned
    (``steps`` empty; see :func:`collect`'s *place_at*)."""
    activities: int = 0
    outside: int = 0
    """Activities outside every step (before the first, after the last)."""


def collect(
    report: Report,
    steps: Sequence[Step],
    shift: int | None,
    device: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    place_at: int | None = None,
) -> Collected:
    """Sum the report's activity by step (*shift*: report ns + shift = run
    monotonic ns; None: one window, starting at *place_at* (run monotonic
    ns: its length is the report's span) or, when None, at the report's own
    ns). A step owns [its t0, the next step's t0), so its device work that
    runs on into the next loader wait stays its own, and the last step up to
    its t1. Streams the rows and keeps per-name sums only (memory stays flat
    for big reports)."""
    starts = [s.t0 for s in steps]
    sums: dict[int, dict[str, list[Any]]] = {}
    out = Collected([])
    lo = hi = None
    for a in activities(report, progress):
        if device is not None and a.device is not None and a.device != device:
            continue
        out.activities += 1
        if shift is None:
            key = 0
            lo = a.start if lo is None else min(lo, a.start)
            hi = a.end if hi is None else max(hi, a.end)
        else:
            t = a.start + shift
            key = bisect.bisect_right(starts, t) - 1
            if key < 0 or (key == len(steps) - 1 and t > steps[-1].t1):
                out.outside += 1
                continue
        t = sums.setdefault(key, {}).setdefault(a.name, [a.cls, 0, 0])
        t[1] += 1
        t[2] += a.end - a.start
    for key in sorted(sums):
        rows, dropped = fold_counted(
            KernelAgg(name, "kernel", cls, n, ns, ns) for name, (cls, n, ns) in sums[key].items()
        )
        if shift is None:
            t0 = lo or 0 if place_at is None else place_at
            w = {"t0": t0, "t1": t0 + (hi or 0) - (lo or 0), "steps": []}
        else:
            end = steps[key + 1].t0 if key + 1 < len(steps) else steps[key].t1
            w = {"t0": steps[key].t0, "t1": max(end, steps[key].t0), "steps": [steps[key].index]}
        out.windows.append(({**w, "source": "nsys", "rows_dropped": dropped}, rows))
    return out
