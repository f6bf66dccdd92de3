"""``profile(webhook=URL)``: post the run's summary when it ends.

Two bodies (``webhook_format``): ``"slack"``, Slack's incoming-webhook
message (``text`` for notifications, and blocks: a header with the run and
its steps, what the top fix is worth, one section per finding with its
severity and worth, ranked by gain, and the full-report command), and
``"json"``, ``{"event": "gpuprof.run_end", "summary": {...}, "text": "..."}``
with the summary dict as ``gpuprof.summary`` builds it.

The post runs in a background thread that exit waits for at most
:data:`TIMEOUT_S`; a failure (refused, timed out, an HTTP error status) is
one logged line naming only the URL's scheme and host (a Slack webhook's
path is its secret). The standard library's urllib does the request: the
shim gains no dependency.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from gpuprof.insights.gains import ranked
from gpuprof.protocol import clean_text
from gpuprof.summary import gain_headline, gain_line
from gpuprof_shim.report import FULL_REPORT, report_command, summary_lines

log = logging.getLogger("gpuprof.shim")

#: The most seconds the end of a run waits for the post (connect, send,
#: and the answer together).
TIMEOUT_S = 5.0
#: The body formats ``webhook_format`` takes.
FORMATS = ("slack", "json")
#: Slack's limits: blocks per message, characters of a header and of a section.
SLACK_MAX_BLOCKS = 50
SLACK_HEADER_CHARS = 150
SLACK_SECTION_CHARS = 3000
_SEVERITY = {"HIGH": ":red_circle: *HIGH*", "MED": ":large_orange_circle: *MED*"}


def check(url: str | None, fmt: str) -> None:
    """Validate ``webhook`` and ``webhook_format`` before the run starts.

    Raises:
        ValueError: *url* is not an ``http://`` or ``https://`` URL with a
            host, or *fmt* is not one of :data:`FORMATS`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"gpuprof: webhook_format must be 'slack' or 'json', got {fmt!r}")
    if url is None:
        return
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("gpuprof: webhook must be an http:// or https:// URL with a host")


def where(url: str) -> str:
    """*url* without its path and query, which may hold a secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _mrkdwn(text: str) -> str:
    """*text* escaped for Slack's mrkdwn (``&``, ``<``, ``>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Slack's incoming-webhook message for *summary*: ``text`` (the
    header line and the findings' count: what a notification shows) and
    ``blocks`` (header, one section per finding, the report command)."""
    lines = summary_lines(summary)
    head = lines[0].strip() if lines else f"gpuprof · {summary.get('run_name')}"
    insights = list(ranked(summary.get("insights") or []))
    n = len(insights)
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": head[:SLACK_HEADER_CHARS], "emoji": False},
        }
    ]
    room = SLACK_MAX_BLOCKS - 4  # header, the top fix's worth, "and N more", the command
    for ins in insights[:room]:
        severity = str(ins.get("severity") or "")
        text = f"{_SEVERITY.get(severity, f'*{severity}*')}  {_mrkdwn(str(ins.get('title')))}"
        worth = gain_line(ins)
        if worth:
            text += f"\n_{_mrkdwn(worth[0].strip())}_"
        if ins.get("fix"):
            text += f"\n_Fix:_ {_mrkdwn(str(ins['fix']))}"
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": text[:SLACK_SECTION_CHARS]}}
        )
    if n > room:
        more = f"… and {n - room} more findings"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": more}]})
    if not insights:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "No findings."}})
    command = report_command(summary)
    if command:
        text = f"{FULL_REPORT.strip()} `{_mrkdwn(command)}`"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": text}]})
    findings = f"{n} finding{'' if n == 1 else 's'}"
    top = gain_headline(summary)
    if top:  # what a notification shows: the top fix's worth too
        findings += "; " + top.strip()[0].lower() + top.strip()[1:]
        blocks.insert(
            1, {"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(top.strip())}}
        )
    return {"text": f"{head}: {findings}", "blocks": blocks[:SLACK_MAX_BLOCKS]}


def json_body(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The generic body: the summary dict and its text block."""
    return {
        "event": "gpuprof.run_end",
        "summary": dict(summary),
        "text": "\n".join(summary_lines(summary)),
    }


def body_for(summary: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """:func:`slack_body` or :func:`json_body` of *summary*, per *fmt*."""
    return slack_body(summary) if fmt == "slack" else json_body(summary)


def post(url: str, body: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> str | None:
    """POST *body* as JSON to *url*; None on a 2xx answer, else why not
    (one line, without the URL's path). Never raises."""
    import urllib.error  # here: urllib.request costs the shim's import ~10 ms
    import urllib.request

    try:
        data = orjson.dumps(body, default=str)
        request = urllib.request.Request(
            url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "gpuprof"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310
            answer.read(1024)
        return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} {clean_text(str(exc.reason), 80)}"
    except TimeoutError:
        return no_answer(timeout_s)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return no_answer(timeout_s)
        return clean_text(str(exc.reason), 200)
    except Exception as exc:
        return clean_text(f"{type(exc).__name__}: {exc}", 200)


def no_answer(timeout_s: float) -> str:
    return f"no answer within {timeout_s:g} s"


def send(url: str, fmt: str, summary: Mapping[str, Any], timeout_s: float | None = None) -> bool:
    """Post *summary* (:func:`body_for`) to *url* from a background thread,
    waiting at most *timeout_s* (default :data:`TIMEOUT_S`); True if it was
    answered with a 2xx. A failure is one logged warning. Never raises."""
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    result: list[str | None] = []
    try:
        body = body_for(summary, fmt)
        thread = threading.Thread(
            target=lambda: result.append(post(url, body, timeout_s)),
            name="gpuprof-webhook",
            daemon=True,
        )
        thread.start()
        thread.join(timeout_s)
    except Exception as exc:
        result = [clean_text(f"{type(exc).__name__}: {exc}", 200)]
    if not result:
        why = no_answer(timeout_s)
    elif result[0] is None:
        return True
    else:
        why = result[0]
    log.warning("gpuprof: webhook to %s failed: %s", where(url), why)
    return False
