"""``torch.profiler`` snapshots and continuous kernel windows: which kernels
a step runs, and how long each takes.

Modes (any combination; all off by default, see :class:`TraceOptions`):

``trace_every_n_steps=N``
    one step profiled every N steps (N, 2N, ...), plus the warm-up steps 0, 1
    and 5 (first-iteration allocation, autotuning and compilation show there).
``trace_range=(a, b)``
    every step from a to b inclusive, one window per step.
``continuous_traces_hz=f``
    sampled windows for the whole run: every ``1/f`` s the next step is
    profiled (one step per window), never two samples closer than
    :data:`CONTINUOUS_MIN_STEPS_APART` steps (so at most ~1/10 of the steps
    is traced, whatever the step time) and none before step
    :data:`CONTINUOUS_FIRST_STEP`. A profiler left running instead would make
    every step a traced one (excluded from step statistics) and cost the full
    profiler overhead on every step; a sample costs that overhead on one step
    per window. ``bench/trace_overhead.py`` measures it: on a 17 ms CPU step
    (2 vCPUs, 2026-11-30) the whole loop took 1.04x at 1 Hz and 1.13x at
    10 Hz (a window every 10 steps); every 100 steps 1.03x, a 20-step range
    1.09x; one window costs ~25-45 ms there (Kineto start/stop and the fold).

Where
    The profiler starts and stops only on the training thread, between
    steps: in auto mode at the primary optimizer's ``step()`` end (the
    :class:`~gpuprof_shim.auto.machine.StepMachine`'s boundary; the profile's start
    is the boundary before step 0), so a window covers step k's loading gap
    and the step up to its optimizer update; in manual mode at ``prof.step(i)``
    entry and exit. Starting, stopping and folding are gpuprof's own time,
    kept out of the neighbouring steps' loader wait.

What is sent
    Per window one ``kernels`` event (:mod:`gpuprof.kernels`): ``kernel`` rows
    per device kernel name (device time) and ``op`` rows per operator name
    (device time with children's kernels, self device time, FLOPs from
    ``with_flops``), folded to at most :data:`gpuprof.kernels.MAX_ROWS` rows;
    never whole traces. KernelAgg times are device time, so a CPU-only run
    sends only FLOP-carrying operator rows with zero device time (the same
    rule as :func:`gpuprof.kernels.aggregate_events`). The rows are folded
    from torch's raw Kineto events here (:func:`fold_kineto`), not through
    ``key_averages()`` + ``aggregate_events``: on the 2-vCPU CI VM
    ``key_averages()`` took ~100-200 µs per event (2,700 events: 0.26-0.6 s),
    this fold ~2 µs. A window covers the steps in its ``steps`` list; a window
    still open at exit (no complete step in it) is dropped.

Traced steps
    A step whose span overlaps a profiler window is sent with ``traced:
    true``; the daemon and the rules leave it out of step statistics, MFU and
    regression baselines.

The user's own profiler
    While one is active (``torch._C._autograd._profiler_enabled()``, which
    covers ``torch.profiler``, ``torch.autograd.profiler`` and ``emit_nvtx``)
    or merely prepared (a scheduled ``torch.profiler.profile`` in its warm-up
    steps, which no torch API reports), windows are skipped with one notice.
    The second case is seen through a small wrapper on
    ``torch.autograd.profiler.profile._prepare_trace`` / ``__exit__``,
    installed while tracing is on and removed at exit; it also stops a
    gpuprof window the moment the user's profiler prepares (two Kineto
    sessions at once crash torch 2.13 with a segfault). ``record_function``
    ranges entered during a window and still open when it stops (the
    optimizer's own) are ended first: see :class:`_TorchGuard`.

Kineto's messages
    Kineto (torch's profiler library) prints ``USDT: ... profiler_start`` /
    ``profiler_stop`` to stderr at every start and stop: a line a window. It
    reads its log threshold once per process, from ``KINETO_LOG_LEVEL``, when
    the first profiler starts. If that variable is unset, gpuprof's first
    window sets it to :data:`KINETO_QUIET_LEVEL` for the start only (then
    removes it again, so child processes do not inherit it): Kineto then stays
    silent for the rest of the process, its warnings and errors included. A
    ``KINETO_LOG_LEVEL`` the user set is left alone (``5`` shows the
    start/stop lines, ``3`` errors as well). A profiler that started before gpuprof's first
    window fixed the threshold already.

Failures
    Any error from the profiler disables tracing for the rest of the run,
    with a note in the summary; nothing is raised into training.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import operator
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprof.kernels import KernelAgg, fold_counted, kernel_class, shorten_name
from gpuprof.protocol import MAX_WINDOW_STEPS, clean_text
from gpuprof_shim.patches import PatchSet

log = logging.getLogger("gpuprof.shim")

#: Steps always snapshotted when ``trace_every_n_steps`` is set: the first
#: two (allocation, cuDNN/cuBLAS autotuning, compilation) and one a little
#: later, once those settled.
WARMUP_STEPS = (0, 1, 5)
#: No continuous sample before this step: warm-up steps are the snapshots'
#: business and would skew the first windows the drift rule compares.
CONTINUOUS_FIRST_STEP = 10
#: Continuous samples are at least this many steps apart: at most one step
#: in 10 is traced (left out of step statistics), however long steps are.
CONTINUOUS_MIN_STEPS_APART = 10
#: Highest ``continuous_traces_hz`` accepted: a window per 100 ms already
#: samples every 10th step of a 10 ms loop.
MAX_CONTINUOUS_HZ = 10.0
#: Largest ``trace_every_n_steps`` / range bound accepted (the protocol's step index bound).
MAX_STEP = 1 << 40
#: Default total size of chrome traces written to ``trace_dir``, MB.
DEFAULT_TRACE_DIR_MAX_MB = 1024.0
#: ``KINETO_LOG_LEVEL`` while gpuprof's first window starts, when the user set
#: none: one above Kineto's highest severity (USDT = 5, the start/stop lines),
#: so Kineto prints nothing.
KINETO_QUIET_LEVEL = "6"
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
_FILE_SAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")


def _int_option(name: str, value: object, low: int) -> int:
    if type(value) is not int and not (hasattr(value, "__index__") and type(value) is not bool):
        raise ValueError(f"gpuprof: {name} must be an int, got {value!r}")
    n = operator.index(value)  # type: ignore[arg-type]
    if not low <= n <= MAX_STEP:
        raise ValueError(f"gpuprof: {name} must be between {low} and {MAX_STEP}, got {n}")
    return n


@dataclass(frozen=True)
class TraceOptions:
    """The trace options of ``gpuprof.profile(...)``, checked.

    Attributes:
        every_n: ``trace_every_n_steps`` (>= 1), or None.
        range: ``trace_range`` ``(a, b)``, ``0 <= a <= b``, steps inclusive, or None.
        hz: ``continuous_traces_hz`` (0 < hz <= :data:`MAX_CONTINUOUS_HZ`), or None.
        trace_dir: where chrome traces (``.pt.trace.json.gz``) go, or None (never by default).
        trace_dir_max_bytes: total size cap of the files written there, bytes.
    """

    every_n: int | None = None
    range: tuple[int, int] | None = None
    hz: float | None = None
    trace_dir: Path | None = None
    trace_dir_max_bytes: int = int(DEFAULT_TRACE_DIR_MAX_MB * 1e6)

    @property
    def enabled(self) -> bool:
        return self.every_n is not None or self.range is not None or self.hz is not None

    @classmethod
    def parse(
        cls,
        trace_every_n_steps: object = None,
        trace_range: object = None,
        continuous_traces_hz: object = None,
        trace_dir: object = None,
        trace_dir_max_mb: object = DEFAULT_TRACE_DIR_MAX_MB,
    ) -> TraceOptions:
        """Check the user's arguments.

        Raises:
            ValueError: one of them is out of range or of the wrong type.
        """
        every_n = None
        if trace_every_n_steps is not None:
            every_n = _int_option("trace_every_n_steps", trace_every_n_steps, 1)
        rng = None
        if trace_range is not None:
            if isinstance(trace_range, (str, bytes)) or not hasattr(trace_range, "__len__"):
                raise ValueError(f"gpuprof: trace_range must be a pair (a, b), got {trace_range!r}")
            if len(trace_range) != 2:  # type: ignore[arg-type]
                raise ValueError(f"gpuprof: trace_range must be a pair (a, b), got {trace_range!r}")
            a, b = trace_range  # type: ignore[misc]
            a = _int_option("trace_range start", a, 0)
            b = _int_option("trace_range end", b, 0)
            if b < a:
                raise ValueError(f"gpuprof: trace_range must have a <= b, got ({a}, {b})")
            rng = (a, b)
        hz = None
        if continuous_traces_hz is not None:
            ok = type(continuous_traces_hz) in (int, float) and math.isfinite(continuous_traces_hz)  # type: ignore[arg-type]
            if not ok or not 0 < continuous_traces_hz <= MAX_CONTINUOUS_HZ:  # type: ignore[operator]
                raise ValueError(
                    "gpuprof: continuous_traces_hz must be a number in "
                    f"(0, {MAX_CONTINUOUS_HZ:g}], got {continuous_traces_hz!r}"
                )
            hz = float(continuous_traces_hz)  # type: ignore[arg-type]
        path = None
        if trace_dir is not None:
            if not isinstance(trace_dir, (str, os.PathLike)) or not os.fspath(trace_dir):
                raise ValueError(f"gpuprof: trace_dir must be a directory path, got {trace_dir!r}")
            path = Path(trace_dir).expanduser()
            if every_n is None and rng is None and hz is None:  # said before the disk is looked at
                raise ValueError(
                    "gpuprof: trace_dir needs a trace mode (trace_every_n_steps, trace_range "
                    "or continuous_traces_hz)"
                )
            if path.exists() and not path.is_dir():
                raise ValueError(f"gpuprof: trace_dir {str(path)!r} exists and is not a directory")
        ok = type(trace_dir_max_mb) in (int, float) and math.isfinite(trace_dir_max_mb)  # type: ignore[arg-type]
        if not ok or not trace_dir_max_mb > 0:  # type: ignore[operator]
            raise ValueError(
                f"gpuprof: trace_dir_max_mb must be a positive number, got {trace_dir_max_mb!r}"
            )
        return cls(every_n, rng, hz, path, int(trace_dir_max_mb * 1e6))  # type: ignore[operator]


def fold_kineto(events: Iterable[Any], cpu: Any) -> tuple[list[KernelAgg], int]:
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

    Returns:
        ``(rows, rows_dropped)`` from :func:`gpuprof.kernels.fold_counted`.
    """
    # op: [name, start_ns, end_ns, flops, parent, self_ns, total_ns]
    ops: list[list[Any]] = []
    by_thread: dict[int, list[int]] = {}
    by_corr: dict[int, int] = {}
    kernels: dict[tuple[str, str], list[int]] = {}
    device: list[tuple[int, int]] = []
    for e in events:
        name = e.name()
        if e.device_type() != cpu:
            ns = max(0, int(e.duration_ns()))
            key = (name, e.activity_type())
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
            or e.is_user_annotation()
            or e.is_python_function()
            or e.is_async()
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
        acc2[2] += self_ns
        acc2[3] += flops
    for name, (count, total_ns, self_ns, flops) in per_name.items():
        if total_ns > 0 or flops > 0:
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


