"""Kernel and operator aggregates: what the GPU spent a window on.

The shim folds ``torch.profiler`` events into :class:`KernelAgg` rows (never
whole traces over the socket); ``gpuprofctl nsys-import`` folds an Nsight
Systems export into the same rows; the daemon stores them per window and the
kernel rules read them. Pure: no torch, no I/O.

Wire form (one ``kernels`` event per window, see ``gpuprof.protocol``)::

    {"v": 1, "type": "kernels", "run_key": ..., "t0": ns, "t1": ns,
     "source": "snapshot" | "continuous" | "nsys" | "evidence", "steps": [i, ...],
     "rows": [[name, kind, cls, count, total_ns, self_ns, flops], ...],
     "rows_dropped": n}

``t0``/``t1`` are the window's monotonic ns; ``steps`` the step indices it
covered (a snapshot's traced step(s)); ``rows_dropped`` how many rows were cut
to keep the message under :data:`MAX_ROWS` (their time is in an ``(other)`` row).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprof.text import clean_text

#: Kernel classes: time on the SMs, collectives (NCCL), copies, fills, the rest.
KERNEL_CLASSES = ("compute", "comm", "memcpy", "memset", "other")
#: Row kinds: a device kernel, or a framework operator (``aten::mm``) with
#: its self device time and FLOPs.
KINDS = ("kernel", "op")
#: ``evidence``: a window the daemon asked for to explain a finding (gpuprof.evidence).
SOURCES = ("snapshot", "continuous", "nsys", "evidence")
#: Rows per window message: the top ones by device time; the rest are summed
#: into one ``(other)`` row per kind. ~100 bytes a row keeps a window < 32 KiB.
MAX_ROWS = 256
#: Longest kernel name kept (characters): templated CUDA names run to
#: kilobytes; the head names the kernel.
MAX_NAME_CHARS = 512
OTHER_ROW_NAME = "(other)"


@dataclass(frozen=True)
class KernelAgg:
    """One kernel (or operator) name's totals over a window."""

    name: str
    kind: str
    """``"kernel"`` or ``"op"`` (:data:`KINDS`)."""
    cls: str
    """One of :data:`KERNEL_CLASSES` (operators: the class of their kernels,
    ``"compute"`` when unknown)."""
    count: int
    """Launches (kernels) or calls (operators)."""
    total_ns: int
    """Device time, ns (operators: including their children's kernels)."""
    self_ns: int
    """Self device time, ns (kernels: equal to ``total_ns``)."""
    flops: float | None = None
    """FLOP the profiler attributed (operators with a FLOP formula), else None."""

    def to_wire(self) -> list[Any]:
        return [self.name, self.kind, self.cls, self.count, self.total_ns, self.self_ns, self.flops]

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> KernelAgg:
        """Rebuild a row validated by ``gpuprof.protocol`` (no checks here)."""
        name, kind, klass, count, total_ns, self_ns, flops = row
        return cls(
            name,
            kind,
            klass,
            int(count),
            int(total_ns),
            int(self_ns),
            None if flops is None else float(flops),
        )

    @classmethod
    def from_stored(cls, row: Sequence[Any]) -> KernelAgg:
        """A ``kernel_stats`` row's ``(name, kind, cls, count, total_ns,
        self_ns, flops)`` (a NULL count or time reads 0)."""
        name, kind, klass, count, total_ns, self_ns, flops = row
        return cls(
            name,
            kind,
            klass,
            int(count or 0),
            int(total_ns or 0),
            int(self_ns or 0),
            None if flops is None else float(flops),
        )


# --------------------------------------------------------------------------
# Classification, names, folding
# --------------------------------------------------------------------------

