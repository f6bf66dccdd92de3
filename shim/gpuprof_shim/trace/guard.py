"""gpuprof's wrappers on torch's profiler classes while trace windows are on
(:class:`TorchGuard`), put in place through a
:class:`~gpuprof_shim.patches.PatchSet` so the originals always go back.

The user's own profiler
    While one is active (``torch._C._autograd._profiler_enabled()``, which
    covers ``torch.profiler``, ``torch.autograd.profiler`` and ``emit_nvtx``)
    or merely prepared (a scheduled ``torch.profiler.profile`` in its warm-up
    steps, which no torch API reports), windows are skipped with one notice.
    The second case is seen through a small wrapper on
    ``torch.autograd.profiler.profile._prepare_trace`` / ``__exit__``,
    installed while tracing is on and removed at exit; it also stops a
    gpuprof window the moment the user's profiler prepares (two Kineto
    sessions at once crash torch 2.13 with a segfault). ``record_function``
    ranges entered during a window and still open when it stops (the
    optimizer's own) are ended first: see :class:`TorchGuard`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpuprof_shim.patches import PatchSet

log = logging.getLogger("gpuprof.shim")


class TorchGuard:
    """gpuprof's two small wrappers on torch's profiler classes while tracing
    is on (the originals go back on :meth:`remove`):

    - ``torch.autograd.profiler.profile._prepare_trace`` / ``__exit__``: sees
      the user's profilers prepare and finish (see the module docstring).
    - ``torch.autograd.profiler.record_function.__enter__`` / ``__exit__``:
      remembers the ranges entered while a gpuprof window records and not yet
      exited (the optimizer's ``Optimizer.step#…`` range is open when its post
      hook ends a window). Stopping a Kineto session while such a range is open
      makes its later exit write into freed memory: torch 2.13 then crashes
      (heap corruption, seen as a segfault in a later garbage collection).
      :meth:`end_open_ranges` ends them first, as torch.profiler does with
      its own ``ProfilerStep#`` range, and their real exit then does nothing.
    """

    def __init__(self, on_user_prepare: Callable[[], None]) -> None:
        self.on_user_prepare = on_user_prepare
        self.ours_starting = False
        #: True while a gpuprof window records.
        self.window_on = False
        self._prepared: Any = None  # WeakSet of the user's prepared profile objects
        self._open: dict[int, Any] = {}  # id -> record_function entered in a window
        self._end_range: Callable[[Any], None] | None = None
        self._patched = PatchSet("profiler guard")

    @property
    def user_prepared(self) -> bool:
        return bool(self._prepared)

    def install(self, legacy: Any, end_range: Callable[[Any], None]) -> None:
        """Wrap ``legacy.profile`` and ``legacy.record_function`` (the
        ``torch.autograd.profiler`` module); *end_range* ends a range's record."""
        import weakref

        self._prepared = weakref.WeakSet()
        self._end_range = end_range
        guard = self
        prof_cls, rf_cls = legacy.profile, legacy.record_function
        orig_prepare = vars(prof_cls)["_prepare_trace"]
        orig_exit = vars(prof_cls)["__exit__"]
        orig_rf_enter = vars(rf_cls)["__enter__"]
        orig_rf_exit = vars(rf_cls)["__exit__"]

        def _prepare_trace(prof: Any) -> Any:
            if not guard.ours_starting:
                try:
                    guard.on_user_prepare()
                    guard._prepared.add(prof)
                except Exception:
                    log.debug("gpuprof: profiler guard", exc_info=True)
            return orig_prepare(prof)

        def __exit__(prof: Any, *exc: Any) -> Any:  # noqa: N807
            guard._prepared.discard(prof)
            return orig_exit(prof, *exc)

        def rf_enter(rf: Any) -> Any:
            out = orig_rf_enter(rf)
            if guard.window_on:
                guard._open[id(rf)] = rf
            return out

        def rf_exit(rf: Any, *exc: Any) -> Any:
            if guard._open:
                guard._open.pop(id(rf), None)
            return orig_rf_exit(rf, *exc)

        for cls, name, mine in (
            (prof_cls, "_prepare_trace", _prepare_trace),
            (prof_cls, "__exit__", __exit__),
            (rf_cls, "__enter__", rf_enter),
            (rf_cls, "__exit__", rf_exit),
        ):
            self._patched.patch(cls, name, mine)

    def end_open_ranges(self) -> None:
        """End the ranges entered during the window and still open (before the
        window's profiler stops); their own exit then skips the end callbacks."""
        open_, self._open = self._open, {}
        for rf in open_.values():
            try:
                if rf.run_callbacks_on_exit and rf.record is not None and self._end_range:
                    self._end_range(rf.record)
                    rf.run_callbacks_on_exit = False
            except Exception:
                log.debug("gpuprof: could not end a profiler range", exc_info=True)

    def remove(self) -> None:
        """Put the originals back (unless someone re-patched after us); never raises."""
        self._patched.remove()
        self._open = {}


def range_ender(torch: Any) -> Callable[[Any], None]:
    """What ``record_function.__exit__`` calls to end a range's record."""

    def end(record: Any) -> None:
        with torch._C.DisableTorchFunctionSubclass():
            torch.ops.profiler._record_function_exit._RecordFunction(record)

    return end