class _TorchGuard:
    """gpuprof's two small wrappers on torch's profiler classes while tracing
    is on (the originals go back on :meth:`remove`):

    - ``torch.autograd.profiler.profile._prepare_trace`` / ``__exit__``: sees
      the user's profilers prepare and finish (see the module docstring).
    - ``torch.autograd.profiler.record_function.__enter__`` / ``__exit__``:
      remembers the ranges entered while a gpuprof window records and not yet
      exited (the optimizer's ``Optimizer.step#…`` range is open when its post
      hook ends a window). Stopping a Kineto session while such a range is open
      makes its later exit write into freed memory: torch 2.13 then crashes
      (heap corruption, seen as a segfault in a later garbage collection).
      :meth:`end_open_ranges` ends them first, as torch.profiler does with
      its own ``ProfilerStep#`` range, and their real exit then does nothing.
    """

    def __init__(self, on_user_prepare: Callable[[], None]) -> None:
        self.on_user_prepare = on_user_prepare
        self.ours_starting = False
        #: True while a gpuprof window records.
        self.window_on = False
        self._prepared: Any = None  # WeakSet of the user's prepared profile objects
        self._open: dict[int, Any] = {}  # id -> record_function entered in a window
        self._end_range: Callable[[Any], None] | None = None
        self._patched = PatchSet("profiler guard")

    @property
    def user_prepared(self) -> bool:
        return bool(self._prepared)

    def install(self, legacy: Any, end_range: Callable[[Any], None]) -> None:
        """Wrap ``legacy.profile`` and ``legacy.record_function`` (the
        ``torch.autograd.profiler`` module); *end_range* ends a range's record."""
        import weakref

        self._prepared = weakref.WeakSet()
        self._end_range = end_range
        guard = self
        prof_cls, rf_cls = legacy.profile, legacy.record_function
        orig_prepare = vars(prof_cls)["_prepare_trace"]
        orig_exit = vars(prof_cls)["__exit__"]
        orig_rf_enter = vars(rf_cls)["__enter__"]
        orig_rf_exit = vars(rf_cls)["__exit__"]

        def _prepare_trace(prof: Any) -> Any:
            if not guard.ours_starting:
                try:
                    guard.on_user_prepare()
                    guard._prepared.add(prof)
                except Exception:
                    log.debug("gpuprof: profiler guard", exc_info=True)
            return orig_prepare(prof)

        def __exit__(prof: Any, *exc: Any) -> Any:  # noqa: N807
            guard._prepared.discard(prof)
            return orig_exit(prof, *exc)

        def rf_enter(rf: Any) -> Any:
            out = orig_rf_enter(rf)
            if guard.window_on:
                guard._open[id(rf)] = rf
            return out

        def rf_exit(rf: Any, *exc: Any) -> Any:
            if guard._open:
                guard._open.pop(id(rf), None)
            return orig_rf_exit(rf, *exc)

        for cls, name, mine in (
            (prof_cls, "_prepare_trace", _prepare_trace),
            (prof_cls, "__exit__", __exit__),
            (rf_cls, "__enter__", rf_enter),
            (rf_cls, "__exit__", rf_exit),
        ):
            self._patched.patch(cls, name, mine)

    def end_open_ranges(self) -> None:
        """End the ranges entered during the window and still open (before the
        window's profiler stops); their own exit then skips the end callbacks."""
        open_, self._open = self._open, {}
        for rf in open_.values():
            try:
                if rf.run_callbacks_on_exit and rf.record is not None and self._end_range:
                    self._end_range(rf.record)
                    rf.run_callbacks_on_exit = False
            except Exception:
                log.debug("gpuprof: could not end a profiler range", exc_info=True)

    def remove(self) -> None:
        """Put the originals back (unless someone re-patched after us); never raises."""
        self._patched.remove()
        self._open = {}


