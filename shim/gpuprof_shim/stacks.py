"""Where the training thread spends the time between its phases.

A background thread reads the training thread's Python stack
(``sys._current_frames()``) about every 10 ms, only while a gate says the
thread is outside forward, backward and the optimizer, and counts each
sample under the nearest user frame: frames of gpuprof, torch and the
standard library fold into the user code that called them, so a sample
inside ``torch.save`` counts as ``train.py:212 save_checkpoint`` with
``torch.save`` as the call it was in. Only file paths, line numbers and
function names are kept (no locals, no arguments); distinct keys are
bounded per run and the excess counted as dropped.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from types import FrameType
from typing import NamedTuple

#: ~100 Hz (the issue's figure): 10 ms resolution on a 40 ms pause, and one
#: read of one thread's frame chain per 10 ms keeps the cost far under 1 %.
INTERVAL_S = 0.01
#: Distinct (file, line, function, call, step) keys kept per run: at ~100
#: bytes a key, ≤ 0.5 MB; samples beyond it are counted in ``dropped``.
MAX_KEYS = 4096


def _library_roots() -> tuple[str, ...]:
    """Directories whose frames fold away: the standard library, gpuprof's
    own packages and torch (by where they are installed)."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    here = os.path.dirname(os.path.abspath(__file__))
    roots.add(here)
    roots.add(os.path.join(os.path.dirname(here), "gpuprof"))
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        roots.add(os.path.dirname(os.path.abspath(torch.__file__)))
    gp = sys.modules.get("gpuprof")
    if gp is not None and getattr(gp, "__file__", None):
        roots.add(os.path.dirname(os.path.abspath(gp.__file__)))
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots))


class FrameKey(NamedTuple):
    """One aggregated sample site."""

    file: str
    line: int
    function: str
    call: str
    """The library call the user frame was in (``torch.serialization.save``),
    or ``""`` when the sample was in the user frame itself."""
    step: int


def _qualname(frame: FrameType) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    mod = frame.f_globals.get("__name__", "")
    return f"{mod}.{name}" if mod else name


def fold(frame: FrameType | None, roots: tuple[str, ...]) -> tuple[str, int, str, str] | None:
    """(file, line, function, call) of the innermost frame not under *roots*,
    with *call* the outermost library function it had called; None when every
    frame is a library's (e.g. a sample while gpuprof itself runs)."""
    callee = ""
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(roots) and not path.startswith("<frozen"):
            return path, frame.f_lineno, frame.f_code.co_name, callee
        callee = _qualname(frame)
        frame = frame.f_back
    return None


class StackSampler:
    """Sample one thread's stack while *gate()* is true; counts per
    :class:`FrameKey`. *step()* gives the step number each sample falls in.
    The sampler never touches the sampled thread: it reads its frames from
    its own daemon thread and holds no lock the training thread takes."""

    def __init__(
        self,
        thread_id: int,
        gate: Callable[[], bool],
        step: Callable[[], int],
        interval_s: float = INTERVAL_S,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self._tid = thread_id
        self._gate = gate
        self._step = step
        self._interval = interval_s
        self._max = max_keys
        self._roots = _library_roots()
        self.counts: dict[FrameKey, int] = {}
        self.samples = 0
        """Samples taken (gate open), folded or not."""
        self.dropped = 0
        """Samples not counted: a new key past *max_keys*."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        """Take one sample now if the gate is open (the thread's own loop body)."""
        if not self._gate():
            return
        frame = sys._current_frames().get(self._tid)
        if frame is None:
            return
        self.samples += 1
        site = fold(frame, self._roots)
        del frame
        if site is None:
            return
        key = FrameKey(*site, self._step())
        if key in self.counts:
            self.counts[key] += 1
        elif len(self.counts) < self._max:
            self.counts[key] = 1
        else:
            self.dropped += 1

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sample_once()
            except Exception:  # never let profiling take anything down
                self.dropped += 1

    def start(self) -> None:
        """Start the sampler thread (a daemon thread: it never holds exit)."""
        self._thread = threading.Thread(target=self._run, name="gpuprof-stacks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the sampler thread (at most one interval)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def top_sites(
    counts: dict[FrameKey, int], n: int = 3
) -> list[tuple[tuple[str, int, str, str], float]]:
    """The *n* sites (file, line, function, call) with the largest share
    (0-1) of all counted samples, steps merged; largest first."""
    merged: dict[tuple[str, int, str, str], int] = {}
    for k, c in counts.items():
        site = (k.file, k.line, k.function, k.call)
        merged[site] = merged.get(site, 0) + c
    total = sum(merged.values())
    if not total:
        return []
    ranked = sorted(merged.items(), key=lambda kv: -kv[1])[:n]
    return [(site, c / total) for site, c in ranked]
