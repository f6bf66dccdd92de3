"""``profile(wandb=True)``: the run's steps and summary in the active W&B run.

Everything goes under ``gpuprof/`` with gpuprof's own step axis
(``wandb.define_metric("gpuprof/*", step_metric="gpuprof/step")``), never
``step=``, so the user's own ``wandb.log`` calls and their steps are left
alone. Per step: ``gpuprof/step_ms`` (the step, first forward to optimizer
step end), ``gpuprof/loader_wait_ms``, ``gpuprof/<phase>_ms`` for each
timed phase (forward, backward, optimizer, comm, data, ...; gpuprof's own
time in the step as ``gpuprof/gpuprof_overhead_ms``),
``gpuprof/micro_batches``, ``gpuprof/traced`` (1 when a profiler window or
the FLOP count ran in it), and ``gpuprof/mfu`` (0-1) when the step's FLOP
and the GPU's dense datasheet peak are known (:mod:`gpuprof.gpus`). At the
end: the findings as a ``wandb.Table`` (``gpuprof/insights``, ranked by
what fixing each is worth, with its ``gain_*`` columns) and the summary's
figures in ``run.summary`` (``gpuprof/median_step_ms``, ...,
``gpuprof/fix_all_speedup_max``, ``gpuprof/top_gain_speedup_max``).

The training thread only appends each finished step to a bounded queue; a
background thread logs the queue once a second. wandb is imported only
when asked for. A failure of wandb is one logged line and ends the logging;
it never reaches training.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from gpuprof.extras import install_hint
from gpuprof.insights.gains import ranked
from gpuprof.protocol import OWN_TIME_PHASE, clean_text
from gpuprof_shim.report import report_command
from gpuprof_shim.steps import StepRecord

log = logging.getLogger("gpuprof.shim")

#: Prefix of every key gpuprof logs, and its step axis.
PREFIX = "gpuprof/"
STEP_KEY = PREFIX + "step"
#: Seconds between the background thread's logging rounds.
LOG_INTERVAL_S = 1.0
#: Steps queued for logging at most; older ones are dropped (and counted)
#: if W&B falls this far behind.
MAX_QUEUED = 100_000
#: Seconds the end of the run may spend logging what is still queued.
FINISH_S = 10.0
#: The findings table's columns: the finding, then what fixing it is worth
#: (``gain_*``, :mod:`gpuprof.insights.gains`; empty when it costs no time).
INSIGHT_COLUMNS = (
    "severity",
    "rule",
    "title",
    "detail",
    "fix",
    "gain_speedup_max",
    "gain_ms_per_iteration",
    "gain_pct",
    "gain_run_s",
    "gain_usd",
    "gain_method",
)
#: Summary figures copied into ``run.summary`` (as ``gpuprof/<key>``).
SUMMARY_KEYS = (
    "run_id",
    "steps",
    "median_step_ms",
    "avg_step_ms",
    "micro_batches_per_step",
    "skipped_updates",
    "eval_s",
    "mfu",
    "achieved_tflops",
)

_PHASE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
#: Phases logged under another name than their own.
_PHASE_KEYS = {OWN_TIME_PHASE: "gpuprof_overhead"}


def step_row(rec: StepRecord, mfu_inputs: tuple[float, float] | None) -> dict[str, Any]:
    """One step's W&B row. *mfu_inputs*: (FLOP per step, peak FLOP/s of
    the GPU), or None: no ``gpuprof/mfu``. MFU divides by the iteration
    (loader wait + step), as the summary's MFU does; a traced step has none."""
    row: dict[str, Any] = {
        STEP_KEY: rec.i,
        PREFIX + "step_ms": (rec.t1 - rec.t0) / 1e6,
        PREFIX + "loader_wait_ms": rec.wait / 1e6,
        PREFIX + "micro_batches": rec.micro,
        PREFIX + "traced": int(rec.traced),
    }
    for phase, ns in rec.phases.items():
        name = _PHASE_KEYS.get(phase) or _PHASE_NAME.sub("_", str(phase))[:40]
        row[f"{PREFIX}{name}_ms"] = ns / 1e6
    iteration_s = (rec.t1 - rec.t0 + rec.wait) / 1e9
    if mfu_inputs is not None and iteration_s > 0 and not rec.traced:
        flops, peak = mfu_inputs
        row[PREFIX + "mfu"] = flops / iteration_s / peak
    return row


def _cell(value: Any) -> str:
    return "" if value is None else clean_text(str(value), 2000)


def insight_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    """The findings table's rows (:data:`INSIGHT_COLUMNS`), ranked by gain
    (:func:`gpuprof.insights.gains.ranked`; severity breaks ties)."""
    return [
        [_cell(ins.get(c)) for c in INSIGHT_COLUMNS]
        for ins in ranked(summary.get("insights") or [])
    ]


