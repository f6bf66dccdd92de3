"""JSON answers and the API's expected error: what every handler of the
dashboard app and the team server's ingest returns (orjson bodies)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from gpuprofd.storage import unreadable


class ApiError(Exception):
    """A request the API answers with *status* and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_response(data: Any, status: int = 200) -> web.Response:
    """*data* as orjson JSON (non-string keys allowed: group evidence keys ranks);
    an object with ``unreadable`` added where the request's reads met stored
    values they could not decode: a sentence per kind
    (:meth:`gpuprofd.storage.unreadable.Unreadable.notes`)."""
    lost = unreadable.current()
    if lost and isinstance(data, dict):
        data = {**data, "unreadable": lost.notes()}
    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS, default=str)
    return web.Response(body=body, status=status, content_type="application/json")


def error_response(status: int, message: str) -> web.Response:
    return json_response({"error": message}, status)
