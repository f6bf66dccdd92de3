"""aiohttp's log of requests it could not even parse (a 9 kB header, a bad
header byte, TLS sent to the HTTP port): one line each, not a traceback.

aiohttp answers such a request 400 itself and logs it on ``aiohttp.server``
with the parser's traceback, several lines echoing the request's bytes.
:class:`OneLineBadRequests` (a :class:`logging.Filter`) rewrites those
records to ``bad HTTP request from ADDR: 400 WHAT`` (WHAT: the parser's
message on one line, printable, at most :data:`MAX_REASON_CHARS`), at INFO (aiohttp's
DEBUG ones, TLS on the HTTP port, stay DEBUG). Anything else passes as it is.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

#: The logger aiohttp's request handler logs to.
SERVER_LOGGER = "aiohttp.server"
#: The longest reason kept from the parser's message, characters.
MAX_REASON_CHARS = 160


def reason(exc: HttpProcessingError) -> str:
    """``400 <the parser's message>``: its lines joined (its ``^`` marker
    dropped), printable, bounded."""
    lines = [line.strip() for line in str(exc.message or "").splitlines()]
    text = " ".join(line for line in lines if line.strip("^ ")) or type(exc).__name__
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3] + "..."
    return f"{exc.code} {text}"


class OneLineBadRequests(logging.Filter):
    """Rewrites aiohttp's record of an unparsable request to one line (module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "bad HTTP request from %s: %s", (peer, reason(exc))
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            if record.levelno > logging.INFO:
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def one_line_bad_requests() -> None:
    """Install :class:`OneLineBadRequests` on aiohttp's server logger (once)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, OneLineBadRequests) for f in logger.filters):
        logger.addFilter(OneLineBadRequests())
