"""Where the training thread spends the time between its phases.

A background thread reads the training thread's Python stack
(``sys._current_frames()``) about every 10 ms, only while a gate says the
thread is outside forward, backward and the optimizer, and counts each
sample under the nearest user frame: frames of gpuprof, torch, the
standard library and installed packages fold into the user code that
called them, so a sample inside ``torch.save`` counts as ``train.py:212
save_checkpoint`` with ``torch.save`` as the call it was in (a C function,
which has no frame, is named from the calling line's bytecode:
``time.sleep``). Only file paths, line numbers and function names are kept
(no locals, no arguments); keys are bounded per run (then a frame's steps
are merged) and the excess counted as dropped.
"""

from __future__ import annotations

import dis
import logging
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Collection
from types import CodeType, FrameType
from typing import NamedTuple

from gpuprof.protocol import MAX_STACK_COUNT, MAX_STACK_NAME_CHARS, MAX_STACK_PATH_CHARS
from gpuprof.text import clean_text

log = logging.getLogger("gpuprof.shim")

#: ~100 Hz (the issue's figure): 10 ms resolution on a 40 ms pause, and one
#: read of one thread's frame chain per 10 ms keeps the cost far under 1 %.
INTERVAL_S = 0.01
#: Distinct (file, line, function, call, step) keys kept per run: at ~100
#: bytes a key, ≤ 0.5 MB; samples beyond it are counted in ``dropped``.
MAX_KEYS = 4096
#: The step a sample counts in once the run's keys are spent: its frame's
#: samples with the steps merged (a long run's steady gap still shows), for
#: up to a quarter of the key bound more frames (1024 by default).
OVERFLOW_STEP = 1 << 40
#: Counts go to gpuprofd this often (s) and at the end: one small event a few
#: seconds keeps live findings current at no cost worth measuring.
SEND_EVERY_S = 5.0


def _own_roots() -> tuple[str, ...]:
    """gpuprof's own packages: a sample whose innermost frame is here is
    gpuprof's own time (sending a burst of steps), counted in no frame."""
    here = os.path.dirname(os.path.abspath(__file__))
    return (here + os.sep, os.path.join(os.path.dirname(here), "gpuprof") + os.sep)


def _library_roots() -> tuple[str, ...]:
    """Directories whose frames fold away: the standard library, installed
    packages, gpuprof's own packages and torch (by where they are installed)."""
    # the standard library and installed packages (PIL, numpy, transformers):
    # their time counts at the user's line that called them
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
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
    """The function's public name where its package exports it at the top
    (``torch.save`` rather than ``torch.serialization.save``), else its
    module-qualified name."""
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    mod = frame.f_globals.get("__name__", "")
    if not mod:
        return name
    top = mod.partition(".")[0]
    if top != mod and name == code.co_name:
        exported = getattr(sys.modules.get(top), name, None)
        if getattr(exported, "__code__", None) is code:
            return f"{top}.{name}"
    return f"{mod}.{name}"


