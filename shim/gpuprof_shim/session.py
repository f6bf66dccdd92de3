"""``gpuprof.profile()``: the :class:`Profiler` context manager.

Lifecycle:

``__enter__``
    refuse a second active profile (RuntimeError naming the active run),
    connect the data socket, send ``hello`` (auto-starting gpuprofd if none
    answers), then in auto mode patch torch.
``__exit__``
    first remove every patch and hook (even if anything after fails), emit
    a step left half done, send ``bye`` (status ``failed`` with the error if
    the loop raised anything but ``SystemExit(0)``), print the summary. The user's exception always
    propagates unchanged; gpuprof's own problems are logged, never raised.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuprof import config
from gpuprof.protocol import clean_run_name, clean_text
from gpuprof_shim import autostart, control, identity, messages
from gpuprof_shim.auto import StepMachine
from gpuprof_shim.batcher import StepBatcher
from gpuprof_shim.comm import CommTimer
from gpuprof_shim.flops import DtypeProbe, StepFlopCounter, cuda_in_use, on_mfu_device
from gpuprof_shim.loader import TimedLoader
from gpuprof_shim.manual import ManualRecorder, NullStep, Step
from gpuprof_shim.report import StepCounter, local_summary, print_summary
from gpuprof_shim.sender import Sender
from gpuprof_shim.steps import StepRecord, WaitTracker
from gpuprof_shim.trace import DEFAULT_TRACE_DIR_MAX_MB, TraceOptions, Tracer
from gpuprof_shim.workers import WorkerReporter

log = logging.getLogger("gpuprof.shim")

#: After ``hello`` succeeds, how long to wait for the data connection, ms.
DATA_CONNECT_TIMEOUT_MS = 1000

_active_lock = threading.Lock()
_active: Profiler | None = None


def _new_lock_in_child() -> None:
    """A fork child gets a fresh lock: a thread of the parent may have held it."""
    global _active_lock
    _active_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def active_profiler() -> Profiler | None:
    """The profile currently entered in this process, if any."""
    return _active


class Profiler:
    """Profile the training loop run inside ``with``; see the module docstring.

    Args:
        run_name: shown everywhere; control characters removed, cut to 200 chars.
        auto: patch torch to find steps and phases by itself (needs torch);
            False: the manual API (``prof.step``, ``s.phase``), no torch needed.
        flops_per_step: model FLOP per optimizer step on this rank, for MFU.
        dtype: training dtype name (or a ``torch.dtype``), for MFU; default:
            read in the first training forward (autocast's dtype if autocast
            is on, else the parameters').
        arch: a :class:`gpuprof.TransformerArch`: ``flops_per_step`` is then
            its analytic training FLOP for ``tokens_per_step`` tokens.
        tokens_per_step: tokens per optimizer step on this rank (batch ×
            seq_len × micro-batches), with ``arch``.
        count_flops: count one step's FLOP with FlopCounterMode (auto mode;
            see :mod:`gpuprof_shim.flops`). None (default): only when neither
            ``flops_per_step`` nor ``arch`` is given; True: also then (the
            count is kept beside the declared figure); False: never.
        print_summary: print the summary block to stdout at exit. Default
            (None): on global rank 0 only (every process outside torchrun),
            so a job of 8 ranks prints one block, not 8 interleaved ones;
            every rank's run is stored all the same (``gpuprofctl insights
            --group``).
        socket_dir: gpuprofd's socket directory (default ``GPUPROF_SOCKET`` or
            the per-user runtime dir).
        db: the database a started daemon uses (default ``GPUPROF_DB`` or
            ``./gpuprof.db``, made absolute against the current directory).
        autostart: start a gpuprofd if none answers.
        trace_every_n_steps: a ``torch.profiler`` snapshot of one step every N
            steps, plus steps 0, 1 and 5 (see :mod:`gpuprof_shim.trace`).
        trace_range: ``(a, b)``: a snapshot of every step from a to b inclusive.
        continuous_traces_hz: a one-step kernel window every ``1/f`` seconds
            for the whole run (at most one step in 10; f <= 10).
        group: the distributed group this rank belongs to; default: torchrun's
            ``TORCHELASTIC_RUN_ID`` (``gpuprofctl runs --group``); outside
            torchrun a run is its own group.
        trace_dir: also write each window's chrome trace (gzip) here; never
            by default. ``trace_dir_max_mb`` caps their total size (MB).
        step_source: ``"optimizer"`` (auto mode finds steps: one cycle of the
            first optimizer that steps) or ``"external"`` (a framework adapter
            ends each step with :meth:`mark_step_end`; phases are still timed).
        time_comm: auto mode: time each DDP gradient bucket's all-reduce (a
            comm hook on every ``DistributedDataParallel`` the loop uses; see
            :mod:`gpuprof_shim.comm`): steps gain per-bucket ``comm`` rows and
            a ``comm`` phase (exposed comm, out of ``backward``). False: no
            comm hook is registered.

    Raises:
        ValueError: an invalid ``flops_per_step``, ``dtype``, ``arch``,
            ``tokens_per_step``, ``count_flops``, ``step_source`` or trace option.
    """

    def __init__(
        self,
        run_name: str,
        *,
        auto: bool = True,
        flops_per_step: float | None = None,
        dtype: Any = None,
        print_summary: bool | None = None,
        socket_dir: str | os.PathLike[str] | None = None,
        db: str | os.PathLike[str] | None = None,
        autostart: bool = True,
        step_source: str = "optimizer",
        arch: Any = None,
        tokens_per_step: int | None = None,
        count_flops: bool | None = None,
        trace_every_n_steps: int | None = None,
        trace_range: tuple[int, int] | None = None,
        continuous_traces_hz: float | None = None,
        trace_dir: str | os.PathLike[str] | None = None,
        trace_dir_max_mb: float = DEFAULT_TRACE_DIR_MAX_MB,
        group: str | None = None,
        time_comm: bool = True,
    ) -> None:
        if step_source not in ("optimizer", "external"):
            raise ValueError(
                f"gpuprof: step_source must be 'optimizer' or 'external', got {step_source!r}"
            )
        self.step_source = step_source
        self.run_name = clean_run_name(run_name)
        self.auto = bool(auto)
        self.options = messages.normalize_options(
            flops_per_step, dtype, arch, tokens_per_step, count_flops
        )
        #: What the shim measures about the model itself (auto mode).
        self._dtype_probe: DtypeProbe | None = None
        self._flop_counter: StepFlopCounter | None = None
        self._traced: set[int] = set()
        self._sent_dtype = self._sent_flops = False
        self.trace_options = TraceOptions.parse(
            trace_every_n_steps, trace_range, continuous_traces_hz, trace_dir, trace_dir_max_mb
        )
        #: The torch.profiler windows (None unless a trace option is set).
        self._tracer: Tracer | None = None
        self._nsys_notice = False
        self._nsys_depth = 0  # nested nsys_capture() blocks: only the outermost starts/stops
        self.db = str(Path(db).expanduser().resolve() if db else config.db_path())
        #: The database this run asked for; a running daemon may own another.
        self.requested_db = self.db
        self.socket_dir = (
            Path(socket_dir).expanduser() if socket_dir else config.socket_dir(db=Path(self.db))
        )
        self.autostart = bool(autostart)
        self.run_key = uuid.uuid4().hex
        self.ranks = identity.read_ranks()
        self.print_summary = (
            self.ranks.rank == 0 if print_summary is None else bool(print_summary)
        )
        #: The group id (torchrun's run id, or *group*); None: its own group.
        self.group = identity.group_id(None if group is None else str(group))
        self.run_id: int | None = None
        #: The summary dict printed at exit (the daemon's, or a local one).
        self.summary: dict[str, Any] | None = None
        self.clock = time.monotonic_ns
        self.sender: Sender | None = None
        self.machine: StepMachine | None = None
        self.counter = StepCounter()
        self._entered = False
        self._pid = os.getpid()
        self._open = False
        self._daemon_ok = False
        self._problem: str | None = None
        self._control: str | None = None
        #: Where timed loader ``next()`` calls go: the step machine (auto
        #: mode) or the manual recorder's wait tracker.
        self._waits: WaitTracker | StepMachine | None = None
        self._recorder: ManualRecorder | None = None
        self._patches: Any = None
        #: Reports DataLoader worker pids (``workers`` events) while open.
        self._workers: WorkerReporter | None = None
        self._warned_step = False
        self._batcher: StepBatcher | None = None
        self.time_comm = bool(time_comm)
        #: DDP bucket timing (auto mode, with a sender).
        self._comm: CommTimer | None = None
        #: Clock alignment against rank 0 (started once, in a process group).
        self._aligner: Any = None
        self._aligner_tried = False

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> Profiler:
        """Start profiling without a ``with`` block (framework callbacks);
        pair with :meth:`stop`. Same errors as entering the ``with``."""
        return self.__enter__()

    def stop(self, exc: BaseException | None = None) -> None:
        """End a profile begun with :meth:`start`; *exc* is the error that
        ended training, if any (the run is then marked failed). Never raises
        for gpuprof's own problems; a second call does nothing."""
        if self._entered and _active is self:
            self.__exit__(type(exc) if exc is not None else None, exc, None)

    def __enter__(self) -> Profiler:
        global _active
        with _active_lock:
            if self._entered:
                raise RuntimeError(f"gpuprof: profile {self.run_name!r} was already used once")
            if _active is not None:
                raise RuntimeError(
                    f"gpuprof: profile {_active.run_name!r} is already active in this "
                    f"process; cannot start {self.run_name!r} inside or beside it "
                    "(gpuprof.profile() does not nest)"
                )
            _active = self
            self._entered = True
            self._pid = os.getpid()
        try:
            if self.auto:
                _import_torch()
            try:
                self._connect()
            except Exception:  # never fail training over the daemon
                log.warning("gpuprof: could not reach gpuprofd", exc_info=True)
                self._daemon_ok = False
                self._problem = "gpuprofd unreachable (internal error)"
            self._start_recording()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            self._unpatch()
        finally:
            try:
                self._finish(exc)
            except Exception:
                log.warning("gpuprof: error while finishing the run", exc_info=True)
            finally:
                self._teardown()
        return False

    # --- manual API --------------------------------------------------------

    def step(self, i: Any = None) -> Step:
        """``with prof.step(i) as s:`` — one manual step (``auto=False``).

        In auto mode, or outside the ``with``, it returns a step that records
        nothing (and logs a warning once): gpuprof never raises into training.
        """
        if self._recorder is not None and self._open:
            return self._recorder.step(i)
        if not self._warned_step:
            self._warned_step = True
            log.warning("gpuprof: prof.step() records only with auto=False inside the with block")
        return NullStep()

    def mark_step_end(self, *, skipped: bool = False, micro: int | None = None) -> None:
        """End the current step now (``step_source="external"``, for framework
        adapters). ``skipped``: the framework skipped this step's update;
        ``micro``: its micro-batch count, if the framework knows it better
        than the counted backward calls. Never raises."""
        machine = self.machine
        if machine is None or not self._open or not machine.external:
            return
        try:
            machine.end_step(self.clock(), skipped=skipped, micro=micro)
        except Exception:
            log.debug("gpuprof: could not end the step", exc_info=True)

    def wrap_dataloader(self, loader: Iterable[Any]) -> TimedLoader:
        """Iterate *loader* through this to time each ``next()`` as explicit
        loader wait, attributed to the step that follows it. Works in both modes."""
        return TimedLoader(
            loader, self._loader_started, self._loader_wait, self.clock, self._loader_iterator
        )

    @contextlib.contextmanager
    def nsys_capture(self) -> Iterator[None]:
        """``with prof.nsys_capture():`` — bracket a region with
        ``cudaProfilerStart``/``cudaProfilerStop`` (``torch.cuda.profiler``), so
        ``nsys profile --capture-range=cudaProfilerApi`` records just that
        region; then ``gpuprofctl nsys-import`` attaches its kernels to the run.

        Nested blocks are one capture (the inner stop would end the outer
        one). Without CUDA (no GPU, a CPU build of torch, no torch) it does
        nothing and logs one notice. Never raises for its own problems; an error of the
        code inside the ``with`` propagates unchanged.
        """
        started = self._nsys_depth == 0 and self._cuda_profiler(True)
        self._nsys_depth += 1
        try:
            yield
        finally:
            self._nsys_depth -= 1
            if started:
                self._cuda_profiler(False)

    def _cuda_profiler(self, start: bool) -> bool:
        """Call ``torch.cuda.profiler.start()`` / ``stop()``; True if it ran."""
        try:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("CUDA is not available")
            if start:
                torch.cuda.profiler.start()
            else:
                torch.cuda.profiler.stop()
            return True
        except Exception as exc:
            if not self._nsys_notice:
                self._nsys_notice = True
                log.warning(
                    "gpuprof: nsys_capture() does nothing here (%s)",
                    clean_text(f"{type(exc).__name__}: {exc}", 200),
                )
            return False

    # --- internals ---------------------------------------------------------

    def _connect(self) -> None:
        try:
            ingest = config.ingest_endpoint(self.socket_dir)
            self._control = config.control_endpoint(self.socket_dir)
        except ValueError as exc:
            self._problem = f"gpuprofd unreachable ({exc})"
            log.warning("gpuprof: %s", exc)
            return
        self.sender = Sender(ingest)
        self.sender.connect()
        reply = self._hello_with_autostart()
        if reply is None:
            self._problem = f"gpuprofd unreachable at {self.socket_dir}"
            if self.autostart:
                why = autostart.log_tail(self.socket_dir)
                self._problem += (
                    f" (auto-start failed: {why})"
                    if why
                    else f" (auto-start failed, see {self.socket_dir / config.LOG_NAME})"
                )
            log.warning("gpuprof: %s; running without it", self._problem)
        elif not reply["ok"]:
            self._problem = f"gpuprofd refused the run: {reply['error']}"
            log.warning("gpuprof: %s", self._problem)
        else:
            self._daemon_ok = True
            self.run_id = reply["run_id"]
            self.db = reply["db"]
            if not self.sender.wait_connected(DATA_CONNECT_TIMEOUT_MS):
                log.warning("gpuprof: the data socket is not connected yet; early steps may drop")
            for note in reply["notes"]:
                log.info("gpuprof: %s", note)

    def _hello_with_autostart(self) -> dict[str, Any] | None:
        control_path = self.socket_dir / config.CONTROL_SOCKET_NAME
        reply = self._hello() if control_path.exists() else None
        if reply is None and self.autostart:
            argv = autostart.daemon_argv(self.socket_dir, Path(self.db))
            reply = autostart.start_and_hello(self._hello, self.socket_dir, argv)
        return reply

    def _hello(self) -> dict[str, Any] | None:
        msg = messages.hello(
            run_key=self.run_key,
            run_name=self.run_name,
            pid=os.getpid(),
            host=identity.host_name(),
            ranks=self.ranks,
            wall_ns=time.time_ns(),
            mono_ns=time.monotonic_ns(),
            auto=self.auto,
            options=self.options,
            cuda_uuid=identity.cuda_uuid(),
            argv=identity.argv_text(),
            pid_ns=identity.pid_namespace(),
            group=self.group,
        )
        ctx = self.sender.context if self.sender else None
        raw = control.request(ctx, self._control or "", msg, control.HELLO_TIMEOUT_MS)
        return control.parse_hello_reply(raw)

    def _start_recording(self) -> None:
        if self.sender is not None:
            self._workers = WorkerReporter(self.run_key, self.sender.send, self.clock)
        if self.auto:
            from gpuprof_shim.patches import TorchPatches

            self.machine = StepMachine(
                self._emit, self.clock(), self.clock, external=self.step_source == "external"
            )
            self._waits = self.machine
            if self.sender is not None:
                self._comm = CommTimer(enabled=self.time_comm, on_ddp=self._start_aligner)
            self._patches = TorchPatches(self.machine, self._loader_iterator, self._comm)
            self._start_model_probes()
            try:
                self._patches.install()
            except Exception:
                log.warning("gpuprof: could not patch torch; no steps recorded", exc_info=True)
        else:
            waits = WaitTracker(self.clock())
            self._waits = waits
            self._recorder = ManualRecorder(self._emit, waits, self.clock)
        if self.sender is not None:
            self._batcher = StepBatcher(
                self.sender, self.run_key, comm=self._comm, extra=self._model_info
            )
        if self.trace_options.enabled:
            self._start_tracer()
        self._open = True
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self._start_aligner()
        except Exception:
            log.debug("gpuprof: could not read torch.distributed's state", exc_info=True)

    def _start_aligner(self) -> None:
        """Measure this rank's clock offset against rank 0 in the background
        (once per profile: at the start in a process group, else when the
        first DDP is found); the result goes out as a ``clock`` event. Not
        with ``time_comm=False``: the offsets only serve the comm timings."""
        if self._aligner_tried or self.sender is None or not self.time_comm:
            return
        self._aligner_tried = True
        try:
            from gpuprof_shim.clock_align import ClockAligner
        except ImportError:
            return
        try:
            self._aligner = ClockAligner(self._on_clock_offset)
            self._aligner.start()
        except Exception:
            log.debug("gpuprof: clock alignment not started", exc_info=True)

    def _on_clock_offset(self, offset: Any) -> None:
        """The aligner's result (its thread): send it while the run is open."""
        sender = self.sender
        if sender is not None and self._open:
            sender.send(messages.clock(self.run_key, offset))

    def _close_aligner(self) -> None:
        aligner = self._aligner
        if aligner is not None:
            try:
                aligner.close()
            except Exception:
                log.debug("gpuprof: could not close clock alignment", exc_info=True)

    def _start_tracer(self) -> None:
        """Trace windows at step boundaries; the profile's start is the one
        before step 0 (see :mod:`gpuprof_shim.trace`)."""
        tracer = Tracer(
            self.trace_options,
            run_key=self.run_key,
            run_name=self.run_name,
            send=self._send_now,
            clock=self.clock,
        )
        self._tracer = tracer
        tracer.open()
        if self.machine is not None:
            self.machine.boundary = tracer.boundary
        elif self._recorder is not None:
            self._recorder.before_step = tracer.start_window
            self._recorder.after_step = lambda _i: tracer.end_window()
        if self.machine is not None:
            tracer.start_window(0)

    def _send_now(self, msg: Any) -> bool:
        """Send one event now (a ``kernels`` window); False if dropped."""
        sender = self.sender
        return sender.send(msg) if sender is not None else False

    def _start_model_probes(self) -> None:
        """Auto mode: the dtype probe (unless the user gave a dtype) and the
        one-step FLOP counter (see ``count_flops``)."""
        opts, machine = self.options, self.machine
        if machine is None:
            return
        if opts.get("dtype") is None:
            self._dtype_probe = DtypeProbe()
        count = opts.get("count_flops")
        if count or (count is None and opts.get("flops_per_step") is None):
            self._flop_counter = StepFlopCounter()
        if self._dtype_probe is not None or self._flop_counter is not None:
            machine.on_forward_probe = self._on_forward_probe
        if count:  # asked for: on any device, from the first step boundary
            machine.on_boundary = self._on_boundary

    def _on_forward_probe(self) -> None:
        """The first training forward starts: read autocast, then stop
        probing. Without CUDA in use, the automatic probes end here (no
        peak, no MFU): nothing more runs between steps."""
        probe, machine = self._dtype_probe, self.machine
        if machine is None:
            return
        machine.on_forward_probe = None
        if not cuda_in_use() and not self.options.get("count_flops"):
            self._dtype_probe = self._flop_counter = None
            return
        if probe is not None:
            probe.on_forward()
        machine.on_boundary = self._on_boundary

    def _on_boundary(self, next_step: int, optimizer: Any) -> None:
        """A step ended (training thread): decide the dtype; start or stop
        the FLOP count."""
        try:
            on_gpu = on_mfu_device(optimizer)
            probe = self._dtype_probe
            if probe is not None and probe.result is None and probe.forward_seen:
                if on_gpu:
                    probe.on_step_end(optimizer)
                else:  # no peak to compare with: the dtype says nothing
                    self._dtype_probe = None
            counter = self._flop_counter
            if counter is not None and not on_gpu and not counter.active:
                if self.options.get("count_flops") is None:
                    self._flop_counter = counter = None  # automatic: GPUs only
            if counter is not None and self._open and counter.on_boundary(next_step):
                self._traced.add(next_step)
        except Exception:
            log.debug("gpuprof: dtype or FLOP probe failed", exc_info=True)

    def _model_info(self) -> dict[str, Any] | None:
        """A ``model_info`` event with what was learnt and not yet sent."""
        fields: dict[str, Any] = {}
        probe = self._dtype_probe
        if probe is not None and probe.result is not None and not self._sent_dtype:
            self._sent_dtype = True
            fields["dtype"], fields["dtype_source"] = probe.result
        counter = self._flop_counter
        if counter is not None and counter.flops is not None and not self._sent_flops:
            self._sent_flops = True
            fields["flops_counted"], fields["flops_step"] = counter.flops, counter.step
        return messages.model_info(self.run_key, **fields) if fields else None

    def _emit(self, rec: StepRecord) -> None:
        """Count a finished step and queue its event for the next burst
        (:class:`~gpuprof_shim.batcher.StepBatcher`). A step whose FLOPs
        were counted, or that a torch.profiler window ran in, is ``traced``."""
        try:
            if rec.i in self._traced:
                rec.traced = True
            tracer = self._tracer
            if tracer is not None and tracer.traced(rec.t0, rec.t1):
                rec.traced = True  # a torch.profiler window ran during it
            self.counter.add(rec.duration_ns + rec.wait)
            if self._batcher is not None:
                self._batcher.add(rec)
        except Exception:
            log.debug("gpuprof: could not emit step %s", rec.i, exc_info=True)

    def _send_pending(self, now_ns: int, final: bool = False) -> None:
        if self._batcher is not None:
            self._batcher.flush(now_ns, final)

    def _loader_started(self) -> None:
        if self._open and self._waits is not None:
            self._waits.mark_explicit()

    def _loader_iterator(self, it: object) -> None:
        """A new loader iterator: report its worker processes, if it has any."""
        workers = self._workers
        if self._open and workers is not None:
            workers.on_iterator(it)

    def _loader_wait(self, ns: int) -> None:
        if self._open and self._waits is not None:
            self._waits.add_loader_wait(ns)

    def _unpatch(self) -> None:
        if self._comm is not None:
            self._comm.stop()  # our comm hooks stay on the reducers, as pass-throughs
        tracer = self._tracer
        if tracer is not None:
            tracer.close()  # the profiler stopped, its guard removed (idempotent)
        if self._flop_counter is not None and self._flop_counter.active:
            self._flop_counter.abandon()
        patches, self._patches = self._patches, None
        if patches is not None:
            patches.remove()

    def _finish(self, exc: BaseException | None) -> None:
        if os.getpid() != self._pid:
            return  # a fork child leaving the block: the run, its bye and summary are the parent's
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            exc = None  # sys.exit(0) inside the loop is a normal end
        if self.machine is not None and self._open:
            self.machine.flush(self.clock())
        if self._comm is not None:
            self._comm.settle()  # the last steps' CUDA events, if any are still running
        self._send_pending(self.clock(), final=True)
        self._close_aligner()  # before bye: a result still coming goes out first
        self._open = False
        if self._recorder is not None:
            self._recorder.closed = True
        summary = self._bye(exc) if self._daemon_ok else None
        if summary is None:
            summary = local_summary(
                run_name=self.run_name,
                status="failed" if exc is not None else "finished",
                counter=self.counter,
                db=self.db,
                run_id=self.run_id,
                notes=[self._local_note()],
            )
        counter = self._flop_counter
        if counter is not None and counter.note:
            summary.setdefault("notes", []).append(counter.note)
        if self._tracer is not None and self._tracer.notes:
            summary.setdefault("notes", []).extend(self._tracer.notes)
        if self._comm is not None:
            comm_notes = self._comm.summary_notes()
            if comm_notes:
                summary.setdefault("notes", []).extend(comm_notes)
        aligner_note = getattr(self._aligner, "note", None)
        if isinstance(aligner_note, str) and aligner_note:
            summary.setdefault("notes", []).append(aligner_note)
        left = self.machine.unfinished_micro if self.machine is not None else 0
        if left:
            summary.setdefault("notes", []).append(
                f"{left} micro-batch{'es' if left > 1 else ''} after the last optimizer update "
                "(no update followed) not counted as a step"
            )
        if summary.get("db") and summary["db"] != self.requested_db:
            summary.setdefault("notes", []).append(
                f"stored in {summary['db']}, the database of the gpuprofd at {self.socket_dir}, "
                f"not {self.requested_db}"
            )
        self.summary = summary
        if self.print_summary:
            print_summary(summary)

    def _bye(self, exc: BaseException | None) -> dict[str, Any] | None:
        assert self.sender is not None
        msg = messages.bye(
            run_key=self.run_key,
            error=exc,
            sent=self.sender.sent,
            dropped=self.sender.dropped,
            mono_ns=time.monotonic_ns(),
            wall_ns=time.time_ns(),
            cuda_uuid=identity.cuda_uuid(),
            eval_ns=self.machine.trailing_eval_ns if self.machine is not None else 0,
        )
        raw = control.request(
            self.sender.context,
            self._control or "",
            msg,
            recv_timeout_ms=control.BYE_TIMEOUT_MS,
            send_timeout_ms=control.BYE_SEND_TIMEOUT_MS,
        )
        summary = control.parse_bye_reply(raw)
        if summary is None:
            refused = raw.get("error") if isinstance(raw, dict) and raw.get("ok") is False else None
            if isinstance(refused, str):
                self._problem = (
                    f"gpuprofd could not finish the run ({refused[:300]}); "
                    "summary from local counts only"
                )
            else:
                self._problem = "gpuprofd did not answer at exit; summary from local counts only"
            log.warning("gpuprof: %s", self._problem)
        return summary

    def _local_note(self) -> str:
        sent = self.sender.sent if self.sender else 0
        dropped = self.sender.dropped if self.sender else self.counter.steps
        problem = self._problem or "gpuprofd unreachable"
        if self._daemon_ok:
            return f"{problem} ({sent} events sent, {dropped} dropped in this process)"
        return f"{problem}: {sent + dropped} events not recorded (dropped)"

    def _teardown(self) -> None:
        global _active
        self._open = False
        try:
            self._unpatch()
            self._close_aligner()
            if self._comm is not None:
                self._comm.close()
            if self.sender is not None:
                self.sender.close()
        finally:
            with _active_lock:
                if _active is self:
                    _active = None


def _import_torch() -> None:
    """Auto mode needs torch; fail at ``__enter__`` with a clear message."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "gpuprof.profile(auto=True) needs torch; install it or use auto=False"
        ) from exc
