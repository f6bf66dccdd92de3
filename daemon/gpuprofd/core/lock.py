"""The single-instance lock: one gpuprofd per socket directory.

Two shims racing to auto-start a daemon must end with exactly one: each new
daemon takes an exclusive, non-blocking ``flock`` on ``DIR/gpuprofd.lock``
before touching the sockets; the loser exits quietly. The lock file is never
unlinked (unlinking would let a third process lock a fresh inode while a
second still holds the old one).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class InstanceLock:
    """An exclusive ``flock`` held for the daemon's lifetime."""

    def __init__(self, path: Path, write_pid: bool = True) -> None:
        """*write_pid* False locks a file whose contents must stay untouched
        (the database itself: ``flock`` and SQLite's ``fcntl`` locks are
        independent on Linux)."""
        self.path = path
        self.write_pid = write_pid
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False if another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if self.write_pid:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def reacquire(self) -> bool:
        """Lock the file now at :attr:`path` (the old one was deleted or
        replaced) and let go of the old one; False (the old lock kept) if
        another process holds the new file."""
        old = self._fd
        self._fd = None
        if not self.acquire():
            self._fd = old
            return False
        if old is not None:
            os.close(old)  # closing drops the old file's flock
        return True

    def holder_pid(self) -> int | None:
        """The pid written by the current holder, if readable."""
        try:
            return int(self.path.read_text().strip() or "0") or None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