#: NCCL's device kernels: ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` up to
#: NCCL 2.18 (the A100 fixtures), ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)``
#: since 2.19. Demanglers may prefix ``void``.
_NCCL_RE = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel")
#: Kineto's own categories for copies and fills (``gpu_memcpy``: "Memcpy HtoD
#: (Pinned -> Device)", ``gpu_memset``: "Memset (Device)"); ``key_averages()`` and
#: Nsight Systems give only the names, hence the name prefixes too.
_CATEGORY_CLASS = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
#: Kineto categories of device activity that is a kernel.
_KERNEL_CATEGORIES = ("kernel",)
#: Kineto categories of device activity (kernels, copies, fills) in a trace.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def kernel_class(name: str, category: str | None = None) -> str:
    """The class (:data:`KERNEL_CLASSES`) of a device activity.

    Args:
        name: the kernel (or copy / fill) name as the profiler gives it.
        category: the Kineto trace category (``"kernel"``, ``"gpu_memcpy"``,
            ``"gpu_memset"``) when known; None for ``key_averages()`` rows and
            Nsight Systems kernels, classified by name alone.

    Returns:
        ``"comm"`` for NCCL kernels (``ncclKernel_*`` and the newer
        ``ncclDevKernel_*``), ``"memcpy"`` / ``"memset"`` for copies and fills,
        ``"compute"`` for other kernels, ``"other"`` for device activity of an
        unknown category.
    """
    if category in _CATEGORY_CLASS:
        return _CATEGORY_CLASS[category]
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    if _NCCL_RE.match(name):
        return "comm"
    if category is None or category in _KERNEL_CATEGORIES:
        return "compute"
    return "other"


