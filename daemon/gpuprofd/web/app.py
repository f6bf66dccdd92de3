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
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import WSCloseCode, web

from gpuprofd.core.errors import BadInputError, DatabaseError, UnknownGroupError, UnknownRunError
from gpuprofd.storage import unreadable
from gpuprofd.web.address import HttpAddress
from gpuprofd.web.responses import ApiError, error_response
from gpuprofd.web.state import SOCKETS, STATE, WebState

if TYPE_CHECKING:
    from gpuprofd.web.metrics import MetricsSources

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: How long shutdown waits for requests in flight, seconds (live sockets are
#: closed first, so only plain requests can hold it).
SHUTDOWN_TIMEOUT_S = 2.0


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


@web.middleware
async def _unreadable(request: web.Request, handler: Any) -> web.StreamResponse:
    """What a request's reads cannot decode is counted for it (its JSON
    answer says it: :func:`gpuprofd.web.responses.json_response`)."""
    with unreadable.collecting(request.app[STATE].reader.where):
        return await handler(request)


async def _index(request: web.Request) -> web.StreamResponse:
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        return error_response(404, "the dashboard page is not installed (web/static/index.html)")
    return web.FileResponse(page, headers={"Cache-Control": "no-cache"})


#: Every response's Content-Security-Policy: scripts, styles, fetches and the
#: live socket only from this origin (``'self'`` covers ws:/wss: to it), no
#: inline script or style, no framing. The page's only other source is the
#: empty ``data:`` favicon. uPlot sizes its elements through ``element.style``
#: (the CSSOM), which ``style-src`` does not restrict; it adds no <style> element.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The :data:`CONTENT_SECURITY_POLICY` (and no MIME sniffing) on every answer,
    pages, static files and API alike."""
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")


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
    app = web.Application(middlewares=[*guards, _errors, _unreadable])
    app[STATE] = state
    app[node.NODE_FEED] = node.NodeFeed(state)
    app.cleanup_ctx.append(_sockets)
    app.on_shutdown.append(_close_sockets)
    app.on_response_prepare.append(_cache_headers)
    app.on_response_prepare.append(_security_headers)
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
