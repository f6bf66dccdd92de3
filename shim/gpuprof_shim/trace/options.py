"""The trace options of ``gpuprof.profile(...)`` (``trace_every_n_steps``,
``trace_range``, ``continuous_traces_hz``, ``trace_dir``,
``trace_dir_max_mb``), checked into a :class:`TraceOptions`. What each mode
profiles is said in :mod:`gpuprof_shim.trace.windows`."""

from __future__ import annotations

import math
import operator
import os
from dataclasses import dataclass
from pathlib import Path

#: Highest ``continuous_traces_hz`` accepted: a window per 100 ms already
#: samples every 10th step of a 10 ms loop.
MAX_CONTINUOUS_HZ = 10.0
#: Largest ``trace_every_n_steps`` / range bound accepted (the protocol's step index bound).
MAX_STEP = 1 << 40
#: Default total size of chrome traces written to ``trace_dir``, MB.
DEFAULT_TRACE_DIR_MAX_MB = 1024.0


def _int_option(name: str, value: object, low: int) -> int:
    if type(value) is not int and not (hasattr(value, "__index__") and type(value) is not bool):
        raise ValueError(f"gpuprof: {name} must be an int, got {value!r}")
    n = operator.index(value)  # type: ignore[arg-type]
    if not low <= n <= MAX_STEP:
        raise ValueError(f"gpuprof: {name} must be between {low} and {MAX_STEP}, got {n}")
    return n


@dataclass(frozen=True)
class TraceOptions:
    """The trace options of ``gpuprof.profile(...)``, checked.

    Attributes:
        every_n: ``trace_every_n_steps`` (>= 1), or None.
        range: ``trace_range`` ``(a, b)``, ``0 <= a <= b``, steps inclusive, or None.
        hz: ``continuous_traces_hz`` (0 < hz <= :data:`MAX_CONTINUOUS_HZ`), or None.
        trace_dir: where chrome traces (``.pt.trace.json.gz``) go, or None (never by default).
        trace_dir_max_bytes: total size cap of the files written there, bytes.
    """

    every_n: int | None = None
    range: tuple[int, int] | None = None
    hz: float | None = None
    trace_dir: Path | None = None
    trace_dir_max_bytes: int = int(DEFAULT_TRACE_DIR_MAX_MB * 1e6)

    @property
    def enabled(self) -> bool:
        return self.every_n is not None or self.range is not None or self.hz is not None

    @classmethod
    def parse(
        cls,
        trace_every_n_steps: object = None,
        trace_range: object = None,
        continuous_traces_hz: object = None,
        trace_dir: object = None,
        trace_dir_max_mb: object = DEFAULT_TRACE_DIR_MAX_MB,
    ) -> TraceOptions:
        """Check the user's arguments.

        Raises:
            ValueError: one of them is out of range or of the wrong type.
        """
        every_n = None
        if trace_every_n_steps is not None:
            every_n = _int_option("trace_every_n_steps", trace_every_n_steps, 1)
        rng = None
        if trace_range is not None:
            if isinstance(trace_range, (str, bytes)) or not hasattr(trace_range, "__len__"):
                raise ValueError(f"gpuprof: trace_range must be a pair (a, b), got {trace_range!r}")
            if len(trace_range) != 2:  # type: ignore[arg-type]
                raise ValueError(f"gpuprof: trace_range must be a pair (a, b), got {trace_range!r}")
            a, b = trace_range  # type: ignore[misc]
            a = _int_option("trace_range start", a, 0)
            b = _int_option("trace_range end", b, 0)
            if b < a:
                raise ValueError(f"gpuprof: trace_range must have a <= b, got ({a}, {b})")
            rng = (a, b)
        hz = None
        if continuous_traces_hz is not None:
            ok = type(continuous_traces_hz) in (int, float) and math.isfinite(continuous_traces_hz)  # type: ignore[arg-type]
            if not ok or not 0 < continuous_traces_hz <= MAX_CONTINUOUS_HZ:  # type: ignore[operator]
                raise ValueError(
                    "gpuprof: continuous_traces_hz must be a number in "
                    f"(0, {MAX_CONTINUOUS_HZ:g}], got {continuous_traces_hz!r}"
                )
            hz = float(continuous_traces_hz)  # type: ignore[arg-type]
        path = None
        if trace_dir is not None:
            if not isinstance(trace_dir, (str, os.PathLike)) or not os.fspath(trace_dir):
                raise ValueError(f"gpuprof: trace_dir must be a directory path, got {trace_dir!r}")
            path = Path(trace_dir).expanduser()
            if every_n is None and rng is None and hz is None:  # said before the disk is looked at
                raise ValueError(
                    "gpuprof: trace_dir needs a trace mode (trace_every_n_steps, trace_range "
                    "or continuous_traces_hz)"
                )
            if path.exists() and not path.is_dir():
                raise ValueError(f"gpuprof: trace_dir {str(path)!r} exists and is not a directory")
        ok = type(trace_dir_max_mb) in (int, float) and math.isfinite(trace_dir_max_mb)  # type: ignore[arg-type]
        if not ok or not trace_dir_max_mb > 0:  # type: ignore[operator]
            raise ValueError(
                f"gpuprof: trace_dir_max_mb must be a positive number, got {trace_dir_max_mb!r}"
            )
        return cls(every_n, rng, hz, path, int(trace_dir_max_mb * 1e6))  # type: ignore[operator]
