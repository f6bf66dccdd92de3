"""``POST /api/v1/ingest``: a node's batch read (bounded, as sent and
inflated), checked (:func:`gpuprofd.storage.writes.batch.validate`) and applied in
one transaction (:func:`gpuprofd.storage.writes.ingest.apply_batch`). The answers
are in ``docs/team-server.md``.

The body may be gzip or zstd (``Content-Encoding``). It is read in chunks
and never held past the limits: a body larger
than :attr:`IngestLimits.max_body_bytes` as sent, or one that inflates past
:attr:`IngestLimits.max_inflated_bytes` (a zip bomb), is refused with 413
as soon as the limit is passed, without inflating the rest (what is left of
the body is read and dropped for a few seconds, so the client sees the
answer: aiohttp's lingering close).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

try:  # Python 3.14+: the standard library's; before, its backport
    from compression.zstd import ZstdDecompressor, ZstdError
except ImportError:  # pragma: no cover - by Python version
    from backports.zstd import ZstdDecompressor, ZstdError

from gpuprofd.core.errors import DatabaseError
from gpuprofd.server.grouping import IngestGroups
from gpuprofd.storage.writes import (
    Applied,
    BatchError,
    IngestConflict,
    validate,
)
from gpuprofd.web.responses import error_response, json_response

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: Largest body accepted as sent (bytes): a second of an 8-GPU node is a few
#: KiB gzipped; a catching-up forwarder's batch stays well below this.
DEFAULT_MAX_BODY_BYTES = 16 * MIB
#: Largest body once inflated (bytes): JSON of 100,000 rows (the batch
#: limit, ~300 bytes each) is ~30 MiB.
DEFAULT_MAX_INFLATED_BYTES = 64 * MIB
_CHUNK = 64 * 1024
#: Bodies at least this large (inflated, bytes) are decoded and checked in a
#: thread: a catching-up node's batch of 100,000 rows takes ~0.5 s of it
#: (~4.5 us a step row on the test box), which on the loop would hold every
#: other node's request; a second of one node (~12 KiB) is quicker on the
#: loop than handed to a thread.
DECODE_IN_THREAD_BYTES = 1 * MIB
_ENCODINGS = ("identity", "gzip", "x-gzip", "zstd")


@dataclass(frozen=True)
class IngestLimits:
    """Body limits of the ingest endpoint, bytes."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES


class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB else f"{n} bytes"


async def read_body(request: web.Request, limits: IngestLimits) -> bytes:
    """The request's body, inflated if gzip.

    Raises:
        BodyError: 413 past a limit (named), 415 an unknown encoding, 400 a
            body that ends early or is not gzip.
    """
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
    if encoding not in _ENCODINGS:
        raise BodyError(
            415, f"Content-Encoding {encoding!r} is not taken: send gzip, zstd or identity"
        )
    too_big = (
        f"the body is larger than this server takes ({_mib(limits.max_body_bytes)} as sent, "
        f"{_mib(limits.max_inflated_bytes)} decompressed): send smaller batches"
    )
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise BodyError(413, too_big)
    inflater: _Inflater | None = None
    if encoding == "zstd":
        inflater = _Zstd()
    elif encoding != "identity":
        inflater = _Gzip()
    parts: list[bytes] = []
    sent = inflated = 0
    try:
        async for chunk in request.content.iter_chunked(_CHUNK):
            sent += len(chunk)
            if sent > limits.max_body_bytes:
                raise BodyError(413, too_big)
            if inflater is None:
                parts.append(chunk)
                continue
            data = chunk
            while data is not None and not inflater.eof:
                room = limits.max_inflated_bytes - inflated + 1
                out, data = inflater.inflate(data, room)
                inflated += len(out)
                if inflated > limits.max_inflated_bytes:
                    raise BodyError(413, too_big)
                parts.append(out)
    except (zlib.error, ZstdError) as exc:
        raise BodyError(400, f"the body is not valid {encoding} ({exc})") from None
    if inflater is not None and not inflater.eof:
        raise BodyError(400, f"the {encoding} body ends early (truncated): nothing was stored")
    return b"".join(parts)


