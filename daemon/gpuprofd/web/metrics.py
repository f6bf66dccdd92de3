"""``GET /metrics``: the daemon's live state in Prometheus text format.

:class:`DaemonCollector` reads the state when a scraper asks, through
:class:`MetricsSources` (callables returning immutable snapshots): nothing on
the ingest or sampling path counts anything for it. It is registered on its
own :class:`~prometheus_client.CollectorRegistry`, never the process-global one.

Series (``docs/metrics.md`` lists each with its type and unit):

- per GPU, labelled ``gpu`` (NVML index) and ``uuid``: utilization ratio,
  memory used and total bytes, power watts, temperature celsius, SM clock
  hertz, from the newest fast-loop sample; a reading NVML does not have is
  left out, never reported as 0;
- per live run, labelled ``run_name`` and ``run_id``: its last step's
  seconds and phase seconds (``phase``), steps received, current insights
  (``rule``, ``severity``); a run leaves the output when it ends;
- the daemon's health: events received, dropped by ``reason``, store queue
  depth, and on a forwarding node the team server's backlog (events, bytes,
  oldest age), events sent, refused and given up.

Labels are bounded: at most :data:`MAX_GPUS` GPUs, the newest
:data:`MAX_RUNS` live runs (``gpuprof_runs_live`` counts them all), the six
:data:`PHASES`, one series per registered insight rule, and
:data:`MAX_DROP_REASONS` drop reasons (reasons are code constants; any beyond
the bound are summed under ``other``). No step number is ever a label.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuprof.insights import Insight
from gpuprof.protocol import DATA_PHASE
from gpuprofd.sampling.nvml import GpuSample
from gpuprofd.storage.writes import Store

log = logging.getLogger(__name__)

#: GPUs exported (a node has at most 8-16; NVML numbers them from 0).
MAX_GPUS = 64
#: Live runs exported, newest (highest id) first; the rest are only counted.
MAX_RUNS = 64
#: Drop reasons exported as their own series, in the order they first
#: occurred (so a series never moves); later ones are summed under ``other``.
MAX_DROP_REASONS = 64
OTHER_REASON = "other"
#: The ``phase`` label's values: ``gpuprofctl runs``' iteration split
#: (:func:`gpuprofd.commands.runs.iteration_shares`) of one step.
PHASES = ("loader_wait", "forward", "backward", "comm", "optimizer", "other")

_NS_PER_S = 1e9


@dataclass(frozen=True)
class RunState:
    """One live run as the collector reads it (an immutable snapshot)."""

    run_id: int
    run_name: str
    steps: int
    """Step events received for the run."""
    last_step_s: float | None = None
    """The last step's duration (t1 - t0), seconds; None before its first step."""
    phases_s: tuple[tuple[str, float], ...] = ()
    """The last step's (phase, seconds) in :data:`PHASES` (:func:`step_phases_s`)."""
    insights: tuple[tuple[str, str, int], ...] = ()
    """(rule, severity, findings) of the run's latest live insights pass."""


@dataclass(frozen=True)
class MetricsSources:
    """What the collector reads, each a callable returning a snapshot; called
    on the event loop that owns the state, once per scrape."""

    gpus: Callable[[], Sequence[GpuSample]]
    """The newest fast-loop sample of each GPU."""
    runs: Callable[[], Sequence[RunState]]
    """The live runs (not those ending)."""
    drops: Callable[[], Mapping[str, int]]
    """Drops since the daemon started, by reason, in the order they first occurred."""
    events_received: Callable[[], int]
    """Valid events accepted for a known run since the daemon started."""
    store_queue_depth: Callable[[], int]
    """Writes waiting in the store's queue."""
    forward: Callable[[], ForwardGauges | None] = lambda: None
    """The forwarder's figures; None: the daemon does not forward."""


