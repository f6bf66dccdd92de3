"""The control channel: one ``REQ`` request per call to gpuprofd's control
socket, always under a timeout, on a fresh socket closed afterwards.

A request returns the daemon's reply as a dict, or None when there was no
(valid) reply in time. It never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
import zmq

from gpuprof.protocol import encode

log = logging.getLogger("gpuprof.shim")

#: How long a request may wait for the connection to the daemon, ms.
SEND_TIMEOUT_MS = 300
#: ``bye`` goes to a daemon known to be alive and is sent once: allow a
#: loaded machine more time to connect before giving up the summary, ms.
BYE_SEND_TIMEOUT_MS = 1000
#: Reply timeouts, ms. ``bye`` waits longer: the daemon answers only once it
#: has ingested every event the shim says it sent.
HELLO_TIMEOUT_MS = 500
#: ``ack`` (what the daemon stored): asked every 0.25 s by the resend thread.
ACK_TIMEOUT_MS = 500
BYE_TIMEOUT_MS = 5000


def request(
    ctx: zmq.Context[Any] | None,
    endpoint: str,
    msg: Mapping[str, Any],
    recv_timeout_ms: int,
    send_timeout_ms: int = SEND_TIMEOUT_MS,
) -> dict[str, Any] | None:
    """Send *msg* and wait for one JSON-object reply.

    Args:
        ctx: a context to make the socket in; None makes (and terms) a private one.
        endpoint: the control ``ipc://`` address.
        msg: the request (``hello``/``bye``/``ping``), encoded with orjson.
        recv_timeout_ms: how long to wait for the reply.
        send_timeout_ms: how long to wait for a connected peer.

    Returns:
        The decoded reply object, or None on timeout or anything malformed.
    """
    own = ctx is None
    try:
        context = zmq.Context() if own else ctx
    except Exception:
        return None
    sock = None
    try:
        sock = context.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
        sock.setsockopt(zmq.RCVTIMEO, recv_timeout_ms)
        sock.connect(endpoint)
        sock.send(encode(msg))
        raw = sock.recv()
        reply = orjson.loads(raw)
    except (zmq.ZMQError, orjson.JSONDecodeError) as exc:
        log.debug("gpuprof: %s request to %s: %s", msg.get("type"), endpoint, exc)
        return None
    except Exception:
        log.debug("gpuprof: %s request failed", msg.get("type"), exc_info=True)
        return None
    finally:
        try:
            if sock is not None:
                sock.close(linger=0)
            if own:
                context.term()
        except Exception:
            log.debug("gpuprof: error closing a control socket", exc_info=True)
    return reply if isinstance(reply, dict) else None


def parse_hello_reply(reply: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A usable hello reply: ``{"ok": True, "run_id": int, "db": str, ...}``
    or ``{"ok": False, "error": str}``; None for anything else."""
    if not reply or type(reply.get("ok")) is not bool:
        return None
    if reply["ok"]:
        if type(reply.get("run_id")) is not int or not isinstance(reply.get("db"), str):
            return None
        notes = reply.get("notes")
        clean = dict(reply)
        clean["notes"] = [n for n in notes if isinstance(n, str)] if isinstance(notes, list) else []
        return clean
    return {"ok": False, "error": str(reply.get("error") or "refused")}


def parse_bye_reply(reply: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The summary dict from a ``{"ok": True, "summary": {...}}`` bye reply, else None."""
    if not reply or reply.get("ok") is not True:
        return None
    summary = reply.get("summary")
    if not isinstance(summary, dict) or not isinstance(summary.get("run_name"), str):
        return None
    return summary


def parse_ack_reply(reply: Mapping[str, Any] | None) -> int | bool | None:
    """The highest stored seq from an ``{"ok": True, "acked": int}`` reply;
    False if the daemon answered but does not know the run (a new daemon:
    say hello again); None for no (valid) reply."""
    if not reply or type(reply.get("ok")) is not bool:
        return None
    if not reply["ok"]:
        return False
    acked = reply.get("acked")
    return acked if type(acked) is int and acked >= 0 else None
