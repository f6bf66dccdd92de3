"""A run's kernel table and the comparison of two runs' tables (pure).

Input: a run's kernel windows as :func:`gpuprofd.storage.reads.queries.kernel_windows_from_rows`
gives them (``(window, rows)`` pairs). Windows of different sources can cover
the same time (a snapshot step inside a continuous window), so one table sums
the windows of one source only (:func:`pick_source`).

Normalisation: a table's times are also given per step (when every window
lists the steps it covered: total / distinct steps) and per window, so runs
with different numbers of traced steps compare like for like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuprof.kernels import KernelAgg

#: Preference when a run has windows of several sources and none is asked
#: for: continuous windows cover the whole run; an nsys import every kernel of
#: its capture range; snapshots a few steps.
SOURCE_PREFERENCE = ("continuous", "nsys", "snapshot")
#: Rows shown by default in text output.
DEFAULT_TOP = 15
_NS_PER_MS = 1e6
_NS_PER_US = 1e3

Windows = Sequence[tuple[dict[str, Any], Sequence[KernelAgg]]]


def pick_source(
    windows: Windows,
    source: str | None = None,
    kind: str = "kernel",
    among: Sequence[str] = SOURCE_PREFERENCE,
) -> str | None:
    """*source* if given, else the first of *among* (default
    :data:`SOURCE_PREFERENCE`) whose windows hold *kind* rows with device
    time (a CPU run's continuous windows hold operators with FLOPs but no
    device time: an nsys import of the same run then wins), else the first
    that has a window at all (None: the run has no windows)."""
    if source is not None:
        return source
    timed = {
        w["source"] for w, rows in windows if any(r.kind == kind and r.total_ns > 0 for r in rows)
    }
    have = {w["source"] for w, _ in windows}
    return next((s for s in among if s in timed), None) or next(
        (s for s in among if s in have), None
    )


def common_source(a: Windows, b: Windows, kind: str = "kernel") -> str | None:
    """The first source, in :data:`SOURCE_PREFERENCE` order, in which both
    runs have *kind* rows with device time: comparing a run's continuous
    windows with another's nsys import would compare unlike things. None
    when they share none."""

    def timed(ws: Windows) -> set[str]:
        return {
            w["source"] for w, rows in ws if any(r.kind == kind and r.total_ns > 0 for r in rows)
        }

    both = timed(a) & timed(b)
    return next((s for s in SOURCE_PREFERENCE if s in both), None)


@dataclass(frozen=True)
class KernelLine:
    """One name's totals over the windows of a table."""

    name: str
    cls: str
    count: int
    total_ns: int
    share: float
    """Fraction (0-1) of the table's device time (its kind's rows)."""
    flops: float | None

    @property
    def mean_us(self) -> float:
        """Mean time per launch (call), µs."""
        return self.total_ns / self.count / _NS_PER_US if self.count else 0.0


@dataclass(frozen=True)
class KernelTable:
    """A run's per-name totals over the windows of one source."""

    source: str | None
    kind: str
    windows: int
    steps: int | None
    """Distinct steps the windows covered; None when some window lists none
    (then only per-window figures are meaningful)."""
    total_ns: int
    lines: tuple[KernelLine, ...]
    """Most device time first."""

    def per_step_ms(self, ns: int) -> float | None:
        return ns / self.steps / _NS_PER_MS if self.steps else None

    def per_window_ms(self, ns: int) -> float | None:
        return ns / self.windows / _NS_PER_MS if self.windows else None

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """JSON shape: times in ms (totals, per step, per window) and µs (mean);
        ``share`` a fraction of the table's device time."""
        lines = self.lines if top is None else self.lines[:top]
        return {
            "source": self.source,
            "kind": self.kind,
            "windows": self.windows,
            "steps": self.steps,
            "total_ms": round(self.total_ns / _NS_PER_MS, 3),
            "kernels": [
                {
                    "name": k.name,
                    "cls": k.cls,
                    "count": k.count,
                    "total_ms": round(k.total_ns / _NS_PER_MS, 3),
                    "share": round(k.share, 4),
                    "mean_us": round(k.mean_us, 2),
                    "per_step_ms": _round(self.per_step_ms(k.total_ns)),
                    "per_window_ms": _round(self.per_window_ms(k.total_ns)),
                    "flops": k.flops,
                }
                for k in lines
            ],
            "shown": len(lines),
            "of": len(self.lines),
        }

    def class_shares(self) -> dict[str, float]:
        """Fraction of device time per kernel class (compute, comm, ...)."""
        out: dict[str, float] = {}
        for k in self.lines:
            out[k.cls] = out.get(k.cls, 0.0) + k.share
        return {c: round(v, 4) for c, v in sorted(out.items(), key=lambda kv: -kv[1])}


