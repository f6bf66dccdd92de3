"""One batch posted to the team server's ``/api/v1/ingest``
(``docs/team-server.md``), and what its answer means for the node.

:func:`post` returns :class:`Acked` or raises one of:

- :class:`Retry`: try the same batch again later (no answer, a 5xx, 429;
  ``retry_after_s`` from the server's ``Retry-After`` when it gave one);
- :class:`Paused`: nothing can be sent until someone acts (the key is
  refused, the URL is not a team server's ingest, the server does not take
  this batch format): said once in the log and in ``gpuprofctl status``,
  tried again now and then, the outbox kept;
- :class:`Refused`: the server will never take this batch as it is (400,
  409, 413, ...): its events go to the dead-letter table (``field`` names
  the event when the server said which).
"""

from __future__ import annotations

import asyncio
import gzip
import re
from dataclasses import dataclass

import aiohttp
import orjson

#: How long one post may take before it counts as no answer, seconds.
POST_TIMEOUT_S = 60.0
#: Bodies at least this large are compressed off the event loop (bytes).
_THREAD_GZIP_BYTES = 256 * 1024
#: How long a paused forwarder waits before trying again, seconds (a key file
#: fixed in the meantime is read again on the next try).
PAUSED_RETRY_S = 30.0
_EVENT_RE = re.compile(r"^events\[(\d+)\]")


@dataclass(frozen=True)
class Acked:
    """The server applied the batch: every event up to ``acked_seq`` is stored there."""

    acked_seq: int
    applied: int
    skipped: int


class Retry(Exception):
    """Send the batch again later."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Paused(Retry):
    """Nothing can be sent until the key, the URL or the server changes."""

    def __init__(self, message: str) -> None:
        super().__init__(message, PAUSED_RETRY_S)


class Refused(Exception):
    """The server refused the batch for good (*status*); *event*: the index
    of the event it named, if it named one; *field*: what it named
    (``events[3].run``: that event's run, not the event itself, is refused)."""

    def __init__(self, status: int, message: str, event: int | None, field: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.event = event
        self.field = field


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delta form; an HTTP date is ignored)."""
    if not value:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        return None


async def compress(body: bytes) -> bytes:
    """*body* gzipped (level 6), off the event loop when large."""
    if len(body) < _THREAD_GZIP_BYTES:
        return gzip.compress(body, 6)
    return await asyncio.to_thread(gzip.compress, body, 6)


async def post(session: aiohttp.ClientSession, url: str, key: str, body_gz: bytes) -> Acked:
    """Post one gzipped batch to *url* (the server's ingest endpoint).

    Raises:
        Retry, Paused, Refused: see the module doc.
    """
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
    }
    try:
        async with session.post(
            url,
            data=body_gz,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S),
            allow_redirects=False,
        ) as resp:
            status = resp.status
            raw = await resp.read()
            retry_after = _retry_after(resp.headers.get("Retry-After"))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise Retry(f"no answer from {url} ({type(exc).__name__}: {exc})") from None
    try:
        answer = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    said = str(answer.get("error") or raw[:200].decode("utf-8", "replace")).strip()
    if status == 200:
        try:
            return Acked(int(answer["acked_seq"]), int(answer["applied"]), int(answer["skipped"]))
        except (KeyError, TypeError, ValueError):
            raise Paused(
                f"{url} answered 200 but not as a gpuprof team server does: is --server right?"
            ) from None
    if status in (401, 403):
        raise Paused(
            f"the team server refused the API key ({status}: {said}): fix GPUPROF_API_KEY, "
            "GPUPROF_API_KEY_FILE or --api-key-file; nothing is lost meanwhile"
        )
    if status in (404, 405) or 300 <= status < 400:
        raise Paused(
            f"{url} is not a team server's ingest endpoint ({status}): check --server "
            "(the URL gpuprofd serve prints)"
        )
    if status == 429 or status >= 500:
        raise Retry(f"the team server answered {status}: {said}", retry_after)
    field = str(answer.get("field") or "")
    if status == 400 and field == "v":
        raise Paused(f"the team server does not take this node's batch format: {said}")
    m = _EVENT_RE.match(field)
    raise Refused(status, f"{status}: {said}", int(m.group(1)) if m else None, field)
