"""The data channel: a ZeroMQ ``PUSH`` to gpuprofd's ingest socket that never
blocks and never raises.

Sends use ``NOBLOCK`` under a bounded high-water mark with ``IMMEDIATE``
(nothing queues for a peer that is not connected), so a dead or slow daemon
costs a counted drop, not a stall. State is per process: a ZeroMQ context
must not cross ``fork()`` (DataLoader workers fork), so a sender that finds
itself in another process than the one that built it forgets the parent's
sockets without touching them, and from then on only counts drops.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any

import zmq

from gpuprof.protocol import (
    MAX_BATCH_EVENTS,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    batch,
    encode,
)
from gpuprof_shim.resend import Entry, ResendBuffer

log = logging.getLogger("gpuprof.shim")

#: Messages queued per peer before sends start dropping (~250 B each: ~1 MiB).
DEFAULT_SNDHWM = 4096
#: Backlog messages the resend thread hands over per hold of the lock.
DRAIN_SLICE = 256

_live_senders: weakref.WeakSet[Sender] = weakref.WeakSet()
#: In a fork child: the parent's per-process states, kept referenced forever
#: so their ZeroMQ socket and context are never garbage-collected here (their
#: ``__del__`` would warn "Unclosed socket" and try to close them in the child).
_parent_states: list[_ProcState] = []
_fork_hook_lock = threading.Lock()
_fork_hook_registered = False


class _ProcState:
    """One process's view of the sender: its context, socket and counters."""

    __slots__ = ("pid", "forked", "ctx", "sock", "sent", "dropped")

    def __init__(self, pid: int, forked: bool) -> None:
        self.pid = pid
        self.forked = forked
        self.ctx: zmq.Context[Any] | None = None
        self.sock: zmq.Socket[Any] | None = None
        self.sent = 0
        self.dropped = 0


def _current_pid() -> int:
    return os.getpid()  # looked up per call, so tests can simulate a fork


def _after_fork_in_child() -> None:
    for sender in list(_live_senders):
        sender._forget_parent()


def _register_fork_hook() -> None:
    global _fork_hook_registered
    with _fork_hook_lock:
        if not _fork_hook_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_registered = True