class Tracer:
    """Runs the trace windows of one profile; see the module docstring.

    Every public method is called from the training thread (or at profile
    exit) and never raises.

    Args:
        options: the checked :class:`TraceOptions` (``enabled``).
        run_key: the run's key, for the ``kernels`` events.
        run_name: used in trace file names.
        send: the session's non-blocking send (returns False on a drop).
        clock: monotonic ns.
    """

    def __init__(
        self,
        options: TraceOptions,
        *,
        run_key: str,
        run_name: str,
        send: Callable[[Mapping[str, Any]], bool],
        clock: Callable[[], int],
    ) -> None:
        self.options = options
        self.run_key = run_key
        self.run_name = run_name
        self.send = send
        self.clock = clock
        self.enabled = options.enabled
        #: Lines for the run summary (skips, failures, files written).
        self.notes: list[str] = []
        #: Windows whose ``kernels`` event was handed to the sender.
        self.windows = 0
        self.files_written = 0
        self.bytes_written = 0
        self._earlier_bytes: int | None = None  # traces already in trace_dir, read once
        self._torch: Any = None
        self._guard: _TorchGuard | None = None
        self._thread: int | None = None
        self._prof: Any = None
        self._step = -1
        self._source = ""
        self._t0 = 0
        self._intervals: collections.deque[tuple[int, int]] = collections.deque(maxlen=64)
        self._next_due = 0
        self._last_sample = -CONTINUOUS_MIN_STEPS_APART
        self._told_user = False
        self._dir_full = False

    # --- lifecycle ------------------------------------------------------------

    def open(self) -> None:
        """Import torch and install the user-profiler guard; on failure tracing is off."""
        if not self.enabled:
            return
        try:
            import torch
            import torch.autograd.profiler as legacy

            self._torch = torch
            self._guard = _TorchGuard(self._user_prepares)
            self._guard.install(legacy, _range_ender(torch))
            self._next_due = self.clock()
        except Exception as exc:
            self._fail("could not set up torch.profiler", exc)

    def close(self) -> None:
        """Profile exit: stop a running window (dropped: no complete step in
        it) and remove the guard. Idempotent; never raises."""
        self._drop_window("at exit")
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.remove()
        if self.files_written:
            self.notes.append(
                f"{self.files_written} chrome trace{'s' if self.files_written > 1 else ''} "
                f"({self.bytes_written / 1e6:.1f} MB) written to {self.options.trace_dir}"
            )

    @property
    def running(self) -> bool:
        return self._prof is not None

    # --- step boundaries ------------------------------------------------------

    def boundary(self, next_step: int) -> None:
        """Between steps (auto mode): the window of the step that just ended
        closes, and one opens for *next_step* if a mode asks for it."""
        self.end_window()
        self.start_window(next_step)

    def start_window(self, step: int) -> None:
        """Open a window for *step* if a mode asks for it (before the step)."""
        if not self.enabled or self._prof is not None or not self._on_training_thread():
            return
        source = self._plan(step)
        if source is None:
            return
        torch = self._torch
        try:
            if torch._C._autograd._profiler_enabled() or (
                self._guard is not None and self._guard.user_prepared
            ):
                self._skip_for_user()
                return
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_initialized():
                activities.append(ProfilerActivity.CUDA)
            prof = profile(activities=activities, with_flops=True)
            if self._guard is not None:
                self._guard.ours_starting = True
            try:
                with _quiet_kineto():
                    prof.start()
            finally:
                if self._guard is not None:
                    self._guard.ours_starting = False
            if self._guard is not None:
                self._guard.window_on = True
            self._prof, self._step, self._source, self._t0 = prof, step, source, self.clock()
            if source == "continuous" or self.options.hz is not None:
                self._last_sample = step
                if self.options.hz is not None:
                    self._next_due = self._t0 + int(1e9 / self.options.hz)
        except Exception as exc:
            self._fail("torch.profiler could not start", exc)

    def end_window(self) -> None:
        """Close the running window (after its step): fold it, send its
        ``kernels`` event, write its chrome trace if asked."""
        prof = self._prof
        if prof is None or not self._on_training_thread():
            return
        self._prof = None
        try:
            self._stop(prof)
            t1 = self.clock()
            self._intervals.append((self._t0, t1))
            results = prof.profiler.kineto_results if prof.profiler is not None else None
            events = results.events() if results is not None else []
            rows, dropped = fold_kineto(events, self._torch.autograd.DeviceType.CPU)
            msg = {
                "v": 1,
                "type": "kernels",
                "run_key": self.run_key,
                "t0": self._t0,
                "t1": t1,
                "source": self._source,
                "steps": [self._step][:MAX_WINDOW_STEPS],
                "rows": [r.to_wire() for r in rows],
            }
            if dropped:
                msg["rows_dropped"] = dropped
            self.send(msg)
            self.windows += 1
            if self.options.trace_dir is not None and not self._dir_full:
                self._write(prof)
        except Exception as exc:
            self._fail("a torch.profiler window failed", exc)

    def traced(self, t0: int, t1: int) -> bool:
        """True if a step spanning *t0*..*t1* (ns) overlapped a window (steps
        are asked about in order: windows ending before *t0* are forgotten)."""
        iv = self._intervals
        while iv and iv[0][1] < t0:
            iv.popleft()
        if self._prof is not None and t1 > self._t0:
            return True
        return any(a < t1 and t0 < b for a, b in iv)

    # --- internals --------------------------------------------------------------

    def _plan(self, step: int) -> str | None:
        """``"snapshot"``, ``"continuous"`` or None for *step*."""
        opts = self.options
        if opts.every_n is not None and (step in WARMUP_STEPS or step % opts.every_n == 0):
            return "snapshot"
        if opts.range is not None and opts.range[0] <= step <= opts.range[1]:
            return "snapshot"
        if (
            opts.hz is not None
            and step >= CONTINUOUS_FIRST_STEP
            and step - self._last_sample >= CONTINUOUS_MIN_STEPS_APART
            and self.clock() >= self._next_due
        ):
            return "continuous"
        return None

    def _on_training_thread(self) -> bool:
        ident = threading.get_ident()
        if self._thread is None:
            self._thread = ident
        return ident == self._thread

    def _stop(self, prof: Any) -> None:
        """Stop *prof*, the ranges opened during its window ended first."""
        guard = self._guard
        if guard is not None:
            guard.window_on = False
            guard.end_open_ranges()
        prof.stop()

    def _user_prepares(self) -> None:
        """The user's profiler is preparing: a gpuprof window gives way (its
        data is dropped) so two Kineto sessions never overlap."""
        prof = self._prof
        if prof is None:
            return
        self._prof = None
        self._intervals.append((self._t0, self.clock()))
        try:
            self._stop(prof)
        except Exception:
            log.debug("gpuprof: could not stop the profiler for the user's", exc_info=True)
        self._skip_for_user()

    def _skip_for_user(self) -> None:
        if not self._told_user:
            self._told_user = True
            text = (
                "your own torch.profiler is active: gpuprof skips its trace windows while it runs"
            )
            log.warning("gpuprof: %s", text)
            self.notes.append(text)

    def _write(self, prof: Any) -> None:
        """Write the window's chrome trace (gzip) under the size cap."""
        opts = self.options
        assert opts.trace_dir is not None
        cap = opts.trace_dir_max_bytes
        name = _FILE_SAFE_RE.sub("_", self.run_name)[:64] or "run"
        # the window number keeps names unique: manual mode may repeat a step index
        path = opts.trace_dir / (
            f"{name}-{self.run_key[:8]}-step{self._step}-{self._source}-"
            f"{self.files_written}.pt.trace.json.gz"
        )
        try:
            if self._earlier_bytes is None:  # the cap is the directory's: earlier runs count
                self._earlier_bytes = (
                    sum(f.stat().st_size for f in opts.trace_dir.glob("*.pt.trace.json.gz"))
                    if opts.trace_dir.is_dir()
                    else 0
                )
            used = self._earlier_bytes + self.bytes_written
            if used >= cap:
                raise _DirFull
            opts.trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))
            size = path.stat().st_size
            if used + size > cap:
                path.unlink()
                raise _DirFull
            self.bytes_written += size
            self.files_written += 1
        except _DirFull:
            self._dir_full = True
            earlier = (
                f", {self._earlier_bytes / 1e6:.1f} MB of it from earlier runs"
                if self._earlier_bytes
                else ""
            )
            text = (
                f"trace_dir cap of {cap / 1e6:g} MB reached{earlier}: no more chrome traces "
                "written (kernel aggregates are still sent)"
            )
            log.warning("gpuprof: %s", text)
            self.notes.append(text)
        except Exception as exc:
            self._dir_full = True
            text = f"could not write chrome traces to {opts.trace_dir}: {exc}"
            log.warning("gpuprof: %s", text)
            self.notes.append(text)

    def _fail(self, what: str, exc: BaseException) -> None:
        """Turn tracing off for the rest of the run, with a note; never raises."""
        self.enabled = False
        log.warning("gpuprof: %s; trace windows disabled for this run", what, exc_info=True)
        self.notes.append(
            f"trace windows disabled: {what} ({clean_text(f'{type(exc).__name__}: {exc}', 200)})"
        )
        self._drop_window("after a failure")

    def _drop_window(self, when: str) -> None:
        """Stop a running window without sending it (its steps stay traced:
        the profiler ran in them); never raises."""
        prof, self._prof = self._prof, None
        if prof is not None:
            self._intervals.append((self._t0, self.clock()))
            try:
                self._stop(prof)
            except Exception:
                log.debug("gpuprof: could not stop the profiler %s", when, exc_info=True)


_kineto_level_chosen = False


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Around the process's first window start: ``KINETO_LOG_LEVEL`` is
    :data:`KINETO_QUIET_LEVEL` unless the user set it (see the module
    docstring), and unset again afterwards."""
    global _kineto_level_chosen
    if _kineto_level_chosen or "KINETO_LOG_LEVEL" in os.environ:
        _kineto_level_chosen = True
        yield
        return
    _kineto_level_chosen = True
    os.environ["KINETO_LOG_LEVEL"] = KINETO_QUIET_LEVEL
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def _range_ender(torch: Any) -> Callable[[Any], None]:
    """What ``record_function.__exit__`` calls to end a range's record."""

    def end(record: Any) -> None:
        with torch._C.DisableTorchFunctionSubclass():
            torch.ops.profiler._record_function_exit._RecordFunction(record)

    return end


class _DirFull(Exception):
    """The trace_dir size cap is reached."""
