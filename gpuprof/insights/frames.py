"""Which of the user's code the sampled time went to (pure).

The shim samples the training thread's Python stack about every 10 ms while
it is outside forward, backward and the optimizer (``profile(stacks=...)``,
:mod:`gpuprof_shim.stacks`), folding library frames into the user frame
that called them; gpuprofd stores the counts per frame and step
(``stack_samples``). These functions rank those frames and word them for a
finding: ``torch.save, called from train.py:212 (save_checkpoint)``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

#: A frame's share of the samples below which a finding does not name it:
#: one in ten samples is noise next to the frame that holds the time.
MIN_SHARE = 0.10
#: Samples (~10 ms each) below which nothing is named: fewer than 5 samples
#: (~50 ms in a whole run) cannot rank frames.
MIN_SAMPLES = 5
#: Frames named in a finding's text (the evidence carries the same ones).
TOP_FRAMES = 3


class StackFrame(NamedTuple):
    """One stored ``stack_samples`` row: samples of *source* (``main``: the
    training thread between phases; ``loader``: DataLoader workers) in the
    gap before step *step*, at the user's frame (*path*, *line*,
    *function*) inside library call *call* (``""``: none)."""

    source: str
    step: int
    path: str
    line: int
    function: str
    call: str
    samples: int


class FrameShare(NamedTuple):
    """One user frame (steps merged) and its share (0-1) of the samples."""

    path: str
    line: int
    function: str
    call: str
    samples: int
    share: float

    def site(self) -> str:
        """``train.py:212 (save_checkpoint)``: the file's base name, the
        line and the function."""
        return f"{posixpath.basename(self.path) or self.path}:{self.line} ({self.function})"

    def phrase(self) -> str:
        """``torch.save, called from train.py:212 (save_checkpoint)``, or the
        site alone when the sample was in the user's own code."""
        return f"{self.call}, called from {self.site()}" if self.call else self.site()

    def short(self) -> str:
        """``torch.save from train.py:212``, or ``train.py:212 (save_checkpoint)``."""
        where = f"{posixpath.basename(self.path) or self.path}:{self.line}"
        return f"{self.call} from {where}" if self.call else self.site()

    def evidence(self) -> dict[str, Any]:
        """The frame as a finding's evidence entry (full path, share 0-1)."""
        return {
            "path": self.path,
            "line": self.line,
            "function": self.function,
            "call": self.call,
            "samples": self.samples,
            "share": round(self.share, 4),
        }


def from_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[StackFrame, ...]:
    """``stack_samples`` rows (``source``, ``step``, ``path``, ``line``,
    ``func``, ``callee``, ``samples``) as :class:`StackFrame` s."""
    return tuple(
        StackFrame(
            str(r["source"]),
            int(r["step"]),
            str(r["path"]),
            int(r["line"]),
            str(r["func"]),
            str(r["callee"] or ""),
            int(r["samples"]),
        )
        for r in rows
    )


def top_frames(
    frames: Sequence[StackFrame],
    source: str = "main",
    steps: Collection[int] | None = None,
    n: int = TOP_FRAMES,
    exclude: Collection[int] = (),
) -> list[FrameShare]:
    """The *n* user frames of *source* with the most samples (in the gaps
    before *steps* only, when given; never those before *exclude*), each
    with its share of those samples,
    largest first; only frames of at least :data:`MIN_SHARE`, and none when
    fewer than :data:`MIN_SAMPLES` samples were taken."""
    merged: dict[tuple[str, int, str, str], int] = {}
    for f in frames:
        if f.source != source or (steps is not None and f.step not in steps):
            continue
        if f.step in exclude:
            continue
        key = (f.path, f.line, f.function, f.call)
        merged[key] = merged.get(key, 0) + f.samples
    total = sum(merged.values())
    if total < MIN_SAMPLES:
        return []
    ranked = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [
        FrameShare(*key, samples=c, share=c / total) for key, c in ranked if c / total >= MIN_SHARE
    ]


#: Calls (the last part of a frame's ``call``) that wait for the GPU to finish
#: the work already queued: a host-device sync. Time in them between steps is
#: the GPU's busy time, not host work (seen on an H200, 2026-12-04: a GPT loop
#: ending each step in ``loss.item()`` spent 90 % of its gap samples there).
DEVICE_SYNC_CALLS = frozenset({"item", "synchronize", "cpu", "_local_scalar_dense"})
#: Calls that block without computing: a sleep, a lock, a socket, a file or
#: pipe read, an event or queue wait. A worker sampled in them waits on
#: something; its CPU use, however the host's load makes it look, is not the
#: cause (seen here on a 2-core box, 2026-12-04: two workers 100 % in
#: ``time.sleep`` judged CPU-bound from their preemptions beside a busy core).
BLOCKING_CALLS = frozenset(
    {
        "sleep",
        "wait",
        "acquire",
        "select",
        "poll",
        "recv",
        "recv_into",
        "recvfrom",
        "accept",
        "connect",
        "read",
        "readinto",
        "urlopen",
    }
)


def call_share(
    frames: Sequence[StackFrame],
    calls: Collection[str],
    source: str = "main",
    exclude: Collection[int] = (),
) -> float | None:
    """Share (0-1) of *source*'s samples (never those before *exclude*) in a
    call whose last name part is one of *calls*; None below
    :data:`MIN_SAMPLES` samples."""
    total = hit = 0
    for f in frames:
        if f.source != source or f.step in exclude:
            continue
        total += f.samples
        if f.call.rpartition(".")[2] in calls:
            hit += f.samples
    return hit / total if total >= MIN_SAMPLES else None


def sync_share(
    frames: Sequence[StackFrame], source: str = "main", exclude: Collection[int] = ()
) -> float | None:
    """Share (0-1) of *source*'s samples in a :data:`DEVICE_SYNC_CALLS` call
    (:func:`call_share`)."""
    return call_share(frames, DEVICE_SYNC_CALLS, source, exclude)


def _shares(lead: str, top: Sequence[FrameShare]) -> str:
    """*lead* (its ``{}`` the first frame's share) and the first frame, then
    ``; 12% in ...`` for each other; ``""`` for no frames."""
    if not top:
        return ""
    head, *rest = top
    text = f"{lead.format(f'{head.share:.0%}')} {head.phrase()}"
    return text + "".join(f"; {f.share:.0%} in {f.phrase()}" for f in rest) + "."


def loader_sentence(top: Sequence[FrameShare], verb: str = "spend") -> str:
    """``The workers spend 71% of their time in augment, called from
    dataset.py:41 (__getitem__); 20% in ...`` (*verb*: ``spend`` or ``wait``:
    what the shares are of is the workers' sampled time either way);
    ``""`` for no frames."""
    return _shares(f"The workers {verb} {{}} of their time in", top)


def gap_sentence(top: Sequence[FrameShare], of: str = "the time between steps") -> str:
    """``74% of the time between steps is in torch.save, called from
    train.py:212 (save_checkpoint); 12% in ...`` (*of* names what the
    shares are of); ``""`` for no frames."""
    return _shares(f"{{}} of {of} is in", top)