def _round(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def build_table(windows: Windows, source: str | None = None, kind: str = "kernel") -> KernelTable:
    """Sum the *kind* rows (``"kernel"`` or ``"op"``) of the windows of
    *source* (default: :func:`pick_source`) by name."""
    src = pick_source(windows, source, kind)
    chosen = [(w, rows) for w, rows in windows if w["source"] == src]
    totals: dict[str, list[Any]] = {}
    steps: set[int] = set()
    every_window_has_steps = bool(chosen)
    for w, rows in chosen:
        if w.get("steps"):
            steps.update(w["steps"])
        else:
            every_window_has_steps = False
        for r in rows:
            if r.kind != kind:
                continue
            t = totals.setdefault(r.name, [r.cls, 0, 0, None])
            t[1] += r.count
            t[2] += r.self_ns if kind == "op" else r.total_ns
            if r.flops is not None:
                t[3] = (t[3] or 0.0) + r.flops
    grand = sum(t[2] for t in totals.values())
    lines = tuple(
        sorted(
            (
                KernelLine(name, cls, count, ns, ns / grand if grand else 0.0, flops)
                for name, (cls, count, ns, flops) in totals.items()
            ),
            key=lambda k: (-k.total_ns, k.name),
        )
    )
    return KernelTable(
        src, kind, len(chosen), len(steps) if every_window_has_steps else None, grand, lines
    )


@dataclass(frozen=True)
class CompareLine:
    name: str
    cls: str
    a_ms: float
    b_ms: float

    @property
    def delta_ms(self) -> float:
        return self.b_ms - self.a_ms

    @property
    def ratio(self) -> float | None:
        """``b / a``; None when the kernel did not run in A."""
        return self.b_ms / self.a_ms if self.a_ms > 0 else None


def compare(a: KernelTable, b: KernelTable) -> dict[str, Any]:
    """Per kernel name in either table: its time per step in A and in B (per
    window when either table lacks step counts: ``basis`` says which), the
    delta (B − A, ms) and the ratio B / A; largest growth first. Also the
    class totals on the same basis."""
    basis = "step" if a.steps and b.steps else "window"
    warnings = []
    if a.source is None or b.source is None:
        empty = "A" if a.source is None else "B"
        warnings.append(f"run {empty} has no kernel data: its column is empty")
    elif a.source != b.source:
        warnings.append(
            f"A's figures come from {a.source} windows, B's from {b.source} "
            "windows: not like for like"
        )
    for side, t in (("A", a), ("B", b)):
        if t.lines and not t.total_ns:
            warnings.append(
                f"run {side}'s {t.kind}s have no device time (a CPU-only run): its column is 0"
            )
    if basis == "window" and (a.steps or b.steps):
        warnings.append(
            "one run's windows are steps and the other's are not (a whole "
            "capture, or windows without step indices): per-window times differ "
            "by the window length, not by the kernels"
        )

    def norm(t: KernelTable, ns: int) -> float:
        v = t.per_step_ms(ns) if basis == "step" else t.per_window_ms(ns)
        return v or 0.0

    am = {k.name: k for k in a.lines}
    bm = {k.name: k for k in b.lines}
    lines = [
        CompareLine(
            name,
            (am.get(name) or bm[name]).cls,
            norm(a, am[name].total_ns) if name in am else 0.0,
            norm(b, bm[name].total_ns) if name in bm else 0.0,
        )
        for name in {*am, *bm}
    ]
    lines.sort(key=lambda c: (-c.delta_ms, c.name))
    classes: dict[str, list[float]] = {}
    for c in lines:
        t = classes.setdefault(c.cls, [0.0, 0.0])
        t[0] += c.a_ms
        t[1] += c.b_ms
    return {
        "basis": basis,
        "warnings": warnings,
        "a": {
            "source": a.source,
            "windows": a.windows,
            "steps": a.steps,
            "ms": round(norm(a, a.total_ns), 3),
        },
        "b": {
            "source": b.source,
            "windows": b.windows,
            "steps": b.steps,
            "ms": round(norm(b, b.total_ns), 3),
        },
        "classes": {
            cls: {
                "a_ms": round(x, 3),
                "b_ms": round(y, 3),
                "delta_ms": round(y - x, 3),
                "ratio": round(y / x, 3) if x > 0 else None,
            }
            for cls, (x, y) in sorted(classes.items(), key=lambda kv: kv[1][0] - kv[1][1])
        },
        "kernels": [
            {
                "name": c.name,
                "cls": c.cls,
                "a_ms": round(c.a_ms, 4),
                "b_ms": round(c.b_ms, 4),
                "delta_ms": round(c.delta_ms, 4),
                "ratio": None if c.ratio is None else round(c.ratio, 3),
            }
            for c in lines
        ],
    }


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _si(v: float) -> str:
    """``35328.0`` -> ``"35.3k"``, ``3.2985e12`` -> ``"3.3T"``."""
    for prefix in ("", "k", "M", "G", "T"):
        if abs(v) < 999.5:
            return f"{v:.3g}{prefix}"
        v /= 1000
    return f"{v:.3g}P"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def empty_reason(windows: Windows, t: KernelTable) -> str:
    """Why *t* (built from the run's *windows*) has no rows, and what to ask
    for instead: a CPU-only run's windows hold operators, not kernels."""
    if not windows:
        what = "kernels" if t.kind == "kernel" else "operators"
        return (
            f"no trace windows in this run: gpuprof records {what} only while tracing is on, "
            "and this run was not traced. Turn it on with "
            "gpuprof.profile(..., trace_every_n_steps=N) (a torch.profiler window of one step "
            "every N steps; or trace_range=(a, b), continuous_traces_hz=f), or attach an "
            "Nsight Systems report with gpuprofctl nsys-import"
        )
    mine = [rows for w, rows in windows if w["source"] == t.source]
    if not mine:
        have = sorted({w["source"] for w, _ in windows})
        return f"no {t.source} windows in this run (it has {', '.join(have)}: see --source)"
    kinds = {r.kind for rows in mine for r in rows}
    where = f"its {_plural(len(mine), f'{t.source} window')}"
    if t.kind == "kernel" and "op" in kinds:
        return (
            f"no GPU kernels in {where}, only operators (a CPU-only run): "
            "see --kind op for their FLOPs"
        )
    if t.kind == "op" and "kernel" in kinds:
        return f"no operators in {where}, only kernels: see --kind kernel"
    return f"no {t.kind} rows in {where}"


def format_table(t: KernelTable, top: int = DEFAULT_TOP, name_width: int = 60) -> str:
    """Text: one line per name (share %, count, mean µs, ms per step or
    window; operators also FLOP per step or window). Without device time (a
    CPU-only run's operators) only the counts and FLOPs, most FLOPs first."""
    if not t.lines:
        return f"no {t.kind} data for this run"
    per = "STEP" if t.steps else "WINDOW"
    timed = t.total_ns > 0
    flops = t.kind == "op" and any(k.flops for k in t.lines)
    head_row = ["NAME", "CLASS"]
    head_row += ["SHARE%", "COUNT", "MEAN_US", f"MS/{per}"] if timed else ["COUNT"]
    head_row += [f"FLOP/{per}"] if flops else []
    rows = [tuple(head_row)]
    lines = t.lines if timed else sorted(t.lines, key=lambda k: (-(k.flops or 0.0), k.name))
    for k in lines[:top]:
        row = [_short(k.name, name_width), k.cls]
        if timed:
            v = t.per_step_ms(k.total_ns) if t.steps else t.per_window_ms(k.total_ns)
            row += [f"{100 * k.share:.1f}", str(k.count), f"{k.mean_us:.1f}", f"{v or 0.0:.3f}"]
        else:
            row.append(str(k.count))
        if flops:
            row.append("-" if k.flops is None else _si(k.flops / (t.steps or t.windows)))
        rows.append(tuple(row))
    covered = f"{t.steps} steps" if t.steps else "steps unknown"
    head = f"{t.kind}s from {t.windows} {t.source} window(s), {covered}, "
    more = f"\n({len(t.lines) - top} more; --top N or --format json)" if len(t.lines) > top else ""
    if not timed:
        return (
            f"{head}no device time (a CPU-only run: gpuprof times GPU work; it keeps the "
            f"operators' calls and FLOPs, not their CPU time)\n{_grid(rows)}{more}"
        )
    head += f"{t.total_ns / _NS_PER_MS:.3f} ms device time"
    shares = ", ".join(f"{c} {100 * v:.1f}%" for c, v in t.class_shares().items())
    return f"{head}\nby class: {shares}\n{_grid(rows)}{more}"


def format_compare(
    cmp: dict[str, Any], a_label: str, b_label: str, top: int = DEFAULT_TOP, name_width: int = 60
) -> str:
    """Text of :func:`compare`: per class, then the kernels that changed most."""
    unit = "ms/step" if cmp["basis"] == "step" else "ms/window"
    lines = [
        f"A = {a_label}: {cmp['a']['ms']} {unit} of device time; "
        f"B = {b_label}: {cmp['b']['ms']} {unit}"
    ]
    lines += [f"warning: {w}" for w in cmp.get("warnings", ())]
    rows = [("CLASS", "A", "B", "DELTA", "RATIO")]
    for cls, c in cmp["classes"].items():
        rows.append(
            (
                cls,
                f"{c['a_ms']:.3f}",
                f"{c['b_ms']:.3f}",
                f"{c['delta_ms']:+.3f}",
                "-" if c["ratio"] is None else f"{c['ratio']:.2f}x",
            )
        )
    lines.append(_grid(rows))
    ks = sorted(cmp["kernels"], key=lambda k: -abs(k["delta_ms"]))[:top]
    rows = [("NAME", "CLASS", f"A_{unit}", f"B_{unit}", "DELTA", "RATIO")]
    for k in ks:
        rows.append(
            (
                _short(k["name"], name_width),
                k["cls"],
                f"{k['a_ms']:.3f}",
                f"{k['b_ms']:.3f}",
                f"{k['delta_ms']:+.3f}",
                "new" if k["ratio"] is None else f"{k['ratio']:.2f}x",
            )
        )
    lines.append(_grid(rows))
    return "\n\n".join(lines)


def _grid(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    )
