"""torch's raw Kineto events, as a trace window's profiler recorded them,
folded into kernel aggregates: :class:`gpuprof.kernels.KernelAgg` rows, the
``kernels`` event's ``rows``. Pure: no torch import (the events are read
through their methods).

Folded here, not through ``key_averages()`` +
:func:`gpuprof.kernels.aggregate_events`: on the 2-vCPU CI VM
``key_averages()`` took ~100-200 µs per event (2,700 events: 0.26-0.6 s),
this fold ~2 µs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuprof.kernels import KernelAgg, fold_counted, kernel_class, shorten_name
from gpuprof.text import clean_text

#: Names torch's own ``key_averages()`` leaves out (profiler bookkeeping).
_SKIPPED_NAMES = frozenset(
    {
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
        "[memory]",
        "[OutOfMemory]",
        "Activity Buffer Request",
    }
)


#: The event kinds that are not ops, by their ``_KinetoEvent`` predicate. Some
#: torch builds lack some of them (2.11's has neither ``is_python_function`` nor
#: ``activity_type``, seen on an H200 on 2026-12-04); an event kind a build
#: cannot name is one it does not record without ``with_stack``, which the
#: windows never ask for.
_SKIP_FLAGS = ("is_user_annotation", "is_python_function", "is_async")


def _skip_flags(event_type: type) -> tuple[Any, ...]:
    """The :data:`_SKIP_FLAGS` predicates *event_type* has, unbound."""
    return tuple(f for n in _SKIP_FLAGS if (f := getattr(event_type, n, None)) is not None)


def fold_kineto(
    events: Iterable[Any], cpu: Any, cpu_time: bool = False
) -> tuple[list[KernelAgg], int]:
    """Fold torch's raw Kineto events (``prof.profiler.kineto_results.events()``)
    into :class:`KernelAgg` rows, as :func:`gpuprof.kernels.aggregate_events`
    does from ``key_averages()`` but without building ``FunctionEvent`` objects.

    Device events (``device_type`` not *cpu*) become ``kernel`` rows (count,
    device ns). CPU operators (not async, not user annotations or Python
    functions, not launch runtime calls) become ``op`` rows: a device event's
    time is the self time of the operator whose correlation id it links to
    (what torch's ``key_averages`` does) and total time of that operator and
    every operator enclosing it on its thread; ``flops`` from ``with_flops``.
    Operators with neither device time nor FLOPs are left out.

    *cpu_time* (evidence windows): when the window holds no device activity
    (a CPU-only run), operators carry their CPU time instead: ``total_ns``
    from start to end, ``self_ns`` less their child operators' time.

    Returns:
        ``(rows, rows_dropped)`` from :func:`gpuprof.kernels.fold_counted`.
    """
    # op: [name, start_ns, end_ns, flops, parent, self_ns, total_ns]
    ops: list[list[Any]] = []
    by_thread: dict[int, list[int]] = {}
    by_corr: dict[int, int] = {}
    kernels: dict[tuple[str, str | None], list[int]] = {}
    device: list[tuple[int, int]] = []
    skip_flags: tuple[Any, ...] | None = None
    activity: Any = None
    for e in events:
        if skip_flags is None:
            skip_flags = _skip_flags(type(e))
            activity = getattr(type(e), "activity_type", None)
        name = e.name()
        if e.device_type() != cpu:
            ns = max(0, int(e.duration_ns()))
            # without the Kineto category, the kernel's class comes from its name
            key = (name, activity(e) if activity is not None else None)
            acc = kernels.get(key)
            if acc is None:
                kernels[key] = acc = [0, 0]
            acc[0] += 1
            acc[1] += ns
            linked = e.linked_correlation_id()
            if linked > 0:
                device.append((linked, ns))
            continue
        if (
            e.linked_correlation_id() != 0
            or any(flag(e) for flag in skip_flags)
            or name in _SKIPPED_NAMES
            or name.startswith("ProfilerStep")
        ):
            continue
        thread = e.start_thread_id()
        if thread != e.end_thread_id():
            continue
        i = len(ops)
        flops = e.flops()
        ops.append([name, e.start_ns(), e.end_ns(), flops if flops > 0 else 0, None, 0, 0])
        by_corr[e.correlation_id()] = i
        by_thread.setdefault(thread, []).append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (ops[i][1], -ops[i][2]))
        stack: list[int] = []
        for i in idx:
            while stack and ops[stack[-1]][2] <= ops[i][1]:
                stack.pop()
            ops[i][4] = stack[-1] if stack else None
            stack.append(i)
    for linked, ns in device:
        op = by_corr.get(linked)
        if op is None:
            continue
        ops[op][5] += ns
        while op is not None:
            ops[op][6] += ns
            op = ops[op][4]
    if cpu_time and not kernels:
        for op in ops:
            op[6] = max(0, op[2] - op[1])
        for op in ops:
            op[5] += op[6]
            if op[4] is not None:
                ops[op[4]][5] -= op[6]
    rows = [
        KernelAgg(_row_name(name), "kernel", kernel_class(name, act), n, ns, ns)
        for (name, act), (n, ns) in kernels.items()
    ]
    per_name: dict[str, list[Any]] = {}  # name -> [count, total, self, flops]
    for name, _, _, flops, _, self_ns, total_ns in ops:
        acc2 = per_name.get(name)
        if acc2 is None:
            per_name[name] = acc2 = [0, 0, 0, 0]
        acc2[0] += 1
        acc2[1] += total_ns
        acc2[2] += max(0, self_ns)
        acc2[3] += flops
    for name, (count, total_ns, self_ns, flops) in per_name.items():
        if total_ns > 0 or flops > 0:
            self_ns = min(self_ns, total_ns)
            rows.append(
                KernelAgg(
                    _row_name(name),
                    "op",
                    "compute",
                    count,
                    total_ns,
                    self_ns,
                    float(flops) if flops > 0 else None,
                )
            )
    return fold_counted(rows)


_names: dict[str, str] = {}


def _row_name(name: str) -> str:
    """A printable row name within the protocol's limit (cached: names repeat)."""
    out = _names.get(name)
    if out is None:
        out = shorten_name(clean_text(name, 4096).strip() or "(unnamed)")
        if len(_names) < 4096:
            _names[name] = out
    return out
