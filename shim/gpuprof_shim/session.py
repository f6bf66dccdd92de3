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
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import CodeType, TracebackType
from typing import TYPE_CHECKING, Any, Literal

from gpuprof import config
from gpuprof.flops import TransformerArch
from gpuprof.keywords import check_keywords
from gpuprof.labels import clean_project, clean_tags
from gpuprof.protocol import MAX_STACK_ROWS, clean_run_name, clean_text
from gpuprof_shim import identity, messages
from gpuprof_shim import webhook as webhooks
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.batcher import StepBatcher
from gpuprof_shim.comm import CommTimer
from gpuprof_shim.link import DaemonLink
from gpuprof_shim.loader import TimedLoader
from gpuprof_shim.loaders import LoaderReporter
from gpuprof_shim.manual import ManualRecorder, NullStep, Step
from gpuprof_shim.notes import add_notes, no_steps_note
from gpuprof_shim.probes import ModelProbes
from gpuprof_shim.report import StepCounter, local_summary, print_summary
from gpuprof_shim.sender import Sender
from gpuprof_shim.sidecars import ClockSync, TraceWindows
from gpuprof_shim.stacks import FrameKey, StackSampler, torch_phase_entries, wire_rows
from gpuprof_shim.steps import StepRecord, WaitTracker
from gpuprof_shim.trace.evidence import EvidenceSlot
from gpuprof_shim.trace.options import DEFAULT_TRACE_DIR_MAX_MB, TraceOptions
from gpuprof_shim.trace.windows import Tracer
from gpuprof_shim.wandb_sink import WandbSink
from gpuprof_shim.worker_stacks import LoaderInits
from gpuprof_shim.workers import WorkerReporter

if TYPE_CHECKING:
    import torch

