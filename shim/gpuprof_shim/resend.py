"""What gpuprofd has not acknowledged yet: the shim's bounded resend buffer.

Every data message the shim sends to a daemon that numbers them gets the
next sequence number (``batch``'s ``seq``) and stays here, encoded, until
the daemon says it has stored it (``ack``): a daemon that dies (``kill -9``,
OOM) loses only what the new one is sent again. The buffer holds at most
:data:`RESEND_BUFFER_BYTES`; past that the oldest messages are given up,
counted in :attr:`ResendBuffer.overflowed` (the summary's dropped events)
and announced to the daemon with ``lost`` so it does not wait for them.

Messages go to ZeroMQ in sequence order: once one could not be handed over
(no daemon, full queue) the buffer is in *backlog* and later ones wait here
for the resend thread (:class:`gpuprof_shim.link.DaemonLink`), never the
training thread, to send them in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import islice

import orjson

#: Bound on the unacknowledged bytes kept, bytes: 16 MiB hold ~64,000 steps
#: (a step is ~250 bytes encoded), over a minute of a fast loop without a
#: daemon, and stay small next to a training process.
RESEND_BUFFER_BYTES = 16 << 20


class Entry:
    """One numbered message: its ``seq``, event count and encoded bytes."""

    __slots__ = ("seq", "events", "data", "lost", "sent", "counted")

    def __init__(self, seq: int, events: int, data: bytes, lost: int) -> None:
        self.seq = seq
        self.events = events
        self.data = data
        self.lost = lost  # the ``lost`` encoded in data
        self.sent = False  # handed to ZeroMQ since the last (re)connect
        self.counted = False  # counted in the sender's ``sent`` (once, ever)


class ResendBuffer:
    """The unacknowledged messages of one process, oldest first (not
    thread-safe: the :class:`~gpuprof_shim.sender.Sender`'s lock guards it).

    Args:
        max_bytes: bound on the encoded bytes kept (default :data:`RESEND_BUFFER_BYTES`).
    """

    def __init__(self, max_bytes: int = RESEND_BUFFER_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: deque[Entry] = deque()
        self._bytes = 0
        self._unsent = 0  # the last ``_unsent`` entries are not handed over
        #: The next message's sequence number (the first is 1).
        self.next_seq = 1
        #: The highest seq the daemon acknowledged as stored.
        self.acked = 0
        #: The highest seq given up (overflow): the daemon must not wait for it.
        self.lost = 0
        #: Events given up because the buffer was full.
        self.overflowed = 0
        #: Of those, events never handed to ZeroMQ at all.
        self.overflowed_unsent = 0
        #: New messages wait here for the resend thread (keeps them in order).
        self.backlog = False

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Encoded bytes kept, bytes."""
        return self._bytes

    @property
    def unsent(self) -> int:
        """Messages kept that are not handed to ZeroMQ yet."""
        return self._unsent

    def add(self, data: bytes, events: int) -> Entry:
        """Keep *data* (a message of *events* events numbered :attr:`next_seq`),
        giving up the oldest messages past :attr:`max_bytes`."""
        entry = Entry(self.next_seq, events, data, self.lost)
        self.next_seq += 1
        self._entries.append(entry)
        self._bytes += len(data)
        self._unsent += 1
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            old = self._entries.popleft()
            self._bytes -= len(old.data)
            self.overflowed += old.events
            if not old.sent:
                self._unsent -= 1
            if not old.counted:
                self.overflowed_unsent += old.events
            self.lost = old.seq
        return entry

    def current(self, entry: Entry) -> bytes:
        """*entry*'s bytes with today's ``lost``: messages given up after it was
        encoded must not keep the daemon waiting for them (re-encoded only
        then: an overflow is rare)."""
        if entry.lost < self.lost:
            msg = orjson.loads(entry.data)
            msg["lost"] = self.lost
            data = orjson.dumps(msg)
            self._bytes += len(data) - len(entry.data)
            entry.data, entry.lost = data, self.lost
        return entry.data

    def mark_sent(self, entry: Entry) -> None:
        """*entry*, the oldest unsent, went to ZeroMQ."""
        entry.sent = True
        self._unsent -= 1

    def pending(self) -> Iterator[Entry]:
        """The messages not handed over, oldest first (a snapshot's view: do
        not add or ack while iterating)."""
        return islice(self._entries, len(self._entries) - self._unsent, None)

    def ack(self, upto: int) -> int:
        """The daemon stored every message up to seq *upto*: free them.
        Returns how many were freed."""
        freed = 0
        if upto > self.acked:
            self.acked = upto
        while self._entries and self._entries[0].seq <= upto:
            old = self._entries.popleft()
            self._bytes -= len(old.data)
            if not old.sent:
                self._unsent -= 1
            freed += 1
        return freed

    def resend_all(self) -> None:
        """A new daemon: everything kept goes again, in order, from the oldest."""
        for e in self._entries:
            e.sent = False
        self._unsent = len(self._entries)
        self.backlog = bool(self._entries) or self.backlog
