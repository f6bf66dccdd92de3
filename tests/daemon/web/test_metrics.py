"""``/metrics``: the collector's series equal the injected state, parsed back
with prometheus_client's own parsers; then the real daemon parts behind a real
aiohttp app, fed real frames and the recorded H200 trace."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import re
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.registry import RunRegistry
from gpuprofd.ingest.runservice import RunService
from gpuprofd.sampling.nvml import GpuDevice, GpuSample
from gpuprofd.sampling.rollup import SecondRollups
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.services.sinks import SampleSinks
from gpuprofd.storage import reads, schema
from gpuprofd.storage.writes import Store
from gpuprofd.web import metrics
from gpuprofd.web.metrics import MetricsSources, RunState, add_routes, metrics_sources
from tests.daemon import h200_replay
from tests.daemon import helpers as h

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Series:
    """Every sample as (name, sorted labels) -> value, via prometheus_client's parser."""
    out: Series = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def of(series: Series, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in series.items() if n == name}


@dataclass
class Fake:
    """Mutable state behind fake sources (each call returns a fresh snapshot)."""

    gpus: list[GpuSample] = field(default_factory=list)
    runs: list[RunState] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    received: int = 0
    queued: int = 0

    def sources(self) -> MetricsSources:
        return MetricsSources(
            gpus=lambda: tuple(self.gpus),
            runs=lambda: tuple(self.runs),
            drops=lambda: dict(self.drops),
            events_received=lambda: self.received,
            store_queue_depth=lambda: self.queued,
        )


def scrape(fake: Fake | MetricsSources) -> Series:
    registry = CollectorRegistry()
    registry.register(
        metrics.DaemonCollector(fake if isinstance(fake, MetricsSources) else fake.sources())
    )
    return parse(generate_latest(registry).decode())


def gpu(index: int, uuid: str, **kw: Any) -> GpuSample:
    values = dict(
        util_pct=87.0,
        mem_used_bytes=40 * 2**30,
        mem_total_bytes=141 * 10**9,
        power_mw=250_000,
        temp_c=61,
        sm_clock_mhz=1980,
    )
    return GpuSample(index, uuid, **{**values, **kw})


def test_gpu_gauges_are_the_sample_in_base_units():
    fake = Fake(gpus=[gpu(0, "GPU-a"), gpu(1, "GPU-b", util_pct=3.0, power_mw=None)])
    s = scrape(fake)
    a = (("gpu", "0"), ("uuid", "GPU-a"))
    b = (("gpu", "1"), ("uuid", "GPU-b"))
    assert of(s, "gpuprof_gpu_utilization_ratio") == {a: 0.87, b: 0.03}
    assert of(s, "gpuprof_gpu_memory_used_bytes") == {a: 40 * 2**30, b: 40 * 2**30}
    assert of(s, "gpuprof_gpu_memory_total_bytes")[a] == 141e9
    assert of(s, "gpuprof_gpu_temperature_celsius")[a] == 61
    assert of(s, "gpuprof_gpu_sm_clock_hertz")[a] == 1.98e9
    # 250 W from 250,000 mW; GPU 1 has no power reading: left out, never 0
    assert of(s, "gpuprof_gpu_power_watts") == {a: 250.0}


def test_run_series_equal_the_live_state():
    phases = metrics.step_phases_s(
        {
            "t0": 1_000,
            "t1": 1_000 + 50_000_000,
            "wait": 5_000_000,
            "phases": {"forward": 10e6, "backward": 20e6, "comm": 3e6, "data": 1e6},
        }
    )
    run = RunState(7, "bert", 120, 0.05, phases, (("dataloader_stall", "HIGH", 1),))
    s = scrape(Fake(runs=[run]))
    lv = (("run_id", "7"), ("run_name", "bert"))
    assert of(s, "gpuprof_run_last_step_seconds") == {lv: 0.05}
    assert of(s, "gpuprof_run_steps_total") == {lv: 120}
    assert of(s, "gpuprof_runs_live") == {(): 1}
    got = {dict(k)["phase"]: v for k, v in of(s, "gpuprof_run_phase_seconds").items()}
    # loader wait = 5 ms before + 1 ms inside; other = 50 - (1+10+20+3+0) ms
    assert got == {
        "loader_wait": 0.006,
        "forward": 0.01,
        "backward": 0.02,
        "comm": 0.003,
        "optimizer": 0.0,
        "other": 0.016,
    }
    want = {**dict(lv), "rule": "dataloader_stall", "severity": "HIGH"}
    assert of(s, "gpuprof_run_insights") == {tuple(sorted(want.items())): 1}