log = logging.getLogger("gpuprof.shim")


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
    """One profiled run: what :func:`gpuprof.profile` returns (its
    ``help()`` lists every option, each documented there once).

    Use it as the ``with`` block's context manager, or call :meth:`start`
    and :meth:`stop` (framework callbacks). While it is open:
    :meth:`step` (``auto=False``: ``with prof.step(i) as s:`` and
    ``s.phase(name)``), :meth:`wrap_dataloader` (time each batch's loader
    wait), :meth:`nsys_capture` (bracket a region for Nsight Systems),
    :meth:`mark_step_end` (``step_source="external"``). After it:
    :attr:`summary` (the printed summary as a dict, the shape of
    ``gpuprofctl insights --format json``), :attr:`run_id` and :attr:`db`
    (where ``gpuprofctl`` finds the run).

    Entering it refuses a second active profile in the process
    (RuntimeError naming the active run), connects to gpuprofd (starting
    one if none answers) and, in auto mode, patches torch. Leaving it
    removes every patch and hook first, sends what is left, prints the
    summary, then logs to W&B and posts the webhook when asked. The
    training loop's own exception always propagates unchanged; gpuprof's
    own problems are logged, never raised.

    Raises:
        TypeError: an unknown option (naming the closest valid one).
        ValueError: an invalid option value (see :func:`gpuprof.profile`).
    """

    @check_keywords("gpuprof.Profiler")
    def __init__(
        self,
        run_name: str,
        *,
        auto: bool = True,
        flops_per_step: float | None = None,
        dtype: torch.dtype | str | None = None,
        print_summary: bool | None = None,
        socket_dir: str | os.PathLike[str] | None = None,
        db: str | os.PathLike[str] | None = None,
        autostart: bool = True,
        step_source: Literal["optimizer", "external"] = "optimizer",
        arch: TransformerArch | None = None,
        tokens_per_step: int | None = None,
        samples_per_step: int | None = None,
        count_flops: bool | None = None,
        trace_every_n_steps: int | None = None,
        trace_range: tuple[int, int] | None = None,
        continuous_traces_hz: float | None = None,
        trace_dir: str | os.PathLike[str] | None = None,
        trace_dir_max_mb: float = DEFAULT_TRACE_DIR_MAX_MB,
        group: str | None = None,
        time_comm: bool = True,
        stacks: bool = True,
        dashboard: bool = False,
        wandb: bool = False,
        webhook: str | None = None,
        webhook_format: Literal["slack", "json"] = "slack",
        server: str | None = None,
        project: str | None = None,
        tags: Mapping[str, str] | None = None,
        auto_evidence: bool = True,
    ) -> None:
        """See :func:`gpuprof.profile` for every option."""
        if step_source not in ("optimizer", "external"):
            raise ValueError(
                f"gpuprof: step_source must be 'optimizer' or 'external', got {step_source!r}"
            )
        webhooks.check(webhook, webhook_format)
        #: The team server this run asks to be forwarded to (None: none asked).
        try:
            self.server = messages.server_url(server if server is not None else config.server_url())
        except ValueError as exc:
            if server is not None:
                raise
            log.warning("%s; GPUPROF_SERVER ignored", exc)
            self.server = None
        self.step_source = step_source
        self.run_name = clean_run_name(run_name)
        #: The project the run counts to (profile(project=) over GPUPROF_PROJECT).
        self.project = clean_project(project) if project is not None else config.project()
        #: Its tags: GPUPROF_TAGS, then profile(tags=) over them.
        self.tags = clean_tags({**config.tags(), **clean_tags(tags)})
        self.auto = bool(auto)
        self.options = messages.normalize_options(
            flops_per_step, dtype, arch, tokens_per_step, count_flops, samples_per_step
        )
        #: What the shim measures about the model itself (auto mode).
        self.probes = ModelProbes(self.options, lambda: self._open)
        self.trace_options = TraceOptions.parse(
            trace_every_n_steps, trace_range, continuous_traces_hz, trace_dir, trace_dir_max_mb
        )
        #: The torch.profiler windows (None unless a trace option is set).
        self._windows: TraceWindows | None = None
        #: Take the profiler windows gpuprofd asks for to explain a finding.
        self.auto_evidence = bool(auto_evidence)
        #: Where gpuprofd's evidence requests arrive (None: no resend thread to bring them).
        self._evidence: EvidenceSlot | None = None
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
        self.print_summary = self.ranks.rank == 0 if print_summary is None else bool(print_summary)
        #: The group id (torchrun's run id, or *group*); None: its own group.
        self.group = identity.group_id(None if group is None else str(group))
        self.run_id: int | None = None
        #: The summary dict printed at exit (the daemon's, or a local one).
        self.summary: dict[str, Any] | None = None
        #: Monotonic ns for every timestamp (tests replace it before start()).
        self.clock: Callable[[], int] = time.monotonic_ns
        self.sender: Sender | None = None
        self.machine: StepMachine | None = None
        self.counter = StepCounter()
        self._entered = False
        self._pid = os.getpid()
        self._ended_ns = (0, 0)  # (monotonic, wall) ns when the block exited
        self._open = False
        #: The link to gpuprofd (data socket, hello, bye).
        self.link = DaemonLink(self.socket_dir, self.db, self.autostart, self.server)
        #: Where timed loader ``next()`` calls go: the step machine (auto
        #: mode) or the manual recorder's wait tracker.
        self._waits: WaitTracker | StepMachine | None = None
        self._recorder: ManualRecorder | None = None
        self._patches: Any = None
        #: Reports DataLoader worker pids (``workers`` events) while open.
        self._workers: WorkerReporter | None = None
        #: Reports the DataLoaders' settings (``loaders`` events) while open.
        self._loaders: LoaderReporter | None = None
        self._warned_step = False
        self._batcher: StepBatcher | None = None
        self.time_comm = bool(time_comm)
        #: DDP bucket timing (auto mode, with a sender).
        self._comm: CommTimer | None = None
        #: Clock alignment against rank 0 (started once, in a process group).
        self._clock_sync: ClockSync | None = None
        #: Sample the training thread's stack between its phases (``stacks``).
        self.stacks = bool(stacks)
        self._stacks: StackSampler | None = None
        #: Show the run on gpuprofd's live dashboard.
        self.dashboard = bool(dashboard)
        #: Log to the active W&B run (:mod:`gpuprof_shim.wandb_sink`), and its sink.
        self.wandb = bool(wandb)
        self._wandb: WandbSink | None = None
        #: Where and how the summary is posted at the end (:mod:`gpuprof_shim.webhook`).
        self.webhook = webhook
        self.webhook_format = webhook_format

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
                self.link.ok = False
                self.link.problem = "gpuprofd unreachable (internal error)"
            if self.dashboard and self.print_summary:
                print(self.link.dashboard_line(self.run_id), flush=True)
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
        # the run ends when its block does, not after gpuprof's own wrap-up
        # (waiting up to 10 s for gpuprofd's acknowledgements, trace folds)
        self._ended_ns = (time.monotonic_ns(), time.time_ns())
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
        link = self.link
        try:
            link.connect(self._hello)
        finally:
            self.sender, self.run_id, self.db = link.sender, link.run_id, link.db

    def _hello(self) -> dict[str, Any]:
        """The ``hello`` message (built anew for each attempt: its clocks)."""
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
            server=self.server,
            user=identity.user_name(),
            project=self.project,
            tags=self.tags,
        )
        return msg

    def _start_recording(self) -> None:
        sender = self.sender
        if sender is not None:
            self._workers = WorkerReporter(self.run_key, sender.send, self.clock)
            self._loaders = LoaderReporter(self.run_key, sender.send)
        self._clock_sync = ClockSync(
            self.run_key,
            sender.send if sender is not None else None,
            lambda: self._open,
            enabled=self.time_comm,
        )
        if self.auto and sender is not None:
            self._comm = CommTimer(enabled=self.time_comm, on_ddp=self._clock_sync.start)
        # every finished step goes to the batcher, with or without a daemon
        batcher = self._batcher = StepBatcher(
            sender,
            self.run_key,
            comm=self._comm,
            extra=self._model_info,
            # auto mode keeps a burst's send apart as gpuprof's own time; the
            # manual API's gap wait includes it, as it always has
            clock=self.clock if self.auto else None,
            on_burst=self._burst,
        )
        if self.auto:
            from gpuprof_shim.patches import TorchPatches

            self.machine = StepMachine(
                batcher.add, self.clock(), self.clock, external=self.step_source == "external"
            )
            self._waits = self.machine
            self._patches = TorchPatches(self.machine, self._loader_iterator, self._comm)
            if self.stacks and sender is not None:
                self._patches.prepare_loader = LoaderInits(sender.endpoint, self.run_key).prepare
            self.probes.start(self.machine)
            try:
                self._patches.install()
            except Exception:
                log.warning("gpuprof: could not patch torch; no steps recorded", exc_info=True)
        else:
            waits = WaitTracker(self.clock())
            self._waits = waits
            self._recorder = ManualRecorder(batcher.add, waits, self.clock)
        if self.link.ok and self.link.keeps:  # requests ride the resend thread's acks
            self._evidence = EvidenceSlot(self.auto_evidence, self.clock(), self.clock)
            self.link.evidence = self._evidence
        evidence = self._evidence if self.auto_evidence else None  # off: refused in the slot
        if self.trace_options.enabled or evidence is not None:
            self._windows = TraceWindows(
                self.trace_options,
                run_key=self.run_key,
                run_name=self.run_name,
                send=self._send_now,
                clock=self.clock,
                evidence=evidence,
            )
            self._windows.attach(self.machine, self._recorder)
        if self.wandb:
            self._wandb = WandbSink.open(mfu_inputs=self.probes.mfu_inputs)
        self._open = True
        self._start_stacks()
        # in a process group: align the clocks now (else at the first DDP)
        self._clock_sync.start_if_distributed(sys.modules.get("torch.distributed"))

    def _start_stacks(self) -> None:
        """Start the stack sampler on this (the training) thread, gated on
        the step machine (auto) or on no ``prof.step()`` being open (manual)."""
        if not self.stacks or self.sender is None:
            return
        machine, recorder = self.machine, self._recorder
        phases: frozenset[CodeType] = frozenset()
        if machine is not None:
            gate, step = machine.between_phases, machine.gap_step
            phases = torch_phase_entries()
        elif recorder is not None:
            gate = recorder.between_steps
            step = lambda: recorder.next_index  # noqa: E731
        else:
            return
        try:
            sampler = StackSampler(
                threading.get_ident(), gate, step, flush=self._send_stacks, stop=phases
            )
            sampler.start()
            self._stacks = sampler
        except Exception:
            log.debug("gpuprof: could not start the stack sampler", exc_info=True)

    def _send_stacks(self, counts: dict[FrameKey, int]) -> None:
        """Send sampled counts as ``stacks`` events (from the sampler's thread,
        or at exit; the sender is thread-safe and never blocks)."""
        sender = self.sender
        if sender is None:
            return
        rows = wire_rows(counts)
        events = [
            messages.stacks(self.run_key, "main", rows[k : k + MAX_STACK_ROWS])
            for k in range(0, len(rows), MAX_STACK_ROWS)
        ]
        for ev in events:
            del ev["v"], ev["run_key"]
        sender.send_batch(self.run_key, events)

    def _stop_stacks(self) -> None:
        sampler, self._stacks = self._stacks, None
        if sampler is not None and os.getpid() == self._pid:  # a fork child has no sampler
            try:
                sampler.stop()
            except Exception:
                log.debug("gpuprof: could not stop the stack sampler", exc_info=True)

    @property
    def _tracer(self) -> Tracer | None:
        """The torch.profiler windows' tracer, if tracing (tests read it)."""
        return self._windows.tracer if self._windows is not None else None

    @property
    def _aligner(self) -> Any:
        """The clock aligner, once started (benches read it)."""
        return self._clock_sync.aligner if self._clock_sync is not None else None

    def _close_aligner(self) -> None:
        if self._clock_sync is not None:
            self._clock_sync.close()

    def _send_now(self, msg: Any) -> bool:
        """Send one event now (a ``kernels`` window); False if dropped."""
        sender = self.sender
        return sender.send(msg) if sender is not None else False

    @property
    def _flop_counter(self) -> Any:
        """The one-step FLOP counter, if counting (tests read it)."""
        return self.probes.flop_counter

    def _model_info(self) -> dict[str, Any] | None:
        return self.probes.model_info(self.run_key)

    def _burst(self, steps: list[StepRecord]) -> list[StepRecord]:
        """A burst of finished steps on its way out
        (:class:`~gpuprof_shim.batcher.StepBatcher`): count them, mark those
        whose FLOPs were counted or that a torch.profiler window ran in as
        ``traced``, give them to W&B. Returns them as they are to be sent."""
        try:
            traced, windows = self.probes.traced, self._windows
            if traced or windows is not None:
                steps = [
                    rec._replace(traced=True)
                    if rec.i in traced or (windows is not None and windows.traced(rec.t0, rec.t1))
                    else rec
                    for rec in steps
                ]
            self.counter.add_steps(steps)
            sink = self._wandb
            if sink is not None:
                for rec in steps:
                    sink.add(rec)
        except Exception:
            log.debug("gpuprof: could not count a burst of steps", exc_info=True)
        return steps

    def _send_pending(self, now_ns: int, final: bool = False) -> None:
        if self._batcher is not None:
            self._batcher.flush(now_ns, final)

    def _loader_started(self) -> None:
        if self._open and self._waits is not None:
            self._waits.mark_explicit()

    def _loader_iterator(self, it: object) -> None:
        """A new loader iterator: report its settings and worker processes."""
        workers, loaders = self._workers, self._loaders
        if self._open and loaders is not None:
            loaders.on_iterator(it)
        if self._open and workers is not None:
            workers.on_iterator(it)

    def _loader_wait(self, ns: int) -> None:
        if self._open and self._waits is not None:
            self._waits.add_loader_wait(ns)

    def _unpatch(self) -> None:
        if self._comm is not None:
            self._comm.stop()  # our comm hooks stay on the reducers, as pass-throughs
        windows = self._windows
        if windows is not None:
            windows.close()  # the profiler stopped, its guard removed (idempotent)
        self.probes.abandon()
        patches, self._patches = self._patches, None
        if patches is not None:
            patches.remove()

    def _finish(self, exc: BaseException | None) -> None:
        if os.getpid() != self._pid:
            return  # a fork child leaving the block: the run, its bye and summary are the parent's
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            exc = None  # sys.exit(0) inside the loop is a normal end
        self._stop_stacks()  # its last counts go out with the last steps
        if self.machine is not None and self._open:
            self.machine.flush(self.clock())
        if self._comm is not None:
            self._comm.settle()  # the last steps' CUDA events, if any are still running
        self._send_pending(self.clock(), final=True)
        self._close_aligner()  # before bye: a result still coming goes out first
        self._open = False
        if self._recorder is not None:
            self._recorder.closed = True
        if self.link.ok:  # what gpuprofd has not stored yet goes first (a new one if need be)
            if not self.link.settle():
                log.warning("gpuprof: gpuprofd did not acknowledge every event before exit")
            self.link.stop_keeper()
        summary = self._bye(exc) if self.link.ok else None
        if summary is None:
            summary = local_summary(
                run_name=self.run_name,
                status="failed" if exc is not None else "finished",
                counter=self.counter,
                db=self.db,
                run_id=self.run_id,
                notes=[self.link.local_note(self.counter.steps)],
            )
        add_notes(
            summary,
            no_steps=no_steps_note(
                auto=self.auto,
                step_source=self.step_source,
                steps=self.counter.steps,
                failed=exc is not None,
            ),
            flop_note=self.probes.note(),
            tracer=self._tracer,
            comm=self._comm,
            aligner=self._aligner,
            unfinished_micro=self.machine.unfinished_micro if self.machine is not None else 0,
            requested_db=self.requested_db,
            socket_dir=self.socket_dir,
        )
        lost = self.link.overflow_note()
        if lost:
            summary.setdefault("notes", []).append(lost)
        self.summary = summary
        if self.print_summary:
            print_summary(summary)
        self._report(summary)

    def _report(self, summary: dict[str, Any]) -> None:
        """The end of the run for W&B and the webhook (global rank 0 only);
        each failure is one logged line."""
        sink, self._wandb = self._wandb, None
        if sink is not None:
            sink.finish(summary)
        if self.webhook is not None and self.ranks.rank == 0:
            webhooks.send(self.webhook, self.webhook_format, summary)

    def _bye(self, exc: BaseException | None) -> dict[str, Any] | None:
        assert self.sender is not None
        return self.link.bye(
            messages.bye(
                run_key=self.run_key,
                error=exc,
                sent=self.sender.sent,
                dropped=self.sender.dropped,
                mono_ns=self._ended_ns[0],
                wall_ns=self._ended_ns[1],
                cuda_uuid=identity.cuda_uuid(),
                eval_ns=self.machine.trailing_eval_ns if self.machine is not None else 0,
            )
        )

    def _teardown(self) -> None:
        global _active
        self._open = False
        try:
            sink, self._wandb = self._wandb, None
            if sink is not None:  # the run never finished: stop its thread
                sink.finish(None)
            self._stop_stacks()
            self._unpatch()
            self._close_aligner()
            if self._comm is not None:
                self._comm.close()
            self.link.close()
        finally:
            with _active_lock:
                if _active is self:
                    _active = None


#: Its public name: ``help(gpuprof.Profiler)`` and reprs say ``gpuprof.Profiler``,
#: and the class pickles by that name (``gpuprof`` resolves it lazily).
Profiler.__module__ = "gpuprof"


def _import_torch() -> None:
    """Auto mode needs torch; fail at ``__enter__`` with a clear message."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "gpuprof.profile(auto=True) needs torch; install it or use auto=False"
        ) from exc