@dataclass(frozen=True)
class ForwardGauges:
    """A forwarding node's figures (the outbox as last counted, every few seconds)."""

    up: bool
    """The last batch was acknowledged (state ``ok``)."""
    backlog_events: int
    backlog_bytes: int
    oldest_age_s: float | None
    sent_events: int
    dead_events: int
    given_up_events: int


def step_phases_s(step: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """A validated ``step`` message's iteration split in seconds, as
    ``gpuprofctl runs`` splits a run: ``loader_wait`` = the wait before the
    step + its ``data`` phase; ``forward``, ``backward``, ``optimizer`` (0
    when not timed); ``comm`` (exposed collective time, left out when the
    step timed none); ``other`` = the rest of the step (unlabelled time,
    custom phases). The values add up to wait + step seconds."""
    phases = step.get("phases") or {}
    wait_ns = step.get("wait", 0) + phases.get(DATA_PHASE, 0)
    out = [("loader_wait", wait_ns)]
    out += [(p, phases.get(p, 0)) for p in ("forward", "backward")]
    if "comm" in phases:
        out.append(("comm", phases["comm"]))
    out.append(("optimizer", phases.get("optimizer", 0)))
    known_ns = sum(ns for _, ns in out) - step.get("wait", 0)
    out.append(("other", max(step["t1"] - step["t0"] - known_ns, 0)))
    return tuple((p, ns / _NS_PER_S) for p, ns in out)


def _none_or(x: float | None, scale: float) -> float | None:
    return None if x is None else x * scale


#: (name, unit, help, value of a sample in base units or None).
_GPU_GAUGES: tuple[tuple[str, str, str, Callable[[GpuSample], float | None]], ...] = (
    (
        "gpuprof_gpu_utilization_ratio",
        "ratio",
        "GPU utilization over the driver's last window, 0-1 (NVML; copy-engine time counts).",
        lambda s: _none_or(s.util_pct, 0.01),
    ),
    (
        "gpuprof_gpu_memory_used_bytes",
        "bytes",
        "GPU memory in use, bytes (NVML).",
        lambda s: s.mem_used_bytes,
    ),
    (
        "gpuprof_gpu_memory_total_bytes",
        "bytes",
        "GPU memory, bytes (NVML).",
        lambda s: s.mem_total_bytes,
    ),
    (
        "gpuprof_gpu_power_watts",
        "watts",
        "Board power draw, watts (NVML).",
        lambda s: _none_or(s.power_mw, 1e-3),
    ),
    (
        "gpuprof_gpu_temperature_celsius",
        "celsius",
        "GPU core temperature, degrees Celsius (NVML).",
        lambda s: s.temp_c,
    ),
    (
        "gpuprof_gpu_sm_clock_hertz",
        "hertz",
        "SM clock, hertz (NVML).",
        lambda s: _none_or(s.sm_clock_mhz, 1e6),
    ),
)

_RUN = ["run_name", "run_id"]


class DaemonCollector:
    """A prometheus_client collector over :class:`MetricsSources` (the
    module doc lists the series). A section that fails (a bug reading the
    state) is logged and left out; the others are still served."""

    def __init__(self, sources: MetricsSources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        for section in (self._gpus, self._runs, self._health):
            try:
                families = list(section())
            except Exception:  # noqa: BLE001 - one broken section must not hide the rest
                log.exception("/metrics: %s failed; served without it", section.__name__)
                continue
            yield from families

    def _gpus(self) -> Iterator[Metric]:
        samples = sorted(self.sources.gpus(), key=lambda s: s.index)[:MAX_GPUS]
        for name, unit, doc, value in _GPU_GAUGES:
            fam = GaugeMetricFamily(name, doc, labels=["gpu", "uuid"], unit=unit)
            for s in samples:
                v = value(s)
                if v is not None:
                    fam.add_metric([str(s.index), s.uuid], v)
            yield fam

    def _runs(self) -> Iterator[Metric]:
        runs = sorted(self.sources.runs(), key=lambda r: r.run_id, reverse=True)
        yield GaugeMetricFamily(
            "gpuprof_runs_live",
            f"Live runs (the newest {MAX_RUNS} are labelled in the gpuprof_run_* series).",
            value=len(runs),
        )
        last = GaugeMetricFamily(
            "gpuprof_run_last_step_seconds",
            "Duration of the run's last step received, seconds.",
            labels=_RUN,
            unit="seconds",
        )
        phase = GaugeMetricFamily(
            "gpuprof_run_phase_seconds",
            "The run's last step split as gpuprofctl runs splits an iteration, seconds: "
            "loader_wait (before and inside the step), forward, backward, comm (exposed), "
            "optimizer, other; they add up to the wait plus the step.",
            labels=[*_RUN, "phase"],
            unit="seconds",
        )
        steps = CounterMetricFamily("gpuprof_run_steps", "Steps received for the run.", labels=_RUN)
        insights = GaugeMetricFamily(
            "gpuprof_run_insights",
            "Findings of the run's latest live insights pass, by rule and severity.",
            labels=[*_RUN, "rule", "severity"],
        )
        for r in runs[:MAX_RUNS]:
            lv = [r.run_name, str(r.run_id)]
            steps.add_metric(lv, r.steps)
            if r.last_step_s is not None:
                last.add_metric(lv, r.last_step_s)
            for name, seconds in r.phases_s:
                phase.add_metric([*lv, name], seconds)
            for rule, severity, n in r.insights:
                insights.add_metric([*lv, rule, severity], n)
        yield from (last, phase, steps, insights)

    def _health(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "gpuprof_events_received",
            "Valid events accepted for a known run since the daemon started.",
            value=self.sources.events_received(),
        )
        dropped = CounterMetricFamily(
            "gpuprof_events_dropped",
            "Messages, events and samples dropped since the daemon started, by reason.",
            labels=["reason"],
        )
        for reason, n in bounded_reasons(self.sources.drops()):
            dropped.add_metric([reason], n)
        yield dropped
        yield GaugeMetricFamily(
            "gpuprof_store_queue_depth",
            "Writes waiting in the store's queue.",
            value=self.sources.store_queue_depth(),
        )
        fwd = self.sources.forward()
        if fwd is None:
            return
        yield GaugeMetricFamily(
            "gpuprof_forward_up",
            "1 when the team server acknowledged the last batch, else 0.",
            value=1 if fwd.up else 0,
        )
        yield GaugeMetricFamily(
            "gpuprof_forward_backlog_events",
            "Events waiting for the team server.",
            value=fwd.backlog_events,
        )
        yield GaugeMetricFamily(
            "gpuprof_forward_backlog_bytes",
            "Bytes waiting for the team server (the outbox; bounded by --forward-max-mb).",
            value=fwd.backlog_bytes,
            unit="bytes",
        )
        if fwd.oldest_age_s is not None:
            yield GaugeMetricFamily(
                "gpuprof_forward_oldest_age_seconds",
                "Age of the oldest event waiting for the team server, seconds.",
                value=fwd.oldest_age_s,
                unit="seconds",
            )
        yield CounterMetricFamily(
            "gpuprof_forward_sent_events",
            "Events the team server acknowledged since the daemon started.",
            value=fwd.sent_events,
        )
        yield GaugeMetricFamily(
            "gpuprof_forward_dead_events",
            "Events the team server refused for good (the node's dead-letter table).",
            value=fwd.dead_events,
        )
        yield GaugeMetricFamily(
            "gpuprof_forward_given_up_events",
            "Events given up over the outbox bound, never forwarded.",
            value=fwd.given_up_events,
        )


def bounded_reasons(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """*counts*' first ``MAX_DROP_REASONS - 1`` reasons (in their order) and
    the rest summed under :data:`OTHER_REASON`, so each series only grows."""
    items = list(counts.items())
    if len(items) <= MAX_DROP_REASONS:
        return items
    keep = items[: MAX_DROP_REASONS - 1]
    return [*keep, (OTHER_REASON, sum(n for _, n in items[MAX_DROP_REASONS - 1 :]))]


def snapshot(sources: MetricsSources) -> MetricsSources:
    """*sources* called once each, now, as sources that return those values
    (a source that raised raises again when called: its section is left out)."""

    def taken(source: Callable[[], Any]) -> Callable[[], Any]:
        try:
            value = source()
        except Exception as exc:  # noqa: BLE001 - reported by the collector's section
            failure = exc

            def fail() -> Any:
                raise failure

            return fail
        return lambda: value

    return MetricsSources(
        *(taken(getattr(sources, f.name)) for f in dataclasses.fields(MetricsSources))
    )


def add_routes(app: web.Application, sources: MetricsSources) -> None:
    """Add ``GET /metrics`` to *app*: Prometheus text (or OpenMetrics when the
    scraper's ``Accept`` asks for it, as prometheus_client negotiates).

    The sources are read on the event loop (they read loop-owned state), the
    text is rendered in a worker thread: at the label bounds a scrape is
    ~2,400 lines and ~100 ms of prometheus_client's formatting on a busy
    2-core host (a run or two: a few ms)."""

    async def metrics(request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(DaemonCollector(snapshot(sources)))
        body = await asyncio.to_thread(encode, registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/metrics", metrics)


# --- the daemon's real sources ----------------------------------------------


class _LiveRun(Protocol):
    run_id: int
    run_name: str
    steps: int
    ending: bool
    last_step: Mapping[str, Any] | None


class _Registry(Protocol):
    @property
    def live(self) -> Mapping[str, _LiveRun]: ...


class _Drops(Protocol):
    def snapshot(self) -> dict[str, int]: ...


class _Ingest(Protocol):
    @property
    def received(self) -> int: ...


class _Insights(Protocol):
    @property
    def latest(self) -> Mapping[int, Sequence[Insight]]: ...


def metrics_sources(
    *,
    registry: _Registry,
    gpu_latest: Mapping[str, GpuSample],
    drops: _Drops,
    store: Store,
    ingest: _Ingest,
    insights: _Insights,
    forward: Callable[[], ForwardGauges | None] | None = None,
) -> MetricsSources:
    """The sources over a running daemon's parts: its run registry
    (:class:`gpuprofd.ingest.registry.RunRegistry`), the newest GPU sample
    by UUID (:attr:`gpuprofd.services.sinks.SampleSinks.gpu_latest`, read at each
    scrape), drop counter, store, ingest (:class:`gpuprofd.ingest.data.Ingest`)
    and insights runner (:class:`gpuprofd.services.insights_runner.InsightsRunner`)."""

    def runs() -> list[RunState]:
        return [
            run_state(r, insights.latest.get(r.run_id, ()))
            for r in list(registry.live.values())
            if not r.ending
        ]

    return MetricsSources(
        gpus=lambda: tuple(gpu_latest.values()),
        runs=runs,
        drops=drops.snapshot,
        events_received=lambda: ingest.received,
        store_queue_depth=store.queue.qsize,
        forward=forward or (lambda: None),
    )


def run_state(live: _LiveRun, insights: Iterable[Insight] = ()) -> RunState:
    """A live run and its latest insights as a :class:`RunState`."""
    by_rule: dict[tuple[str, str], int] = {}
    for i in insights:
        by_rule[(i.rule, i.severity)] = by_rule.get((i.rule, i.severity), 0) + 1
    step = live.last_step
    return RunState(
        run_id=live.run_id,
        run_name=live.run_name,
        steps=live.steps,
        last_step_s=None if step is None else (step["t1"] - step["t0"]) / _NS_PER_S,
        phases_s=() if step is None else step_phases_s(step),
        insights=tuple((rule, sev, n) for (rule, sev), n in by_rule.items()),
    )
