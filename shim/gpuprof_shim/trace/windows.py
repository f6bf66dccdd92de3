"""``torch.profiler`` windows: which steps are profiled, the profiler started
and stopped between steps, and what each window sends (its kernel
aggregates) and writes (its chrome trace).

Modes (any combination; all off by default, see
:class:`~gpuprof_shim.trace.options.TraceOptions`):

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
    On an H200 (a 4-layer GPT's 12 ms step, 2026-12-04) a window cost ~60-90 ms,
    a third of it reading and folding the events (~4,400 events a step: ~11 ms
    to read, ~22 ms to fold on a CPU here): that part runs on a gpuprof thread
    (:data:`FOLD_THREAD`), where a GPU-bound loop's ``loss.item()`` leaves the
    interpreter free, and the window's event is sent at a later step boundary.

Where
    The profiler starts and stops only on the training thread, between
    steps: in auto mode at the primary optimizer's ``step()`` end (the
    :class:`~gpuprof_shim.auto.machine.StepMachine`'s boundary; the profile's start
    is the boundary before step 0), so a window covers step k's loading gap
    and the step up to its optimizer update; in manual mode at ``prof.step(i)``
    entry and exit. Starting and stopping are gpuprof's own time, kept out of
    the neighbouring steps' loader wait; folding is done on :data:`FOLD_THREAD`
    and the ``kernels`` event sent from the training thread once it is done
    (at a later boundary, or at exit, which waits for every fold).

What is sent
    Per window one ``kernels`` event (:mod:`gpuprof.kernels`): ``kernel`` rows
    per device kernel name (device time) and ``op`` rows per operator name
    (device time with children's kernels, self device time, FLOPs from
    ``with_flops``), folded to at most :data:`gpuprof.kernels.MAX_ROWS` rows;
    never whole traces. KernelAgg times are device time, so a CPU-only run
    sends only FLOP-carrying operator rows with zero device time (the same
    rule as :func:`gpuprof.kernels.aggregate_events`), folded from torch's
    raw Kineto events by :func:`~gpuprof_shim.trace.fold.fold_kineto`. A
    window covers the steps in its ``steps`` list; a window still open at
    exit (no complete step in it) is dropped.

Traced steps
    A step whose span overlaps a profiler window is sent with ``traced:
    true``; the daemon and the rules leave it out of step statistics, MFU and
    regression baselines.

The user's own profiler
    While one is active or merely prepared, windows are skipped with one
    notice, and a gpuprof window stops the moment the user's profiler
    prepares (two Kineto sessions at once crash torch 2.13 with a segfault):
    :mod:`gpuprof_shim.trace.guard` sees it, and ends the ranges left open
    when a window stops.

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

Evidence windows
    With an :class:`~gpuprof_shim.trace.evidence.EvidenceSlot` (the default
    ``profile(auto_evidence=True)``), a window the daemon asked for opens at
    the boundary its request names and stays open for its steps (one window,
    ``source: "evidence"``, tagged ``{"id", "rule", "time"}``; on a CPU-only
    run its operators carry CPU time). torch.profiler is imported and the
    guard installed only when the first one opens. A window of the trace
    modes has the boundary first; an evidence window waits for the next free one.

Failures
    Any error from the profiler disables tracing for the rest of the run,
    with a note in the summary; nothing is raised into training.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpuprof.evidence import EvidenceRequest
from gpuprof.protocol import MAX_WINDOW_STEPS
from gpuprof.text import clean_text
from gpuprof_shim.trace.evidence import EvidenceSlot
from gpuprof_shim.trace.fold import fold_kineto
from gpuprof_shim.trace.guard import TorchGuard, range_ender
from gpuprof_shim.trace.options import TraceOptions

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
#: ``KINETO_LOG_LEVEL`` while gpuprof's first window starts, when the user set
#: none: one above Kineto's highest severity (USDT = 5, the start/stop lines),
#: so Kineto prints nothing.
KINETO_QUIET_LEVEL = "6"
#: The one thread that reads and folds closed windows' events.
FOLD_THREAD = "gpuprof-fold"
#: Windows folding at once, at most: past it the training thread waits for
#: the oldest (a fold that cannot keep up is not left to pile up memory).
MAX_FOLDS_PENDING = 4
_FILE_SAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")


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
        evidence: the evidence requests' slot; None: no evidence windows.
    """

    def __init__(
        self,
        options: TraceOptions,
        *,
        run_key: str,
        run_name: str,
        send: Callable[[Mapping[str, Any]], bool],
        clock: Callable[[], int],
        evidence: EvidenceSlot | None = None,
    ) -> None:
        self.options = options
        self.evidence = evidence
        self.run_key = run_key
        self.run_name = run_name
        self.send = send
        self.clock = clock
        self.enabled = options.enabled or evidence is not None
        self._opened = False
        #: Lines for the run summary (skips, failures, files written).
        self.notes: list[str] = []
        #: Windows whose ``kernels`` event was handed to the sender.
        self.windows = 0
        self.files_written = 0
        self.bytes_written = 0
        self._earlier_bytes: int | None = None  # traces already in trace_dir, read once
        self._torch: Any = None
        self._guard: TorchGuard | None = None
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
        self._request: EvidenceRequest | None = None  # the open window's, if evidence
        self._covered = 0  # steps the open evidence window has covered
        self._window_steps: list[int] = []  # their numbers
        self._last_boundary = 0
        self._step_ns = 0  # the latest boundary-to-boundary time (evidence cost estimate)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._folding: collections.deque[_Folding] = collections.deque()

    # --- lifecycle ------------------------------------------------------------

    def open(self) -> None:
        """Import torch and install the user-profiler guard; on failure tracing
        is off. With evidence windows only, the guard goes in now if torch is
        imported already (it must see the user's profiler prepare before a
        window starts: two Kineto sessions at once crash torch), else when
        the first window opens; a failure there turns them off without a note."""
        if not self.enabled:
            return
        if self.options.enabled or "torch" in sys.modules:
            self._open_now()

    def _open_now(self) -> None:
        if self._opened:
            return
        self._opened = True
        if not self.options.enabled:  # evidence windows only: off quietly on failure
            try:
                import torch
                import torch.autograd.profiler as legacy

                self._torch = torch
                self._guard = TorchGuard(self._user_prepares)
                self._guard.install(legacy, range_ender(torch))
            except Exception:
                log.debug("gpuprof: no evidence windows (torch.profiler)", exc_info=True)
                self.enabled = False
            return
        try:
            import torch
            import torch.autograd.profiler as legacy

            self._torch = torch
            self._guard = TorchGuard(self._user_prepares)
            self._guard.install(legacy, range_ender(torch))
            self._next_due = self.clock()
        except Exception as exc:
            self._fail("could not set up torch.profiler", exc)

    def close(self) -> None:
        """Profile exit: stop a running window (dropped: no complete step in
        it), send the windows still folding (waiting for them) and remove
        the guard. Idempotent; never raises."""
        self._drop_window("at exit")
        self._send_folded(wait=True)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self.evidence is not None:
            self.notes.extend(self.evidence.notes())
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
        closes (an evidence window once it covered its steps), and one opens
        for *next_step* if a mode or an evidence request asks for it."""
        now = self.clock()
        if self._last_boundary:
            self._step_ns = now - self._last_boundary
        self._last_boundary = now
        self._send_folded()
        if self._keep_evidence_open(next_step):
            return
        self.end_window()
        self.start_window(next_step)

    def after_step(self, i: int) -> None:
        """After manual step *i*: the window closes (an evidence window once
        it covered its steps)."""
        now = self.clock()
        if self._last_boundary:
            self._step_ns = now - self._last_boundary
        self._last_boundary = now
        self._send_folded()
        if self._keep_evidence_open(None):
            return
        self.end_window()

    def _keep_evidence_open(self, next_step: int | None) -> bool:
        """One more step done in an open evidence window: True while it has
        steps to go (*next_step*, when known, is one of them)."""
        req = self._request
        if req is None or self._prof is None:
            return False
        self._covered += 1
        keep = self._covered < req.steps
        if keep and next_step is not None:
            self._window_steps.append(next_step)
        return keep

    def start_window(self, step: int) -> None:
        """Open a window for *step* if a mode asks for it (before the step)."""
        if self._prof is not None and self._request is not None:
            if self._window_steps and self._window_steps[-1] != step:  # manual mode
                self._window_steps.append(step)
            return
        if not self.enabled or self._prof is not None or not self._on_training_thread():
            return
        source = self._plan(step)
        req: EvidenceRequest | None = None
        if source is None and self.evidence is not None:
            req = self.evidence.due(step, self._step_ns)
            source = "evidence" if req is not None else None
        if source is None:
            return
        if req is not None:
            self._open_now()
            if not self.enabled or self._torch is None:  # torch.profiler could not be set up
                self.evidence.failed(req, "torch.profiler unavailable")  # type: ignore[union-attr]
                return
        torch = self._torch
        try:
            if torch._C._autograd._profiler_enabled() or (
                self._guard is not None and self._guard.user_prepared
            ):
                self._skip_for_user()
                if req is not None and self.evidence is not None:
                    self.evidence.failed(req, "your own torch.profiler was active")
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
            self._request, self._covered, self._window_steps = req, 0, [step]
            if source == "continuous" or self.options.hz is not None:
                self._last_sample = step
                if self.options.hz is not None:
                    self._next_due = self._t0 + int(1e9 / self.options.hz)
        except Exception as exc:
            if req is not None and self.evidence is not None:
                self.evidence.failed(req, "torch.profiler could not start")
            self._fail("torch.profiler could not start", exc)

    def end_window(self) -> None:
        """Close the running window (after its step): stop the profiler, write
        its chrome trace if asked, and hand its events to :data:`FOLD_THREAD`
        (:meth:`_send_folded` sends the ``kernels`` event once folded)."""
        prof = self._prof
        if prof is None or not self._on_training_thread():
            return
        self._prof = None
        req, self._request = self._request, None
        try:
            self._stop(prof)
            t1 = self.clock()
            self._intervals.append((self._t0, t1))
            results = prof.profiler.kineto_results if prof.profiler is not None else None
            steps = (self._window_steps if req is not None else [self._step])[:MAX_WINDOW_STEPS]
            job = _Folding(self._t0, t1, self._source, steps, req)
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, FOLD_THREAD)
            cpu = self._torch.autograd.DeviceType.CPU
            job.future = self._pool.submit(_fold, results, cpu, req is not None)
            self._folding.append(job)
            self.windows += 1
            if self.options.trace_dir is not None and not self._dir_full:
                self._write(prof)
            if len(self._folding) > MAX_FOLDS_PENDING:
                self._send_folded(wait=True)
        except Exception as exc:
            if req is not None and self.evidence is not None:
                self.evidence.failed(req, "the profiler window failed", self.clock() - self._t0)
            self._fail("a torch.profiler window failed", exc)

    def _send_folded(self, wait: bool = False) -> None:
        """Send the ``kernels`` event of each window whose fold is done, in
        the order they closed (all of them, waiting, when *wait*); never raises."""
        while self._folding and (wait or self._folding[0].future.done()):
            job = self._folding.popleft()
            req = job.req
            try:
                rows, dropped, fold_ns = job.future.result()
                msg: dict[str, Any] = {
                    "v": 1,
                    "type": "kernels",
                    "run_key": self.run_key,
                    "t0": job.t0,
                    "t1": job.t1,
                    "source": job.source,
                    "steps": job.steps,
                    "rows": [r.to_wire() for r in rows],
                }
                if dropped:
                    msg["rows_dropped"] = dropped
                if req is not None:
                    device = any(r.kind == "kernel" for r in rows)
                    msg["evidence"] = {
                        "id": req.id,
                        "rule": req.rule,
                        "time": "device" if device else "cpu",
                    }
                self.send(msg)
                if req is not None and self.evidence is not None:
                    self.evidence.done(req, job.t1 - job.t0 + fold_ns)
            except Exception as exc:
                if req is not None and self.evidence is not None:
                    self.evidence.failed(req, "the profiler window failed", job.t1 - job.t0)
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
        req, self._request = self._request, None
        if req is not None and self.evidence is not None:
            self.evidence.failed(req, "your own torch.profiler started", self.clock() - self._t0)
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
        req, self._request = self._request, None
        if req is not None and self.evidence is not None:
            self.evidence.failed(req, f"the window was dropped {when}", self.clock() - self._t0)
        if prof is not None:
            self._intervals.append((self._t0, self.clock()))
            try:
                self._stop(prof)
            except Exception:
                log.debug("gpuprof: could not stop the profiler %s", when, exc_info=True)


_kineto_level_chosen = False


class _Folding:
    """A closed window whose events :data:`FOLD_THREAD` reads and folds."""

    __slots__ = ("t0", "t1", "source", "steps", "req", "future")

    def __init__(
        self, t0: int, t1: int, source: str, steps: list[int], req: EvidenceRequest | None
    ) -> None:
        self.t0, self.t1, self.source, self.steps, self.req = t0, t1, source, steps, req
        self.future: concurrent.futures.Future[tuple[list[Any], int, int]]


def _fold(results: Any, cpu: Any, cpu_time: bool) -> tuple[list[Any], int, int]:
    """(rows, rows dropped, ns it took) of one window's Kineto *results*."""
    t = time.monotonic_ns()
    events = results.events() if results is not None else []
    rows, dropped = fold_kineto(events, cpu, cpu_time=cpu_time)
    return rows, dropped, time.monotonic_ns() - t


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


class _DirFull(Exception):
    """The trace_dir size cap is reached."""
