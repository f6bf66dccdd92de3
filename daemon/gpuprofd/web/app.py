"""The aiohttp application: built from a storage :class:`Reader` and a small
:class:`WebState`, so the node daemon and (later) the team server serve the
same app. JSON is orjson; state is typed (``web.AppKey``); live sockets are
closed with 1001 (going away) when the server shuts down.

:func:`serving` runs it on an :class:`~gpuprofd.web.address.HttpAddress`
inside a context (the daemon enters it on its exit stack).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import WSCloseCode, web

from gpuprofd.errors import BadInputError, DatabaseError, UnknownGroupError, UnknownRunError
from gpuprofd.sampling.nvml import GpuDevice
from gpuprofd.storage.reader import Reader
from gpuprofd.web.address import HttpAddress

if TYPE_CHECKING:
    from gpuprofd.web.metrics import MetricsSources

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: How long shutdown waits for requests in flight, seconds (live sockets are
#: closed first, so only plain requests can hold it).
SHUTDOWN_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class WebState:
    """What the app needs beyond the database.

    Args:
        reader: every read goes through it (the daemon's store, a pool).
        devices: this node's GPUs (index, name) to label series; empty on a
            server, where the stored rows are all there is.
        live_run_ids: the ids of the runs being tracked now (their ``live``).
        boot_id: this node's boot; with *now_mono_ns*, where a running run's
            window ends (a server has neither: a running run ends at its last step).
        now_mono_ns: this node's monotonic clock, ns.
        live_poll_s: how often a live socket looks for new rows, seconds.
        insights_poll_s: how often it looks for new insights and run state, seconds.
        watch_runs: where runs that changed are told (a team server: every
            replica's ingest, through Postgres ``NOTIFY``): a live socket then
            looks as soon as its run changes, and every *live_poll_s* only as a
            safety net. ``watch_runs(watcher)`` returns the function that stops
            it; the watcher gets the ids that changed, or None (anything may have).
        live_summary: a running run's summary as of the daemon's latest live
            insights pass (None: none yet), so that ``/runs/{id}`` need not
            build it again from the whole run; a server has none.
    """

    reader: Reader
    devices: Sequence[GpuDevice] = ()
    live_run_ids: Callable[[], set[int]] = field(default=lambda: set())
    boot_id: str | None = None
    now_mono_ns: Callable[[], int] | None = time.monotonic_ns
    live_poll_s: float = 1.0
    insights_poll_s: float = 3.0
    watch_runs: Callable[[Callable[[set[int] | None], None]], Callable[[], None]] | None = None
    live_summary: Callable[[int], dict[str, Any] | None] = field(default=lambda _: None)


STATE = web.AppKey("state", WebState)
SOCKETS = web.AppKey("sockets", weakref.WeakSet)
#: A live socket's request holds its socket here (a login's end closes it: gpuprofd.web.auth).
LIVE_SOCKET = web.RequestKey("live_socket", web.WebSocketResponse)


class ApiError(Exception):
    """A request the API answers with *status* and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_response(data: Any, status: int = 200) -> web.Response:
    """*data* as orjson JSON (non-string keys allowed: group evidence keys ranks)."""
    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS, default=str)
    return web.Response(body=body, status=status, content_type="application/json")


def error_response(status: int, message: str) -> web.Response:
    return json_response({"error": message}, status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Expected failures as JSON errors: a bad parameter 400, an unknown run
    or group 404, an unreadable database 500 (logged); unknown API paths 404."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, str(exc))
    except (UnknownRunError, UnknownGroupError) as exc:
        return error_response(404, str(exc))
    except BadInputError as exc:
        return error_response(400, str(exc))
    except DatabaseError as exc:
        log.warning("dashboard request %s failed: %s", request.path, exc)
        return error_response(500, f"the database could not be read: {exc}")
    except web.HTTPNotFound:
        if request.path.startswith("/api/"):
            return error_response(404, f"no such API path: {request.path} (see docs/dashboard.md)")
        raise
    except web.HTTPMethodNotAllowed as exc:
        if request.path.startswith("/api/"):
            return error_response(405, f"{request.method} is not allowed here ({exc.reason})")
        raise
    except web.HTTPException:
        raise
    except Exception:  # a bug: said as JSON, logged with its traceback, the daemon goes on
        log.exception("dashboard request %s failed", request.path_qs)
        return error_response(500, "gpuprofd failed to answer this request; see its log")


async def _index(request: web.Request) -> web.StreamResponse:
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        return error_response(404, "the dashboard page is not installed (web/static/index.html)")
    return web.FileResponse(page, headers={"Cache-Control": "no-cache"})


async def _cache_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Static files: revalidated each load (no build step, so no hashed names),
    the vendored library cached for a day."""
    if request.path.startswith("/static/") and "Cache-Control" not in response.headers:
        vendored = request.path.startswith("/static/vendor/")
        response.headers["Cache-Control"] = "public, max-age=86400" if vendored else "no-cache"


async def _sockets(app: web.Application) -> AsyncIterator[None]:
    """The live sockets' registry (cleanup_ctx); :func:`_close_sockets` ends them."""
    app[SOCKETS] = weakref.WeakSet()
    yield
    app[SOCKETS].clear()


async def _close_sockets(app: web.Application) -> None:
    """On shutdown, before requests are awaited: close every live socket
    with 1001 (going away), so a page knows to reconnect."""
    for ws in list(app[SOCKETS]):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"gpuprofd is shutting down")


def build_app(
    state: WebState,
    metrics_sources: MetricsSources | None = None,
    *,
    loopback_only: bool = False,
) -> web.Application:
    """The dashboard app over *state*; with *metrics_sources*, also
    Prometheus ``/metrics`` (:mod:`gpuprofd.web.metrics`). *loopback_only*
    (a node's dashboard, which has no login): only loopback host names and
    this dashboard's own pages are answered (:mod:`gpuprofd.web.origin`)."""
    from gpuprofd.web import api, live, metrics, node, origin

    guards = [origin.loopback_only] if loopback_only else []
    app = web.Application(middlewares=[*guards, _errors])
    app[STATE] = state
    app[node.NODE_FEED] = node.NodeFeed(state)
    app.cleanup_ctx.append(_sockets)
    app.on_shutdown.append(_close_sockets)
    app.on_response_prepare.append(_cache_headers)
    api.add_routes(app)
    app.router.add_get("/api/v1/live", live.handler)
    app.router.add_get("/", _index)
    if STATIC_DIR.is_dir():
        app.router.add_static("/static/", STATIC_DIR, append_version=False)
    if metrics_sources is not None:
        metrics.add_routes(app, metrics_sources)
    return app


@dataclass
class Serving:
    """A running dashboard: its ``url`` (``http://host:port``) and a note
    (``port 7311 was taken``) when it fell back to another port."""

    url: str
    note: str | None = None


def _in_use(exc: OSError) -> bool:
    return exc.errno == errno.EADDRINUSE


@contextlib.asynccontextmanager
async def serving(app: web.Application, address: HttpAddress) -> AsyncIterator[Serving]:
    """Serve *app* on *address* inside the context.

    Raises:
        BadInputError: the address cannot be bound (taken without
            ``fallback``, or not an address of this machine).
    """
    from gpuprofd.web.httplog import one_line_bad_requests

    one_line_bad_requests()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    note = None
    try:
        try:
            await web.TCPSite(runner, address.host, address.port).start()
        except OSError as exc:
            if not (_in_use(exc) and address.fallback):
                raise BadInputError(_bind_error(address, exc)) from None
            await web.TCPSite(runner, address.host, 0).start()
            note = f"port {address.port} was taken"
        port = _bound_port(runner)
        served = Serving(address.url(port), note)
        log.info("dashboard on %s%s", served.url, f" ({note}: picked a free one)" if note else "")
        yield served
    finally:
        await runner.cleanup()


def _bind_error(address: HttpAddress, exc: OSError) -> str:
    where = f"{address.host}:{address.port}"
    if _in_use(exc):
        return (
            f"cannot serve the dashboard on {where}: the port is in use; pick another with "
            "--http HOST:PORT, or --http off"
        )
    return f"cannot serve the dashboard on {where} ({exc.strerror or exc}); try --http off"


def _bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("the dashboard's socket has no address")
