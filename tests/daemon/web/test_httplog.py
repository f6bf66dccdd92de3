"""aiohttp's log of an unparsable request, made one line
(gpuprofd.web.httplog): the parser's message kept, printable and bounded,
no traceback; any other record left as it is."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from gpuprofd.web import httplog


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    logger = logging.getLogger(httplog.SERVER_LOGGER)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.DEBUG
    httplog.one_line_bad_requests()
    httplog.one_line_bad_requests()  # once is enough: a second call adds nothing
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logger.filters = [
            f for f in logger.filters if not isinstance(f, httplog.OneLineBadRequests)
        ]
        logger.level = level


def _raised(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - the record needs a traceback
        return caught


def test_a_bad_request_is_one_line(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = logged
    assert sum(isinstance(f, httplog.OneLineBadRequests) for f in logger.filters) == 1
    too_long = _raised(LineTooLong(b"a" * 100 + b"...", 8190))
    logger.error("Error handling request from %s", "203.0.113.5", exc_info=too_long)
    token = _raised(BadHttpMessage("Invalid header token:\n\n    b'Bad\\x01H: 1'\n        ^"))
    logger.error("Error handling request from %s", "203.0.113.5", exc_info=token)
    hostile = _raised(BadHttpMessage("bad \x1b[31mred\u202e " + "x" * 500))
    logger.error("Error handling request from %s", "203.0.113.5", exc_info=hostile)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "Traceback" not in out.getvalue()
    assert lines[0].startswith("INFO bad HTTP request from 203.0.113.5: 400 Got more than 8190")
    assert (
        lines[1]
        == "INFO bad HTTP request from 203.0.113.5: 400 Invalid header token: b'Bad\\x01H: 1'"
    )
    assert "\x1b" not in lines[2] and "\u202e" not in lines[2] and "\\x1b[31mred\\u202e" in lines[2]
    reason = lines[2].split(": ", 1)[1]
    assert len(reason) == len("400 ") + httplog.MAX_REASON_CHARS and reason.endswith("...")


def test_other_records_pass_as_they_are(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = logged
    logger.error(
        "Error handling request from %s", "203.0.113.5", exc_info=_raised(ValueError("bug"))
    )
    logger.debug("plain %s", "line")
    text = out.getvalue()
    assert text.startswith("ERROR Error handling request from 203.0.113.5\nTraceback")
    assert "ValueError: bug" in text and text.endswith("DEBUG plain line\n")