def test_a_step_without_collectives_has_no_comm_phase():
    phases = dict(metrics.step_phases_s({"t0": 0, "t1": 10, "wait": 0, "phases": {"forward": 40}}))
    assert "comm" not in phases
    assert phases["other"] == 0.0  # phases longer than the step (clock skew): never negative


def test_health_series():
    s = scrape(Fake(drops={"not_json": 2, "store_backpressure": 5}, received=40, queued=3))
    assert of(s, "gpuprof_events_received_total") == {(): 40}
    assert of(s, "gpuprof_events_dropped_total") == {
        (("reason", "not_json"),): 2,
        (("reason", "store_backpressure"),): 5,
    }
    assert of(s, "gpuprof_store_queue_depth") == {(): 3}


def test_an_ended_run_leaves_the_output():
    fake = Fake(runs=[RunState(1, "a", 3, 0.1), RunState(2, "b", 4, 0.2)])
    assert {dict(k)["run_id"] for k in of(scrape(fake), "gpuprof_run_steps_total")} == {"1", "2"}
    fake.runs.pop(0)
    s = scrape(fake)
    run_ids = {dict(labels).get("run_id") for (_, labels) in s}
    assert "1" not in run_ids and "2" in run_ids
    assert of(s, "gpuprof_runs_live") == {(): 1}


HOSTILE = [
    'quote " backslash \\ end',
    "new\nline",
    "<script>alert(1)</script>",
    "\u202eevil\u2066bidi\u2069",
    'x{run_id="9"} 1\n# TYPE',
    "é" * 10_000,
]


def test_a_hostile_run_name_parses_back_verbatim():
    fake = Fake(runs=[RunState(i + 1, name, i, 0.01) for i, name in enumerate(HOSTILE)])
    s = scrape(fake)
    got = {dict(k)["run_id"]: dict(k)["run_name"] for k in of(s, "gpuprof_run_steps_total")}
    assert got == {str(i + 1): name for i, name in enumerate(HOSTILE)}
    assert len(of(s, "gpuprof_run_last_step_seconds")) == len(HOSTILE)  # nothing injected


def test_label_cardinality_is_bounded():
    fake = Fake(
        gpus=[gpu(i, f"GPU-{i}") for i in range(100)],
        runs=[RunState(i, f"r{i}", i, 0.01, metrics.step_phases_s(_step())) for i in range(1000)],
        drops={f"reason{i}": i for i in range(500)},
    )
    s = scrape(fake)
    assert len(of(s, "gpuprof_gpu_utilization_ratio")) == metrics.MAX_GPUS
    kept = {int(dict(k)["run_id"]) for k in of(s, "gpuprof_run_steps_total")}
    assert kept == set(range(1000 - metrics.MAX_RUNS, 1000))  # the newest
    assert of(s, "gpuprof_runs_live") == {(): 1000}
    assert len(of(s, "gpuprof_run_phase_seconds")) == metrics.MAX_RUNS * len(metrics.PHASES) - (
        metrics.MAX_RUNS  # no comm phase in these steps
    )
    dropped = {dict(k)["reason"]: v for k, v in of(s, "gpuprof_events_dropped_total").items()}
    assert len(dropped) == metrics.MAX_DROP_REASONS
    assert sum(dropped.values()) == sum(range(500))  # nothing lost, the tail under "other"
    assert dropped["reason0"] == 0 and dropped[metrics.OTHER_REASON] == sum(range(63, 500))


def _step(t0: int = 0, ms: float = 10.0) -> dict[str, Any]:
    return {"t0": t0, "t1": t0 + int(ms * 1e6), "wait": 0, "phases": {"forward": 1e6}}


def test_a_failing_section_is_left_out_and_the_rest_served(caplog):
    def broken() -> Sequence[GpuSample]:
        raise RuntimeError("NVML state unreadable")

    fake = Fake(runs=[RunState(1, "a", 3, 0.1)], received=5)
    src = fake.sources()
    s = scrape(
        MetricsSources(broken, src.runs, src.drops, src.events_received, src.store_queue_depth)
    )
    assert not of(s, "gpuprof_gpu_utilization_ratio")
    assert of(s, "gpuprof_events_received_total") == {(): 5}
    assert of(s, "gpuprof_run_steps_total")
    assert "served without it" in caplog.text