def shorten_name(name: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """*name* cut to *max_chars* characters (the last one ``…``); shorter names
    unchanged. Templated CUDA names run to kilobytes and their head names the
    kernel, so the cut keeps the head; equal heads fold into one row."""
    return name if len(name) <= max_chars else name[: max_chars - 1] + "…"


def display_name(name: str, max_chars: int = 80) -> str:
    """A kernel name short enough for a sentence: without a leading ``void`` or
    ``(anonymous namespace)::``; when still longer than *max_chars*, without its
    template and argument lists (``softmax_warp_backward``), then cut to
    *max_chars* characters. Full names stay in ``evidence``."""
    if name.startswith("void "):
        name = name[5:]
    name = name.replace("(anonymous namespace)::", "")
    if len(name) > max_chars:
        head = re.split(r"[<(]", name, maxsplit=1)[0]
        name = head or name
    return shorten_name(name, max_chars)


def _merge(rows: Iterable[KernelAgg]) -> dict[tuple[str, str], KernelAgg]:
    """Rows summed by (name, kind); FLOPs stay None only when every part's was."""
    merged: dict[tuple[str, str], KernelAgg] = {}
    for r in rows:
        key = (r.name, r.kind)
        old = merged.get(key)
        if old is None:
            merged[key] = r
            continue
        flops = (
            None if old.flops is None and r.flops is None else (old.flops or 0.0) + (r.flops or 0.0)
        )
        merged[key] = KernelAgg(
            r.name,
            r.kind,
            old.cls,
            old.count + r.count,
            old.total_ns + r.total_ns,
            old.self_ns + r.self_ns,
            flops,
        )
    return merged


def fold_counted(
    rows: Iterable[KernelAgg], max_rows: int = MAX_ROWS
) -> tuple[list[KernelAgg], int]:
    """:func:`fold`, and how many rows it cut (the wire's ``rows_dropped``)."""
    merged = sorted(_merge(rows).values(), key=lambda r: (-r.total_ns, r.kind, r.name))
    if len(merged) <= max_rows:
        return merged, 0
    kinds = sorted({r.kind for r in merged})
    keep = merged[: max(max_rows - len(kinds), 0)]
    cut = merged[len(keep) :]
    out = list(keep)
    for kind in kinds:
        part = [r for r in cut if r.kind == kind]
        if not part:
            continue
        classes = {r.cls for r in part}
        flops = [r.flops for r in part if r.flops is not None]
        out.append(
            KernelAgg(
                OTHER_ROW_NAME,
                kind,
                classes.pop() if len(classes) == 1 else "other",
                sum(r.count for r in part),
                sum(r.total_ns for r in part),
                sum(r.self_ns for r in part),
                sum(flops) if flops else None,
            )
        )
    return out, len(cut)


def fold(rows: Iterable[KernelAgg], max_rows: int = MAX_ROWS) -> list[KernelAgg]:
    """Rows of one window summed by (name, kind), most device time first, at
    most *max_rows* of them: the rest are summed into one :data:`OTHER_ROW_NAME`
    row per kind (class: the cut rows' class when they share one, else
    ``"other"``), so totals and class shares survive the cut."""
    return fold_counted(rows, max_rows)[0]


def class_shares(rows: Iterable[KernelAgg]) -> dict[str, float]:
    """Share (0-1) of kernel device time (``kind == "kernel"`` rows' ``total_ns``)
    per class, every class of :data:`KERNEL_CLASSES` present (0.0 when
    absent); all zeros when there is no kernel time."""
    totals = dict.fromkeys(KERNEL_CLASSES, 0)
    for r in rows:
        if r.kind == "kernel":
            totals[r.cls if r.cls in totals else "other"] += r.total_ns
    whole = sum(totals.values())
    return {c: (t / whole if whole else 0.0) for c, t in totals.items()}


# --------------------------------------------------------------------------
# torch.profiler's in-process events
# --------------------------------------------------------------------------

#: CPU-side events that are torch.profiler's own bookkeeping, not operators.
_PROFILER_OWN = ("Activity Buffer Request",)
_STEP_RE = re.compile(r"^ProfilerStep[#*]")
#: Operators that are collectives: c10d's ops (``c10d::allreduce_``), the
#: backends' record_function ranges (``nccl:all_reduce``; ``gloo:all_reduce``
#: in a CPU job's trace, measured with torch 2.13) and ``record_param_comms``
#: (the A100 traces' NCCL launches sit under it).
_COMM_OP_RE = re.compile(r"^(c10d::|nccl:|gloo:|record_param_comms)")


def _op_class(name: str, kernels: Iterable[Any] = ()) -> str:
    """An operator's class: ``comm`` for collectives by name, else the class of
    most of its own kernels' time (``FunctionEvent.kernels``), else ``compute``."""
    if _COMM_OP_RE.match(name):
        return "comm"
    by_cls: dict[str, float] = {}
    for k in kernels:
        cls = kernel_class(str(getattr(k, "name", "")))
        by_cls[cls] = by_cls.get(cls, 0.0) + float(getattr(k, "duration", 0.0) or 0.0)
    return max(by_cls, key=by_cls.__getitem__) if by_cls else "compute"


def _us_to_ns(us: float) -> int:
    return int(round(float(us or 0.0) * 1000.0))


def _event_ns(us: Any) -> int | None:
    """A ``torch.profiler`` µs figure in ns; None when not a finite number >= 0."""
    v = _finite(us if us is not None else 0.0)
    return None if v is None or v < 0 else int(round(v * 1000.0))


def _event_count(x: Any) -> int | None:
    v = _finite(x if x is not None else 0)
    return None if v is None or v < 0 else int(v)


def aggregate_events(events: Iterable[Any]) -> list[KernelAgg]:
    """Fold ``torch.profiler`` events into :class:`KernelAgg` rows (:func:`fold`ed).

    Takes ``prof.key_averages()`` (``FunctionEventAvg``) or ``prof.events()``
    (``FunctionEvent``); only attributes are read, so torch is not imported.
    Events on a device (``device_type`` other than ``CPU``: kernels, and
    copies / fills named ``Memcpy …`` / ``Memset …``) become ``kernel`` rows
    (``total_ns == self_ns``: ``device_time_total`` µs → ns). CPU operators
    become ``op`` rows with ``device_time_total`` (their kernels and their
    children's) and ``self_device_time_total`` in ns, a class (``comm`` for
    ``c10d::`` / ``nccl:`` / ``gloo:`` / ``record_param_comms``, else that of most of its
    own kernels' time where the event lists them, else ``compute``), and ``flops`` (FLOP,
    from ``with_flops=True``: torch has formulas for mm, addmm, bmm, baddbmm,
    convolutions, mul, add) when positive; operators with no device time and no
    FLOPs are left out, as are user annotations (``ProfilerStep#N``,
    ``record_function`` ranges: their time is their children's) and async events.
    A CPU-only profile therefore gives no kernel rows, only FLOP-carrying ops.
    Events with NaN, infinite or negative times or counts are left out, FLOPs
    that are not positive finite numbers dropped, self time capped at total
    time and names made printable: every row passes ``gpuprof.protocol``.
    """
    rows: list[KernelAgg] = []
    for e in events:
        name = getattr(e, "key", None) or getattr(e, "name", None)
        if not name or getattr(e, "is_async", False):
            continue
        device_type = getattr(e, "device_type", None)
        dev = getattr(device_type, "name", str(device_type)).rsplit(".", 1)[-1].upper()
        count = _event_count(getattr(e, "count", 1))
        total_ns = _event_ns(getattr(e, "device_time_total", 0.0))
        if count is None or total_ns is None:
            continue  # malformed: NaN, infinite or negative
        name = clean_text(name, 4096).strip() or "(unnamed)"
        if dev != "CPU":
            if count:
                rows.append(
                    KernelAgg(
                        shorten_name(name), "kernel", kernel_class(name), count, total_ns, total_ns
                    )
                )
            continue
        if getattr(e, "is_user_annotation", False) or _STEP_RE.match(name) or name in _PROFILER_OWN:
            continue
        flops = _finite(getattr(e, "flops", None))
        flops = flops if flops and flops > 0 else None
        self_ns = min(_event_ns(getattr(e, "self_device_time_total", 0.0)) or 0, total_ns)
        if total_ns > 0 or flops:
            cls = _op_class(name, getattr(e, "kernels", None) or ())
            rows.append(KernelAgg(shorten_name(name), "op", cls, count, total_ns, self_ns, flops))
    return fold(rows)


# --------------------------------------------------------------------------
# Kineto / torch.profiler chrome traces
# --------------------------------------------------------------------------

#: ``aggregate_trace(window=...)`` values: the whole trace as one window, or
#: one window per ``ProfilerStep#N``.
WINDOW_MODES = (None, "step")


@dataclass(frozen=True)
class TraceWindow:
    """One window's aggregates from a chrome trace (trace clock: µs)."""

    t0_us: float
    t1_us: float
    steps: tuple[int, ...]
    """The ``ProfilerStep#N`` numbers the window covers (empty: the trace had none)."""
    rows: tuple[KernelAgg, ...]
    rows_dropped: int = 0
    bad_events: int = 0
    """Complete events of the trace left out as malformed (``ts``/``dur`` not
    finite numbers, negative ``dur``, ``args`` not an object, unhashable ids)."""

    @property
    def wall_us(self) -> float:
        return self.t1_us - self.t0_us

    @property
    def kernel_ns(self) -> int:
        """Device time of the window's kernels, copies and fills, ns (summed
        over streams: overlapping streams count twice)."""
        return sum(r.total_ns for r in self.rows if r.kind == "kernel")

    def as_stored(self, source: str = "snapshot") -> tuple[dict[str, Any], list[KernelAgg]]:
        """``(window, rows)`` as the daemon stores and loads it (``t0``/``t1``
        in ns of the trace clock), the shape ``build_context(kernel_windows=…)`` takes."""
        window = {
            "t0": int(round(self.t0_us * 1000)),
            "t1": int(round(self.t1_us * 1000)),
            "source": source,
            "steps": list(self.steps),
            "rows_dropped": self.rows_dropped,
        }
        return window, list(self.rows)


@dataclass
class _Op:
    name: str
    ts: float
    end: float
    parent: int | None
    flops: float | None


def _trace_events(trace: Mapping[str, Any] | Sequence[Any]) -> list[Mapping[str, Any]]:
    events = trace.get("traceEvents", []) if isinstance(trace, Mapping) else trace
    if not isinstance(events, (list, tuple)):
        raise ValueError(f"not a chrome trace: expected an event list, got {type(events).__name__}")
    return [e for e in events if isinstance(e, Mapping)]


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _hashable(x: Any) -> bool:
    return x is None or isinstance(x, (int, str, float))


def _clean_complete(e: Mapping[str, Any]) -> dict[str, Any] | None:
    """A complete event with a finite ``ts``, a finite ``dur`` >= 0,
    ``args`` an object with hashable ids; None when malformed."""
    ts = _finite(e.get("ts"))
    dur = _finite(e.get("dur"))
    args = e.get("args") if e.get("args") is not None else {}
    if ts is None or dur is None or dur < 0 or not isinstance(args, Mapping):
        return None
    if not (_hashable(args.get("correlation")) and _hashable(args.get("External id"))):
        return None
    flops = args.get("flops")
    if flops is not None and _finite(flops) is None:
        args = {k: v for k, v in args.items() if k != "flops"}
    return {**e, "ts": ts, "dur": dur, "args": args}


def _ops_by_thread(
    cpu_ops: Sequence[Mapping[str, Any]],
) -> tuple[list[_Op], dict[Any, tuple[list[float], list[int]]], dict[Any, int]]:
    """All ``cpu_op`` events with their nesting parent (per thread, by time),
    per thread the ops' starts (sorted) and indices, and op index by External id."""
    ops: list[_Op] = []
    threads: dict[Any, tuple[list[float], list[int]]] = {}
    by_ext: dict[Any, int] = {}
    by_thread: dict[Any, list[Mapping[str, Any]]] = {}
    for e in cpu_ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for thread, evs in by_thread.items():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur") or 0)))
        stack: list[int] = []
        starts: list[float] = []
        idx: list[int] = []
        for e in evs:
            ts = float(e["ts"])
            end = ts + float(e.get("dur") or 0)
            while stack and ops[stack[-1]].end <= ts:
                stack.pop()
            args = e.get("args") or {}
            flops = args.get("flops")
            i = len(ops)
            ops.append(
                _Op(
                    str(e.get("name")),
                    ts,
                    end,
                    stack[-1] if stack else None,
                    float(flops) if isinstance(flops, (int, float)) and flops > 0 else None,
                )
            )
            if args.get("External id") is not None:
                by_ext.setdefault(args["External id"], i)
            stack.append(i)
            starts.append(ts)
            idx.append(i)
        threads[thread] = (starts, idx)
    return ops, threads, by_ext


def _enclosing_op(
    ops: list[_Op], threads: Mapping[Any, tuple[list[float], list[int]]], thread: Any, t: float
) -> int | None:
    """The innermost op on *thread* running at *t* (µs), if any."""
    found = threads.get(thread)
    if not found:
        return None
    starts, idx = found
    k = bisect.bisect_right(starts, t) - 1
    if k < 0:
        return None
    i: int | None = idx[k]
    while i is not None and ops[i].end < t:
        i = ops[i].parent
    return i


def aggregate_trace(
    trace: Mapping[str, Any] | Sequence[Any], window: str | None = None
) -> list[TraceWindow]:
    """Aggregate a Kineto / ``torch.profiler`` chrome trace (``export_chrome_trace``,
    ``tensorboard_trace_handler``; the parsed JSON) into :class:`KernelAgg` windows.

    Device activity is the complete (``ph == "X"``) events of category
    ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` (``ts``/``dur`` in µs), one
    ``kernel`` row per (shortened) name. Operators are the ``cpu_op`` events:
    each device event is charged to the operator that launched it (the launch
    — ``cuda_runtime`` / ``cuda_driver`` event of the same ``correlation`` —
    carries its operator's ``External id``; when none matches, the innermost
    operator running on the launching thread at launch time), as self time, and
    to that operator's enclosing operators as total time; ``op`` rows carry
    that, their call counts, their class (that of most of their kernels' time:
    ``c10d::allreduce_`` is ``comm``), and ``args["flops"]`` when the exporter wrote it
    (torch 2.11-2.13 chrome exports carry none even with ``with_flops``: FLOPs
    come from :func:`aggregate_events`). Operators with no device time and no
    FLOPs are left out.

    Args:
        trace: the trace's JSON object (``{"traceEvents": [...], ...}``) or
            its event list.
        window: None: one window over the whole trace (``t0``/``t1`` its first
            event's start and last event's end; ``steps`` every
            ``ProfilerStep#N`` seen). ``"step"``: one window per
            ``ProfilerStep#N`` user annotation (its CPU span), each device
            event in the step whose CPU span contains its launch (the GPU runs
            behind the CPU, so its own start may fall in the next step);
            events outside every step are left out. A trace without step
            annotations gives one whole-trace window either way.

    Returns:
        Windows in time order, each with :func:`fold`ed rows.
    """
    if window not in WINDOW_MODES:
        raise ValueError(f"window must be one of {WINDOW_MODES}, not {window!r}")
    events = _trace_events(trace)
    complete = []
    bad = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        c = _clean_complete(e)
        if c is None:
            bad += 1
        else:
            complete.append(c)
    device = [e for e in complete if e.get("cat") in DEVICE_CATEGORIES]
    cpu_ops = [e for e in complete if e.get("cat") == "cpu_op"]
    launches: dict[Any, Mapping[str, Any]] = {}
    for e in complete:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = e
    step_spans: list[tuple[int, float, float]] = []
    for e in complete:
        m = re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", "")))
        if m and e.get("cat") in ("user_annotation", None, "cpu_instant_event", "python_function"):
            step_spans.append((int(m.group(1)), float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    step_spans.sort(key=lambda s: s[1])
    ops, threads, by_ext = _ops_by_thread(cpu_ops)

    if window == "step" and step_spans:
        spans = [(float(a), float(b), (n,)) for n, a, b in step_spans]
    else:
        t0 = min((float(e["ts"]) for e in complete), default=0.0)
        t1 = max((float(e["ts"]) + float(e.get("dur") or 0) for e in complete), default=0.0)
        spans = [(t0, t1, tuple(n for n, _, _ in step_spans))]
    starts = [s[0] for s in spans]

    def window_of(t: float) -> int | None:
        k = bisect.bisect_right(starts, t) - 1
        return k if k >= 0 and t <= spans[k][1] else None

    kernels: list[dict[tuple[str, str], list[int]]] = [{} for _ in spans]
    op_time: list[dict[int, list[int]]] = [{} for _ in spans]  # op index -> [self ns, total ns]
    op_cls: list[dict[str, dict[str, int]]] = [{} for _ in spans]  # op name -> class -> ns
    for e in device:
        dur_ns = _us_to_ns(e.get("dur") or 0.0)
        args = e.get("args") or {}
        launch = launches.get(args.get("correlation"))
        at = float(launch["ts"]) if launch is not None else float(e["ts"])
        w = window_of(at)
        if w is None:
            continue
        name = str(e.get("name", ""))
        key = (shorten_name(name), kernel_class(name, e.get("cat")))
        acc = kernels[w].setdefault(key, [0, 0])
        acc[0] += 1
        acc[1] += dur_ns
        op: int | None = None
        if launch is not None:
            ext = (launch.get("args") or {}).get("External id")
            op = by_ext.get(ext) if ext is not None else None
            if op is None:
                op = _enclosing_op(ops, threads, (launch.get("pid"), launch.get("tid")), at)
        elif args.get("External id") is not None:
            op = by_ext.get(args["External id"])
        first = True
        while op is not None:
            t = op_time[w].setdefault(op, [0, 0])
            if first:
                t[0] += dur_ns
                first = False
            t[1] += dur_ns
            by_cls = op_cls[w].setdefault(ops[op].name, {})
            by_cls[key[1]] = by_cls.get(key[1], 0) + dur_ns
            op = ops[op].parent

    ops_in: list[list[_Op]] = [[] for _ in spans]  # each window's ops, grouped once
    for o in ops:
        ow = window_of(o.ts)
        if ow is not None:
            ops_in[ow].append(o)
    out: list[TraceWindow] = []
    for w, (a, b, steps) in enumerate(spans):
        rows = [
            KernelAgg(name, "kernel", cls, n, ns, ns) for (name, cls), (n, ns) in kernels[w].items()
        ]
        per_name: dict[str, list[Any]] = {}  # name -> [count, total, self, flops]
        for o in ops_in[w]:
            acc2 = per_name.setdefault(o.name, [0, 0, 0, None])
            acc2[0] += 1
            if o.flops is not None:
                acc2[3] = (acc2[3] or 0.0) + o.flops
        for i, (self_ns, total_ns) in op_time[w].items():
            acc2 = per_name.setdefault(ops[i].name, [0, 0, 0, None])
            acc2[1] += total_ns
            acc2[2] += self_ns
        for name, (count, total_ns, self_ns, flops) in per_name.items():
            if total_ns > 0 or flops:
                by_cls = op_cls[w].get(name)
                cls = (
                    "comm"
                    if _COMM_OP_RE.match(name)
                    else max(by_cls, key=by_cls.__getitem__)
                    if by_cls
                    else "compute"
                )
                rows.append(
                    KernelAgg(shorten_name(name), "op", cls, count, total_ns, self_ns, flops)
                )
        folded, dropped = fold_counted(rows)
        out.append(TraceWindow(a, b, steps, tuple(folded), dropped, bad))
    return out
