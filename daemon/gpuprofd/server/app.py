"""The team server's aiohttp app: the dashboard's app (:func:`gpuprofd.web.app.build_app`,
the same ``/api/v1`` reads and page a node serves) over the server's store,
plus ``POST /api/v1/ingest``, all behind :mod:`gpuprofd.web.auth`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiohttp import web

from gpuprofd.server import ingest_api
from gpuprofd.server.grouping import IngestGroups
from gpuprofd.server.ingest_api import AfterBatch, IngestLimits
from gpuprofd.server.notify import RunChanges
from gpuprofd.storage.writes import Store
from gpuprofd.web import auth, teammetrics
from gpuprofd.web.app import build_app
from gpuprofd.web.state import WebState


@dataclass(frozen=True)
class ServerState:
    store: Store
    limits: IngestLimits
    groups: IngestGroups
    after: AfterBatch | None = None


SERVER = web.AppKey("server", ServerState)
#: The runs changed by any replica (:class:`gpuprofd.server.notify.RunChanges`).
CHANGES = web.AppKey("changes", object)


async def _run_by_uuid(request: web.Request) -> web.Response:
    """``/runs/{uuid}``: a node's link to a run it forwarded (the summary's
    "Team server:" line), redirected to the run's page here."""
    uuid = request.match_info["uuid"].lower()
    store = request.app[SERVER].store
    if _UUID_RE.match(uuid):
        row = await store.fetchone("SELECT id FROM runs WHERE run_uuid = ?", (uuid,))
        if row is not None:
            raise web.HTTPFound(f"/#/run/{int(row[0])}")
    raise web.HTTPNotFound(
        text="no such run here (yet): a node forwards a run within seconds of its steps; "
        "runs are listed at /",
        content_type="text/plain",
    )


async def _ingest(request: web.Request) -> web.Response:
    state = request.app[SERVER]
    return await ingest_api.handle(request, state.groups, state.limits, state.after)


def build_server_app(
    store: Store,
    guard: auth.Auth,
    limits: IngestLimits | None = None,
    after: AfterBatch | None = None,
    changes: RunChanges | None = None,
) -> web.Application:
    """The server's app over *store*: ingest needs one of *guard*'s API keys,
    the API's reads a key or a viewer's session, everything else a session
    (:mod:`gpuprofd.web.auth`). With
    *changes*, live pages look as soon as their run is ingested (by any
    replica), and every :data:`SAFETY_POLL_S` otherwise."""
    state = WebState(
        reader=store,
        now_mono_ns=None,  # no node clock: a run ends at its last row
        watch_runs=changes.watch if changes is not None else None,
        live_poll_s=SAFETY_POLL_S if changes is not None else 1.0,
    )
    app = build_app(state)
    app[SERVER] = ServerState(store, limits or IngestLimits(), IngestGroups(store), after)
    app.router.add_post(INGEST_PATH, _ingest)
    app.router.add_get("/runs/{uuid}", _run_by_uuid)
    teammetrics.add_routes(app)
    guard.install(app, api_key_paths=(INGEST_PATH,), key_reads=True)
    return app


INGEST_PATH = "/api/v1/ingest"
#: With NOTIFY wake-ups, how often a live page still looks, seconds (a lost
#: notification shows within this; the listener's reconnect tells every page).
SAFETY_POLL_S = 5.0
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
