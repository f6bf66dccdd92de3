"""The team server's ``GET /metrics``: the team's GPU-hours as Prometheus
counters, for an existing Grafana.

- ``gpuprof_gpu_hours_total{project}``: GPU-hours of the runs that ended;
- ``gpuprof_lost_gpu_hours_total{project, finding}``: the GPU-hours fixing
  each finding would have saved (each run's lost time counted once, as on
  the "GPU-hours" page).

Summed by the database at each scrape from the rollup rows
(:mod:`gpuprofd.storage.reads.rollups`), so every replica answers the same.
Labels are bounded: ``finding`` is a registered rule's name (any other is
``other``); the first :data:`MAX_PROJECTS` - 1 projects seen keep their own
label, later ones are summed under ``other`` (a run without a project is
``none``). Retention deleting old runs lowers a counter: Prometheus reads
that as a reset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, Metric

from gpuprof.insights import registered_rules
from gpuprofd.storage.reads.rollups import all_time_by_project, all_time_lost_by_rule
from gpuprofd.web.state import STATE

#: Projects with a label of their own (a Prometheus series each, per finding:
#: 50 x ~40 rules stays a few thousand series).
MAX_PROJECTS = 50
OTHER = "other"
NO_PROJECT = "none"


def project_labels(projects: list[str | None]) -> dict[str | None, str]:
    """Each of *projects* (first seen first) -> its label: its name for the
    first ``MAX_PROJECTS - 1``, :data:`OTHER` for the rest, :data:`NO_PROJECT`
    for None."""
    out: dict[str | None, str] = {}
    named = 0
    for p in projects:
        if p is None:
            out[p] = NO_PROJECT
        elif named < MAX_PROJECTS - 1 and p not in (OTHER, NO_PROJECT):
            out[p] = p
            named += 1
        else:
            out[p] = OTHER
    return out


class _Counters:
    """A prometheus_client collector over figures already read."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


async def families(db: Any) -> list[Metric]:
    """The two counter families, read from *db* (a Reader)."""
    by_project = await all_time_by_project(db)
    labels = project_labels([p for p, _, _ in by_project])
    rules = set(registered_rules())
    hours = CounterMetricFamily(
        "gpuprof_gpu_hours", "GPU-hours of the runs that ended, by project.", labels=["project"]
    )
    summed: dict[str, float] = {}
    for p, h, _ in by_project:
        summed[labels[p]] = summed.get(labels[p], 0.0) + h
    for label, h in summed.items():
        hours.add_metric([label], h)
    lost = CounterMetricFamily(
        "gpuprof_lost_gpu_hours",
        "GPU-hours fixing each finding would have saved (a run's lost time counted once).",
        labels=["project", "finding"],
    )
    by_pair: dict[tuple[str, str], float] = {}
    for p, rule, h in await all_time_lost_by_rule(db):
        key = (labels.get(p, OTHER), rule if rule in rules else OTHER)
        by_pair[key] = by_pair.get(key, 0.0) + h
    for (label, rule), h in sorted(by_pair.items()):
        lost.add_metric([label, rule], h)
    return [hours, lost]


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics`` on the team server (Prometheus text or OpenMetrics)."""
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Counters(await families(request.app[STATE].reader)))
    body = await asyncio.to_thread(encode, registry)
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_routes(app: web.Application) -> None:
    """Add the team server's ``GET /metrics`` to *app*."""
    app.router.add_get("/metrics", metrics)
