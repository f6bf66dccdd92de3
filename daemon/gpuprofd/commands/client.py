"""A blocking control-socket client (``REQ`` with a timeout) for gpuprofctl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import zmq

from gpuprof import config
from gpuprof.protocol import PROTOCOL_VERSION
from gpuprofd.core.errors import BadInputError, NoDaemonError


def request(socket_dir: Path, msg: dict[str, Any], timeout_s: float = 1.0) -> dict[str, Any]:
    """Send one control message and return the reply.

    Raises:
        NoDaemonError: no socket file, or no reply within *timeout_s*.
        BadInputError: *socket_dir* is too long for a Unix socket path.
    """
    if not (socket_dir / config.CONTROL_SOCKET_NAME).exists():
        raise NoDaemonError(f"no gpuprofd answering on {socket_dir}")
    try:
        endpoint = config.control_endpoint(socket_dir)
    except ValueError as exc:
        raise BadInputError(str(exc)) from None
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(orjson.dumps({"v": PROTOCOL_VERSION, **msg}))
        if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            raise NoDaemonError(f"no gpuprofd answering on {socket_dir}")
        return orjson.loads(sock.recv())
    finally:
        sock.close(linger=0)
        ctx.term()


def ping(socket_dir: Path, timeout_s: float = 1.0) -> dict[str, Any]:
    return request(socket_dir, {"type": "ping"}, timeout_s)
