"""Kernel and operator aggregates: what the GPU spent a window on.

The shim folds ``torch.profiler`` events into :class:`KernelAgg` rows (never
whole traces over the socket); ``gpuprofctl nsys-import`` folds an Nsight
Systems export into the same rows; the daemon stores them per window and the
kernel rules read them. Pure: no torch, no I/O.

Wire form (one ``kernels`` event per window, see ``gpuprof.protocol``)::

    {"v": 1, "type": "kernels", "run_key": ..., "t0": ns, "t1": ns,
     "source": "snapshot" | "continuous" | "nsys", "steps": [i, ...],
     "rows": [[name, kind, cls, count, total_ns, self_ns, flops], ...],
     "rows_dropped": n}

``t0``/``t1`` are the window's monotonic ns; ``steps`` the step indices it
covered (a snapshot's traced step(s)); ``rows_dropped`` how many rows were cut
to keep the message under :data:`MAX_ROWS` (their time is in an ``(other)`` row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Kernel classes: time on the SMs, collectives (NCCL), copies, fills, the rest.
KERNEL_CLASSES = ("compute", "comm", "memcpy", "memset", "other")
#: Row kinds: a device kernel, or a framework operator (``aten::mm``) with
#: its self device time and FLOPs.
KINDS = ("kernel", "op")
SOURCES = ("snapshot", "continuous", "nsys")
#: Rows per window message: the top ones by device time; the rest are summed
#: into one ``(other)`` row per kind. ~100 bytes a row keeps a window < 32 KiB.
MAX_ROWS = 256
#: Longest kernel name kept (characters): templated CUDA names run to
#: kilobytes; the head names the kernel.
MAX_NAME_CHARS = 512
OTHER_ROW_NAME = "(other)"


@dataclass(frozen=True)
class KernelAgg:
    """One kernel (or operator) name's totals over a window."""

    name: str
    kind: str
    """``"kernel"`` or ``"op"`` (:data:`KINDS`)."""
    cls: str
    """One of :data:`KERNEL_CLASSES` (operators: the class of their kernels,
    ``"compute"`` when unknown)."""
    count: int
    """Launches (kernels) or calls (operators)."""
    total_ns: int
    """Device time, ns (operators: including their children's kernels)."""
    self_ns: int
    """Self device time, ns (kernels: equal to ``total_ns``)."""
    flops: float | None = None
    """FLOP the profiler attributed (operators with a FLOP formula), else None."""

    def to_wire(self) -> list[Any]:
        return [self.name, self.kind, self.cls, self.count, self.total_ns, self.self_ns,
                self.flops]  # fmt: skip

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> KernelAgg:
        """Rebuild a row validated by ``gpuprof.protocol`` (no checks here)."""
        name, kind, klass, count, total_ns, self_ns, flops = row
        return cls(name, kind, klass, int(count), int(total_ns), int(self_ns),
                   None if flops is None else float(flops))  # fmt: skip
