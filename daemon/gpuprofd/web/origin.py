"""Which pages and host names may talk to the dashboard.

A node's dashboard has no login: it trusts loopback. A browser, though, lets
any site's page open a WebSocket to ``ws://127.0.0.1:7311`` (the handshake
carries the page's ``Origin``, and the socket is not bound by CORS), and a
DNS-rebinding page reaches loopback under its own host name. So the node
answers only requests whose ``Host`` is a loopback name and whose ``Origin``,
when a browser sends one, is the dashboard itself.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs, web

from gpuprofd.web.responses import error_response

#: Host names that are this machine's loopback whatever DNS says.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def same_origin(request: web.Request) -> bool:
    """True when the request carries no ``Origin`` (not a browser page) or the
    one of a page served by this host (``scheme://`` + the ``Host`` header)."""
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None:
        return True
    _, _, rest = origin.partition("://")
    return rest.rstrip("/") == request.host


def host_name(host: str) -> str:
    """The name part of a ``Host`` header: ``[::1]:7311`` → ``::1``, ``localhost:7311``
    → ``localhost`` (lower case, no trailing dot)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0].rstrip(".") if ":" in host else host.rstrip(".")


def loopback_host(request: web.Request) -> bool:
    """The ``Host`` header names loopback (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    name = host_name(request.host)
    return name in LOOPBACK_NAMES or name.startswith("127.") and name.count(".") == 3


@web.middleware
async def loopback_only(request: web.Request, handler: Any) -> web.StreamResponse:
    """Refuse (403) another host name (DNS rebinding) and another site's page."""
    if not loopback_host(request):
        return error_response(
            403,
            f"this dashboard answers only on loopback names (127.0.0.1, localhost), not "
            f"{host_name(request.host)!r}; open it as http://127.0.0.1:PORT",
        )
    if not same_origin(request):
        return error_response(403, "a request from another site's page is refused")
    return await handler(request)