def summary_figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``gpuprof/<key>`` for the figures of :data:`SUMMARY_KEYS` that are
    known, the findings' count, memory peaks (bytes) and the report command."""
    out = {PREFIX + k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None}
    out[PREFIX + "findings"] = len(summary.get("insights") or [])
    gains = summary.get("gains") or {}
    for key in ("fix_all_speedup_max", "fix_all_ms_per_iteration", "fix_all_run_s"):
        if gains.get(key) is not None:
            out[PREFIX + key] = gains[key]
    top = next(
        (i for i in ranked(summary.get("insights") or []) if i.get("gain_speedup_max")), None
    )
    if top is not None:
        out[PREFIX + "top_gain_rule"] = top["rule"]
        out[PREFIX + "top_gain_speedup_max"] = top["gain_speedup_max"]
    for key, value in (summary.get("memory") or {}).items():
        out[PREFIX + key] = value
    command = report_command(summary)
    if command:
        out[PREFIX + "full_report"] = command
    return out


class WandbSink:
    """Logs a profile's steps to a W&B run from a background thread.

    Args:
        run: the ``wandb.run`` to log to.
        wandb: the ``wandb`` module (its ``Table``).
        mfu_inputs: returns (FLOP per step, GPU peak FLOP/s) once both are
            known, else None; asked once per logging round.
        interval_s: seconds between logging rounds.
    """

    def __init__(
        self,
        run: Any,
        wandb: Any,
        *,
        mfu_inputs: Callable[[], tuple[float, float] | None] = lambda: None,
        interval_s: float = LOG_INTERVAL_S,
    ) -> None:
        self.run = run
        self.wandb = wandb
        self.mfu_inputs = mfu_inputs
        self.interval_s = interval_s
        self._queue: deque[StepRecord] = deque()
        self._lock = threading.Lock()  # one logging round at a time
        self._stop = threading.Event()
        self._failed = False
        #: Steps logged, and steps dropped because W&B fell behind.
        self.logged = 0
        self.dropped = 0
        run.define_metric(STEP_KEY)
        run.define_metric(PREFIX + "*", step_metric=STEP_KEY)
        self._thread = threading.Thread(target=self._loop, name="gpuprof-wandb", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, **kwargs: Any) -> WandbSink | None:
        """A sink on the active ``wandb.run``; None, with one logged line,
        when wandb is not installed, no run is active, or it fails."""
        try:
            import wandb
        except ImportError:
            log.warning("gpuprof: wandb=True but wandb is not installed: %s", install_hint("wandb"))
            return None
        run = getattr(wandb, "run", None)
        if run is None:
            log.warning(
                "gpuprof: wandb=True but no W&B run is active (call wandb.init() before "
                "gpuprof.profile()); not logging to W&B"
            )
            return None
        try:
            return cls(run, wandb, **kwargs)
        except Exception as exc:
            log.warning("gpuprof: could not log to W&B: %s", _why(exc))
            return None

    def add(self, rec: StepRecord) -> None:
        """Queue a finished step (training thread; never raises)."""
        queue = self._queue
        if len(queue) >= MAX_QUEUED:
            queue.popleft()
            self.dropped += 1
        queue.append(rec)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._drain()

    def _drain(self, deadline: float | None = None) -> None:
        """Log what is queued (until *deadline*, ``time.monotonic()``). The
        background thread's round (no deadline) stops once the run ended, so
        that :meth:`finish` logs the rest within its own deadline."""
        with self._lock:
            queue = self._queue
            mfu_inputs = self.mfu_inputs() if queue else None
            while queue and not self._failed:
                if deadline is None and self._stop.is_set():
                    return
                if deadline is not None and time.monotonic() > deadline:
                    self.dropped += len(queue)
                    queue.clear()
                    return
                rec = queue.popleft()
                try:
                    self.run.log(step_row(rec, mfu_inputs))
                    self.logged += 1
                except Exception as exc:
                    self._fail(exc)

    def finish(self, summary: Mapping[str, Any] | None) -> None:
        """The run ended: log what is left (:data:`FINISH_S` at most, the
        background thread's last call included), the findings table and the
        summary figures. Never raises."""
        self._stop.set()
        deadline = time.monotonic() + FINISH_S
        try:
            self._thread.join(timeout=FINISH_S)
            self._drain(deadline=deadline)
            if summary is None or self._failed:
                return
            table = self.wandb.Table(columns=list(INSIGHT_COLUMNS), data=insight_rows(summary))
            self.run.log({PREFIX + "insights": table})
            self.run.summary.update(summary_figures(summary))
            if self.dropped:
                log.warning("gpuprof: %d steps were not logged to W&B", self.dropped)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            log.warning("gpuprof: logging to W&B failed, stopped: %s", _why(exc))


def _why(exc: BaseException) -> str:
    return clean_text(f"{type(exc).__name__}: {exc}", 200)