class _Inflater:
    """A bounded decompressor: :meth:`inflate` gives at most *room* bytes
    and what of its input is left to feed again (None: all taken)."""

    eof = False

    def inflate(self, data: bytes, room: int) -> tuple[bytes, bytes | None]:
        raise NotImplementedError


class _Gzip(_Inflater):
    def __init__(self) -> None:
        self._z = zlib.decompressobj(wbits=31)

    def inflate(self, data: bytes, room: int) -> tuple[bytes, bytes | None]:
        out = self._z.decompress(data, room)
        self.eof = self._z.eof
        return out, self._z.unconsumed_tail or None


class _Zstd(_Inflater):
    def __init__(self) -> None:
        self._z = ZstdDecompressor()

    def inflate(self, data: bytes, room: int) -> tuple[bytes, bytes | None]:
        out = self._z.decompress(data, room)
        self.eof = self._z.eof
        # output held back at the bound: ask again with no new input
        return out, (None if self._z.needs_input or self.eof else b"")


#: Called after a batch was committed (insights of ended runs, live fan-out).
AfterBatch = Callable[[Applied], Awaitable[None]]


def decode(body: bytes) -> dict[str, Any]:
    """The body's batch, checked (:func:`gpuprofd.storage.writes.batch.validate`).

    Raises:
        orjson.JSONDecodeError: not JSON.
        BatchError: the first bad field.
    """
    return validate(orjson.loads(body))


async def handle(
    request: web.Request, groups: IngestGroups, limits: IngestLimits, after: AfterBatch | None
) -> web.Response:
    """One ingest request (the caller checked its API key)."""
    store = groups.store
    try:
        body = await read_body(request, limits)
    except BodyError as exc:
        return error_response(exc.status, str(exc))
    try:
        if len(body) >= DECODE_IN_THREAD_BYTES:
            batch = await asyncio.get_running_loop().run_in_executor(None, decode, body)
        else:
            batch = decode(body)
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"the body is not JSON ({exc}); nothing was stored")
    except BatchError as exc:
        return json_response(
            {"error": f"{exc}; nothing of the batch was stored", "field": exc.field}, 400
        )
    try:
        applied = await groups.apply(batch)
    except BatchError as exc:
        return json_response(
            {"error": f"{exc}; nothing of the batch was stored", "field": exc.field}, 400
        )
    except IngestConflict as exc:
        return json_response(
            {"error": f"{exc}; nothing of the batch was stored", "field": exc.field}, 409
        )
    except DatabaseError as exc:
        log.warning("ingest: %s", exc)
        return error_response(503, f"the database is unreachable ({exc}): send the batch again")
    except store.errors as exc:  # a statement the database refused: the batch as a whole
        if store.is_lost(exc):
            return error_response(503, "the database is unreachable: send the batch again")
        if "runs_uuid" in str(exc) or "runs.run_uuid" in str(exc):  # another node, just now
            return json_response(
                {
                    "error": "a run of this batch was just sent by another node; "
                    "nothing of the batch was stored",
                    "field": "events",
                },
                409,
            )
        log.warning(
            "ingest: a batch of node %s was refused by the database: %s", batch["node"], exc
        )
        return error_response(
            400, f"the database refused the batch ({str(exc)[:200]}); nothing was stored"
        )
    if applied.applied and after is not None:
        try:
            await after(applied)
        except Exception:  # noqa: BLE001 - stored is stored: the answer must say so
            log.exception("ingest: work after a batch of node %s failed", applied.node)
    return json_response(
        {
            "node": applied.node,
            "acked_seq": applied.acked_seq,
            "applied": applied.applied,
            "skipped": applied.skipped,
        }
    )
