"""A real pseudo-terminal for gpuprofctl's live views: pexpect runs the
command on a pty of a given size, pyte plays what it writes onto a screen,
and tests wait for what the screen shows (a handshake, never a sleep)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import pexpect
import pyte


class Terminal:
    """``gpuprofctl ARGS`` on a *rows* × *cols* pty; killed by :meth:`close`."""

    def __init__(self, *args: str, rows: int = 24, cols: int = 80) -> None:
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        self.child = pexpect.spawn(
            sys.executable, ["-m", "gpuprofd.ctl", *args], dimensions=(rows, cols), env=env
        )

    def _read(self, timeout_s: float) -> bool:
        """Feed what came within *timeout_s* to the screen; False at EOF."""
        try:
            data = self.child.read_nonblocking(65536, timeout=timeout_s)
        except pexpect.TIMEOUT:
            return True
        except pexpect.EOF:
            return False
        self.raw += data
        self.stream.feed(data)
        return True

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def wait_for(self, check: Callable[[str], bool], timeout_s: float, what: str) -> str:
        """The screen's text once *check* holds of it.

        Raises:
            AssertionError: not within *timeout_s*, or the command ended first
                (saying *what* was awaited and showing the screen).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check(self.text()):
                return self.text()
            if not self._read(0.2):
                break
        raise AssertionError(
            f"no {what} on the screen:\n{self.text()}\n(raw tail {self.raw[-400:]!r})"
        )

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def wait_exit(self, timeout_s: float) -> int:
        """The command's exit status once it ended (its output read to the end)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._read(0.2):
            pass
        if self.child.isalive() and not self._exited(deadline):
            self.close()
            raise AssertionError(f"still running after {timeout_s} s:\n{self.text()}")
        self.child.close()
        assert self.child.exitstatus is not None, self.child.signalstatus
        return self.child.exitstatus

    def _exited(self, deadline: float) -> bool:
        """Whether the child exits by *deadline* (its output all read)."""
        while time.monotonic() < deadline:
            if not self.child.isalive():
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
