"""The daemon's two ZeroMQ sockets, data (``PULL``) and control (``ROUTER``),
and their files in the socket directory.

The caller holds the directory's single-instance lock, so files already
there are a dead daemon's: :meth:`DaemonSockets.bind` unlinks them first.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import zmq
import zmq.asyncio

from gpuprof import config

#: Data messages queued in the ``PULL`` socket before ZeroMQ pushes back on
#: the shims (which then drop and count rather than wait).
INGEST_RCVHWM = 100_000


class DaemonSockets:
    """Owns the ZeroMQ context, the two sockets and their files under *socket_dir*."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.files = [
            socket_dir / config.INGEST_SOCKET_NAME,
            socket_dir / config.CONTROL_SOCKET_NAME,
        ]
        self._zmq = zmq.asyncio.Context()
        self._sockets: list[zmq.asyncio.Socket] = []

    def bind(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        """Unlink stale files, bind both sockets; returns ``(pull, router)``."""
        self._unlink()
        pull = self._zmq.socket(zmq.PULL)
        router = self._zmq.socket(zmq.ROUTER)
        self._sockets = [pull, router]
        for s in self._sockets:
            s.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.RCVHWM, INGEST_RCVHWM)
        pull.bind(config.ingest_endpoint(self.socket_dir))
        router.bind(config.control_endpoint(self.socket_dir))
        return pull, router

    def close(self) -> None:
        """Close the sockets and the context; remove the files once bound (a
        start that failed before binding leaves the directory as it was)."""
        bound = bool(self._sockets)
        for s in self._sockets:
            s.close(linger=0)
        self._sockets = []
        self._zmq.term()
        if bound:
            self._unlink()

    def _unlink(self) -> None:
        for path in self.files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
