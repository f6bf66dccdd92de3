"""A competing CPU load the tests start and stop themselves: busy processes."""

from __future__ import annotations

import os
import subprocess
import sys

#: The busy loop each hog process runs (pure Python: one core each, no I/O);
#: it ends when its parent (the test run) is gone, killed or not.
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"


class Hog:
    """*procs* busy processes (default: one per core) while started.

    A context manager too: ``with Hog(): ...``. Every process it started is
    killed and reaped by :meth:`stop`, also when the block raises.
    """

    def __init__(self, procs: int | None = None) -> None:
        self.procs = procs if procs is not None else (os.cpu_count() or 1)
        self._running: list[subprocess.Popen[bytes]] = []

    def start(self) -> Hog:
        for _ in range(self.procs):
            self._running.append(
                subprocess.Popen(
                    [sys.executable, "-c", SPIN],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        return self

    def stop(self) -> None:
        for proc in self._running:
            proc.kill()
        for proc in self._running:
            proc.wait(10)
        self._running.clear()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._running]

    def __enter__(self) -> Hog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