_LOADS = frozenset(
    {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF", "LOAD_ATTR", "LOAD_METHOD"}
)


def _call_names(code: CodeType) -> dict[int, str]:
    """For each call instruction of *code* whose callable is a plain dotted
    name (``time.sleep``, ``os.fsync``, ``f.read``): its offset and that
    name, read from the bytecode and its source positions (the loads that
    start where the call's expression starts). Names from the code only."""
    out: dict[int, str] = {}
    parts: dict[tuple[int | None, int | None], list[str]] = {}
    for ins in dis.get_instructions(code):
        pos = getattr(ins, "positions", None)  # Python 3.11+; 3.10 names no C calls
        if pos is None or pos.lineno is None:
            continue
        start = (pos.lineno, pos.col_offset)
        if ins.opname in _LOADS and type(ins.argval) is str:
            parts.setdefault(start, []).append(ins.argval)
        elif ins.opname.startswith("PRECALL"):  # 3.11 calls C functions in PRECALL
            names = parts.get(start)
            if names:
                out[ins.offset] = ".".join(names)
        elif ins.opname.startswith("CALL") and ins.opname != "CALL_INTRINSIC_1":
            names = parts.pop(start, None)
            if names:
                out[ins.offset] = ".".join(names)
        elif not ins.opname.startswith(("PUSH_NULL", "CACHE", "KW_NAMES")):
            parts.pop(start, None)  # the callable is no plain name: (a + b)(), f()()
    return out


class _CallNames:
    """:func:`_call_names` per code object, kept for at most *limit* codes
    (each read once: a few hundred µs for a long function)."""

    def __init__(self, limit: int = MAX_KEYS) -> None:
        self._codes: dict[CodeType, dict[int, str]] = {}
        self._limit = limit

    def at(self, frame: FrameType) -> str:
        """The dotted name of the call *frame* is in (a C function: no frame
        of its own), or ``""`` when it is running its own bytecode."""
        code = frame.f_code
        names = self._codes.get(code)
        if names is None:
            if len(self._codes) >= self._limit:
                return ""
            names = self._codes[code] = _call_names(code)
        return names.get(frame.f_lasti, "")


def fold(
    frame: FrameType | None,
    roots: tuple[str, ...],
    own: tuple[str, ...] = (),
    calls: _CallNames | None = None,
    stop: Collection[CodeType] = (),
) -> tuple[str, int, str, str] | None:
    """(file, line, function, call) of the innermost frame not under *roots*,
    with *call* the public name of the outermost library function it had
    called, or with *calls*, of the C function the user frame itself is in
    (``time.sleep``: C functions have no frame); ``""``: the sample was in the
    user frame's own code. None when every frame is a library's, or when the
    innermost frame is under *own* (gpuprof's own code: not the user's time),
    or when no user frame comes before a frame running code in *stop* (a
    DataLoader worker's loop: what its process ran before the fork is not its
    work; torch's wrapper around a phase's hooks: the phase's time)."""
    if frame is not None and own and frame.f_code.co_filename.startswith(own):
        return None
    callee: FrameType | None = None
    while frame is not None:
        if frame.f_code in stop:
            return None
        path = frame.f_code.co_filename
        if not path.startswith(roots) and not path.startswith("<frozen"):
            if callee is not None:
                call = _qualname(callee)
            else:
                call = calls.at(frame) if calls is not None else ""
            return path, frame.f_lineno, frame.f_code.co_name, call
        if not (own and path.startswith(own)):  # gpuprof's wrapper is not the call
            callee = frame
        frame = frame.f_back
    return None


def torch_phase_entries() -> frozenset[CodeType]:
    """The code of torch's calls that run around gpuprof's phase hooks:
    ``Optimizer.step``'s hook wrapper (``record_function`` enter and exit,
    the pre and post hooks) and ``Tensor.backward`` (which calls the patched
    ``torch.autograd.backward``). A sample inside them before the phase's
    first hook or after its last is the phase's time, not the gap's. Read
    from torch itself; empty where a torch version has neither."""
    out: set[CodeType] = set()
    try:
        import torch

        step_hooks = torch.optim.Optimizer.profile_hook_step
        out.update(
            c
            for c in step_hooks.__code__.co_consts
            if isinstance(c, CodeType) and c.co_name == "wrapper"
        )
        out.add(torch.Tensor.backward.__code__)
    except (ImportError, AttributeError):
        pass
    return frozenset(out)


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
        flush: Callable[[dict[FrameKey, int]], object] | None = None,
        flush_every_s: float = SEND_EVERY_S,
        stop: Collection[CodeType] = (),
    ) -> None:
        self._tid = thread_id
        self._gate = gate
        self._step = step
        self._interval = interval_s
        self._max = max_keys
        self._roots = _library_roots()
        self._own = _own_roots()
        self._calls = _CallNames(max_keys)
        self._stop_codes = frozenset(stop)
        self.counts: dict[FrameKey, int] = {}
        """Samples per key since the start (at most *max_keys* keys)."""
        self._unsent: dict[FrameKey, int] = {}
        self.samples = 0
        """Samples taken (gate open), folded or not."""
        self.dropped = 0
        """Samples not counted: a new key past *max_keys*."""
        self._flush = flush
        self._flush_every = flush_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        """Take one sample now if the gate is open (the thread's own loop body)."""
        if not self._gate():
            return
        frame = sys._current_frames().get(self._tid)
        if frame is None:
            return
        # a phase that began while the frames were read: its time, not the gap's
        if not self._gate():
            del frame
            return
        self.samples += 1
        site = fold(frame, self._roots, self._own, self._calls, self._stop_codes)
        del frame
        if site is None:
            return
        key = FrameKey(*site, self._step())
        counts = self.counts
        if key in counts:
            counts[key] += 1
        elif len(counts) < self._max:
            counts[key] = 1
        else:  # the per-step keys are spent: the frame's merged key
            key = FrameKey(*site, OVERFLOW_STEP)
            if key in counts:
                counts[key] += 1
            elif len(counts) < self._max + self._max // 4:
                counts[key] = 1
            else:
                self.dropped += 1
                return
        unsent = self._unsent
        unsent[key] = unsent.get(key, 0) + 1

    def drain(self) -> dict[FrameKey, int]:
        """The counts taken since the last drain (call from the sampler's own
        thread, or after :meth:`stop`)."""
        out, self._unsent = self._unsent, {}
        return out

    def flush_now(self) -> None:
        """Hand the undrained counts to *flush* (if any); never raises."""
        if self._flush is None:
            return
        unsent = self.drain()
        if unsent:
            try:
                self._flush(unsent)
            except Exception:
                log.debug("gpuprof: could not send stack samples", exc_info=True)

    def _run(self) -> None:
        every = max(1, round(self._flush_every / self._interval))
        n = 0
        while not self._stop.wait(self._interval):
            try:
                self.sample_once()
            except Exception:  # never let profiling take anything down
                self.dropped += 1
            n += 1
            if n >= every:
                n = 0
                self.flush_now()

    def start(self) -> None:
        """Start the sampler thread (a daemon thread: it never holds exit)."""
        self._thread = threading.Thread(target=self._run, name="gpuprof-stacks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the sampler thread (at most one interval), then
        hand what is left to *flush*."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush_now()


def wire_rows(counts: dict[FrameKey, int]) -> list[list[object]]:
    """``stacks`` event rows (:data:`gpuprof.protocol.SCHEMAS`): ``[path, line,
    function, call, step, count]`` per key, text made printable and cut to
    the protocol's bounds; largest count first."""
    rows: list[list[object]] = []
    for k, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        path = clean_text(k.file, MAX_STACK_PATH_CHARS) or "?"
        name = clean_text(k.function, MAX_STACK_NAME_CHARS) or "?"
        call = clean_text(k.call, MAX_STACK_NAME_CHARS)
        line = min(max(k.line or 0, 0), 1 << 24)
        rows.append([path, line, name, call, min(max(k.step, 0), 1 << 40), min(c, MAX_STACK_COUNT)])
    return rows


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