async def test_the_route_reads_the_sources_on_the_event_loop_once_each():
    """The sources read loop-owned state: they are called on the loop's
    thread (the text is rendered in a worker thread), once per scrape."""
    calls: list[tuple[str, int]] = []
    fake = Fake(runs=[RunState(1, "a", 3, 0.1)], received=5)
    src = fake.sources()

    def recorded(name: str, source: Any) -> Any:
        def call() -> Any:
            calls.append((name, threading.get_ident()))
            return source()

        return call

    def broken() -> Sequence[GpuSample]:
        calls.append(("gpus", threading.get_ident()))
        raise RuntimeError("NVML state unreadable")

    names = ("runs", "drops", "events_received", "store_queue_depth")
    sources = MetricsSources(broken, *(recorded(n, getattr(src, n)) for n in names))
    app = web.Application()
    add_routes(app, sources)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/metrics")
        assert resp.status == 200
        s = parse(await resp.text())
    assert of(s, "gpuprof_events_received_total") == {(): 5}  # served without the GPUs
    assert not of(s, "gpuprof_gpu_power_watts")
    assert sorted(n for n, _ in calls) == sorted(["gpus", *names])
    assert {t for _, t in calls} == {threading.get_ident()}


def test_docs_list_every_metric_served():
    run = RunState(1, "a", 3, 0.1, metrics.step_phases_s(_step()), (("r", "HIGH", 1),))
    fake = Fake(gpus=[gpu(0, "GPU-a")], runs=[run], drops={"not_json": 1})
    forwarding = metrics.ForwardGauges(True, 5, 500, 1.0, 10, 1, 1)
    served = {
        name for name, _ in scrape(dataclasses.replace(fake.sources(), forward=lambda: forwarding))
    }
    doc = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    node, team = doc.split("\n## The team server's GPU-hours\n", 1)  # the server's own /metrics

    def rows(text: str) -> set[str]:
        return set(re.findall(r"^\| `(gpuprof_[a-z_]+)` \|", text, re.MULTILINE))

    assert rows(node) == served
    # the team server's counters (prometheus_client adds _total to a counter's name)
    from gpuprofd.web.teammetrics import families

    class NoRuns:
        async def fetchall(self, sql: str, params: tuple = ()) -> list:
            return []

    names = {f"{m.name}_total" for m in asyncio.run(families(NoRuns()))}
    assert rows(team) == names == {"gpuprof_gpu_hours_total", "gpuprof_lost_gpu_hours_total"}


# --- the real parts behind a real app -----------------------------------------


@contextlib.asynccontextmanager
async def _parts(db: Path, device: GpuDevice) -> AsyncIterator[dict[str, Any]]:
    """A writing store, the run service (the replayed GPU as the runs'),
    insights, ingest (frames handed in) and sample sinks, as the daemon wires them."""
    schema.prepare(db)
    drops = DropCounter()
    store = Store(db, drops)
    await store.open()
    store.start()
    registry = RunRegistry()
    insights = InsightsRunner(store, str(db), None, drops=drops)
    runs = RunService(
        store, registry, insights, [device], pid_alive=lambda p, w: True, default_gpu=device
    )
    sinks = SampleSinks(store, drops, SecondRollups([device]))
    ingest = Ingest(None, runs, store, drops)  # type: ignore[arg-type]
    try:
        yield dict(
            store=store, runs=runs, insights=insights, ingest=ingest, sinks=sinks, drops=drops
        )
    finally:
        await runs.close_tails()
        await store.close()


def _replayed(n: int) -> list[tuple[int, list[GpuSample]]]:
    return [(mono, fast) for mono, fast, _ in itertools.islice(h200_replay.ticks(hz=10), n)]