class Sender:
    """Pushes encoded messages to ``endpoint``; see the module docstring.

    Args:
        endpoint: the ingest ``ipc://`` address (``gpuprof.config.ingest_endpoint``).
        sndhwm: bound of the send queue, in messages.
        getpid: injected for tests that simulate a fork (default ``os.getpid``).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        sndhwm: int = DEFAULT_SNDHWM,
        getpid: Callable[[], int] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._sndhwm = sndhwm
        self._getpid = getpid or _current_pid
        self._lock = threading.Lock()
        self._state = _ProcState(self._getpid(), forked=False)
        self._closed = False
        #: The unacknowledged messages (:meth:`keep_unacked`); None: sends are
        #: fire-and-forget (a daemon that does not number them).
        self.buffer: ResendBuffer | None = None
        #: Set when a message waits in the buffer's backlog for the resend thread.
        self.wakeup = threading.Event()
        _live_senders.add(self)
        _register_fork_hook()

    @property
    def sent(self) -> int:
        """Events handed to ZeroMQ by this process (a batch counts its events)."""
        return self._current().sent

    @property
    def dropped(self) -> int:
        """Events this process could not send (daemon absent, queue full, fork
        child, the resend buffer overflowed before they went); a batch that
        could not go counts each of its events."""
        return self._current().dropped + self.overflow_dropped()

    @property
    def context(self) -> zmq.Context[Any] | None:
        """This process's ZeroMQ context (created by :meth:`connect`), or None."""
        st = self._current()
        return None if st.forked else st.ctx

    def _current(self) -> _ProcState:
        st = self._state
        if st.pid != self._getpid():
            self._forget_parent()
            st = self._state
        return st

    def _forget_parent(self) -> None:
        """Set aside (never close, never use) state built by another process."""
        _parent_states.append(self._state)
        self._state = _ProcState(self._getpid(), forked=True)
        self._lock = threading.Lock()

    def keep_unacked(self, buffer: ResendBuffer) -> None:
        """From now on number every message and keep it in *buffer* until
        acknowledged (:mod:`gpuprof_shim.resend`)."""
        with self._lock:
            self.buffer = buffer

    def _numbered(self, st: _ProcState) -> ResendBuffer | None:
        return None if st.forked else self.buffer

    def _keep_and_send(self, st: _ProcState, buf: ResendBuffer, data: bytes, n: int) -> int:
        """Under the lock: keep *data* (n events) and hand it over unless a
        backlog waits (order first: the resend thread sends it then)."""
        entry = buf.add(data, n)
        if not buf.backlog and self._hand_over(st, buf, entry):
            return n
        buf.backlog = True
        self.wakeup.set()
        return n

    def _hand_over(self, st: _ProcState, buf: ResendBuffer, entry: Entry) -> bool:
        try:
            st.sock.send(buf.current(entry), zmq.NOBLOCK)  # type: ignore[union-attr]
        except Exception:
            return False
        buf.mark_sent(entry)
        if not entry.counted:
            entry.counted = True
            st.sent += entry.events
        return True

    def drain(self) -> bool:
        """Hand the backlog to ZeroMQ in order, without blocking (the resend
        thread's job). True when nothing waits any more (the backlog is over)."""
        st = self._current()
        while True:
            # a slice at a time: the training thread's next send waits for the
            # lock at most one slice (~256 sends of a few µs), never the backlog
            with self._lock:
                buf = self._numbered(st)
                if buf is None or self._closed or st.sock is None:
                    return buf is None
                for entry in list(islice(buf.pending(), DRAIN_SLICE)):
                    if not self._hand_over(st, buf, entry):
                        return False
                if not buf.unsent:
                    buf.backlog = False
                    return True

    def resend_all(self) -> None:
        """A new daemon: send everything not acknowledged again, in order."""
        with self._lock:
            if self.buffer is not None:
                self.buffer.resend_all()

    def ack(self, upto: int) -> None:
        """The daemon stored every message up to seq *upto*."""
        with self._lock:
            if self.buffer is not None:
                self.buffer.ack(upto)

    def overflow_dropped(self) -> int:
        """Events that were never sent because the resend buffer overflowed."""
        buf = self.buffer
        return buf.overflowed_unsent if buf is not None else 0

    def poll_out(self, timeout_ms: int) -> bool:
        """Wait (off the training thread) up to *timeout_ms* for room to send."""
        return self.wait_connected(timeout_ms)

    def connect(self) -> bool:
        """Create the context and connect the socket now (idempotent).

        Returns False, never raises, if that fails, the sender is closed or
        this is a fork child.
        """
        st = self._current()
        if st.forked or self._closed:
            return False
        if st.sock is not None:
            return True
        try:
            st.ctx = zmq.Context()
            sock = st.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, self._sndhwm)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            st.sock = sock
        except Exception as exc:
            log.warning("gpuprof: cannot open %s: %s", self.endpoint, exc)
            self._close_state(st)
            return False
        return True

    def wait_connected(self, timeout_ms: int) -> bool:
        """Wait up to *timeout_ms* for the data connection to be up.

        With ``IMMEDIATE`` a send before the connection completes is dropped;
        a daemon that just answered ``hello`` may still be seconds-old (auto
        started) and ZeroMQ reconnects only every ~100 ms. A ``PUSH`` socket
        with ``IMMEDIATE`` is writable only once a peer is connected.
        Returns False on timeout or any error; never raises.
        """
        st = self._current()
        if st.forked or st.sock is None:
            return False
        try:
            return bool(st.sock.poll(timeout_ms, zmq.POLLOUT))
        except Exception:
            return False

    def send(self, msg: Mapping[str, Any]) -> bool:
        """Encode and push *msg* without blocking; True if ZeroMQ took it.

        Any failure (no peer, full queue, closed sender, un-encodable, fork child)
        counts one drop and returns False.
        """
        st = self._current()
        with self._lock:
            if self._closed or st.forked or (st.sock is None and not self.connect()):
                st.dropped += 1
                return False
            buf = self._numbered(st)
            if buf is not None and msg.get("run_key"):
                event = {k: v for k, v in msg.items() if k not in ("v", "run_key")}
                try:
                    data = encode(batch(msg["run_key"], [event], buf.next_seq, buf.lost))
                except Exception:
                    st.dropped += 1
                    return False
                if len(data) <= MAX_MESSAGE_BYTES:
                    self._keep_and_send(st, buf, data, 1)
                    return True
            try:
                st.sock.send(encode(msg), zmq.NOBLOCK)  # type: ignore[union-attr]
            except Exception:
                st.dropped += 1
                return False
            st.sent += 1
            return True

    def send_batch(self, run_key: str, events: list[dict[str, Any]]) -> int:
        """Push *events* (data events of run *run_key*, without ``v`` and
        ``run_key``) in as few ``batch`` messages as the protocol's bounds
        allow (:data:`~gpuprof.protocol.MAX_BATCH_EVENTS` events,
        :data:`~gpuprof.protocol.MAX_MESSAGE_BYTES` bytes), without blocking.

        Returns how many events ZeroMQ took; ``sent`` and ``dropped`` count
        events, not messages. Never raises.
        """
        taken = 0
        for k in range(0, len(events), MAX_BATCH_EVENTS):
            taken += self._send_chunk(run_key, events[k : k + MAX_BATCH_EVENTS])
        return taken

    def _send_chunk(self, run_key: str, events: list[dict[str, Any]]) -> int:
        st = self._current()
        n = len(events)
        with self._lock:
            if self._closed or st.forked or (st.sock is None and not self.connect()):
                st.dropped += n
                return 0
            buf = self._numbered(st)
            try:
                if buf is not None:
                    data = encode(batch(run_key, events, buf.next_seq, buf.lost))
                else:
                    one = (
                        {"v": PROTOCOL_VERSION, "run_key": run_key, **events[0]} if n == 1 else None
                    )
                    data = encode(one if one is not None else batch(run_key, events))
            except Exception:
                st.dropped += n
                return 0
            if len(data) <= MAX_MESSAGE_BYTES and buf is not None:
                return self._keep_and_send(st, buf, data, n)
            if len(data) <= MAX_MESSAGE_BYTES:
                try:
                    st.sock.send(data, zmq.NOBLOCK)  # type: ignore[union-attr]
                except Exception:
                    st.dropped += n
                    return 0
                st.sent += n
                return n
            if n == 1:  # one event over the bound: the daemon would drop it anyway
                st.dropped += 1
                return 0
        # too many bytes (steps with many comm rows): halves, each within bounds
        half = n // 2
        return self._send_chunk(run_key, events[:half]) + self._send_chunk(run_key, events[half:])

    def close(self) -> None:
        """Close the socket and context if this process made them (LINGER 0:
        unsent messages are discarded, not waited for)."""
        st = self._current()
        self._closed = True
        if not st.forked:
            with self._lock:
                self._close_state(st)

    @staticmethod
    def _close_state(st: _ProcState) -> None:
        sock, ctx, st.sock, st.ctx = st.sock, st.ctx, None, None
        try:
            if sock is not None:
                sock.close(linger=0)
            if ctx is not None:
                ctx.term()
        except Exception:
            log.debug("gpuprof: error closing the data socket", exc_info=True)