async def test_metrics_of_a_real_daemon_part_set(tmp_path: Path):
    ticks = _replayed(40)
    last = ticks[-1][1][0]
    device = GpuDevice(last.index, last.uuid, "NVIDIA H200")
    async with _parts(tmp_path / "m.db", device) as p:
        sources = metrics_sources(
            registry=p["runs"].registry,
            gpu_latest=p["sinks"].gpu_latest,
            drops=p["drops"],
            store=p["store"],
            ingest=p["ingest"],
            insights=p["insights"],
        )
        app = web.Application()
        add_routes(app, sources)
        sink = p["sinks"].gpu_sink()
        for mono, samples in ticks:  # what the sampler thread hands the loop
            sink(mono, samples)
        live = await p["runs"].hello(h.hello("k", os.getpid(), run_name='evil "run"\\<b>'))
        base = 1_000_000_000
        for i in range(40):  # a loader-bound loop: 8 ms waits for 10 ms steps
            await p["ingest"].handle(orjson.dumps(h.step("k", i, base)))
        await p["ingest"].handle(b"{not json")
        await p["store"].flush()
        found = await p["insights"].live(live.run_id)
        assert found, "a loader-bound run has findings to export"

        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            assert resp.status == 200
            assert resp.headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4
            s = parse(await resp.text())
            om = await client.get(
                "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
            assert om.headers["Content-Type"].startswith("application/openmetrics-text")
            om_names = {f.name for f in openmetrics_families(await om.text())}

            g = (("gpu", str(last.index)), ("uuid", last.uuid))
            assert of(s, "gpuprof_gpu_utilization_ratio") == {g: last.util_pct / 100}
            assert of(s, "gpuprof_gpu_power_watts") == {g: last.power_mw / 1000}
            assert of(s, "gpuprof_gpu_sm_clock_hertz") == {g: last.sm_clock_mhz * 1e6}
            assert of(s, "gpuprof_gpu_memory_used_bytes") == {g: last.mem_used_bytes}

            lv = (("run_id", str(live.run_id)), ("run_name", 'evil "run"\\<b>'))
            assert of(s, "gpuprof_run_steps_total") == {lv: 40}
            assert of(s, "gpuprof_run_last_step_seconds") == {lv: h.STEP_NS / 1e9}
            phases = {dict(k)["phase"]: v for k, v in of(s, "gpuprof_run_phase_seconds").items()}
            assert phases["loader_wait"] == h.WAIT_NS / 1e9
            assert phases["backward"] == h.PHASES["backward"] / 1e9
            stored = await reads.stored_insights(p["store"], live.run_id)
            assert {
                (dict(k)["rule"], dict(k)["severity"]): v
                for k, v in of(s, "gpuprof_run_insights").items()
            } == {(i["rule"], i["severity"]): 1 for i in stored}
            assert of(s, "gpuprof_events_received_total") == {(): 40}
            assert of(s, "gpuprof_events_dropped_total") == {(("reason", "not_json"),): 1}
            assert "gpuprof_store_queue_depth" in {n for n, _ in s}
            assert "gpuprof_events_received" in om_names  # OpenMetrics' counter family name

            # the run's GPU is the replayed one (a CPU run under the replay backend)
            row = await reads.find_run(p["store"], run_id=live.run_id)
            assert row["cuda_uuid"] == last.uuid

            await p["runs"].bye(h.bye("k", sent=40))
            after = parse(await (await client.get("/metrics")).text())
            assert not of(after, "gpuprof_run_steps_total")
            assert of(after, "gpuprof_runs_live") == {(): 0}
            assert of(after, "gpuprof_gpu_power_watts") == {g: last.power_mw / 1000}


def test_a_forwarding_node_exports_its_backlog_and_a_node_that_does_not_exports_none():
    fake = Fake(received=1)
    plain = scrape(fake)
    assert not [name for name, _ in plain if name.startswith("gpuprof_forward")]
    gauges = metrics.ForwardGauges(
        up=False,
        backlog_events=1200,
        backlog_bytes=345_678,
        oldest_age_s=61.5,
        sent_events=9000,
        dead_events=2,
        given_up_events=0,
    )
    src = fake.sources()
    s = scrape(dataclasses.replace(src, forward=lambda: gauges))
    assert of(s, "gpuprof_forward_up") == {(): 0}
    assert of(s, "gpuprof_forward_backlog_events") == {(): 1200}
    assert of(s, "gpuprof_forward_backlog_bytes") == {(): 345_678}
    assert of(s, "gpuprof_forward_oldest_age_seconds") == {(): 61.5}
    assert of(s, "gpuprof_forward_sent_events_total") == {(): 9000}
    assert of(s, "gpuprof_forward_dead_events") == {(): 2}
    caught_up = dataclasses.replace(gauges, up=True, backlog_events=0, oldest_age_s=None)
    s = scrape(dataclasses.replace(src, forward=lambda: caught_up))
    assert of(s, "gpuprof_forward_up") == {(): 1}
    assert not of(s, "gpuprof_forward_oldest_age_seconds")
