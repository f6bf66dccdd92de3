"""DeepSpeed: :func:`wrap_deepspeed_engine` profiles a ``DeepSpeedEngine``
training loop.

DeepSpeed's loop calls ``engine(batch)``, ``engine.backward(loss)`` and
``engine.step()`` for every micro-batch; the engine updates the model only
at the gradient accumulation boundary. So steps come from the engine
(``step_source="external"``): a step ends when ``engine.step()`` advanced
``engine.global_steps`` (or, if that cannot be read, when
``engine.is_gradient_accumulation_boundary()`` was true before it); its
micro-batches are the ``step()`` calls since the last boundary; it is
skipped if ``engine.skipped_steps`` grew (DeepSpeed's fp16 optimizer found
inf/NaN gradients) or a ``GradScaler`` skipped the update (auto mode's
patch). Phases are timed by auto mode's patches: the engine is a module
(its call is the forward), ``engine.backward`` calls ``loss.backward()``,
and the engine's torch optimizer fires the optimizer step hooks.

This module does not import DeepSpeed: it works with anything that has the
engine's interface. The pipeline engine's ``train_batch()`` (which runs the
whole accumulation window itself) is not covered.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuprof_shim.adapters._run import AdapterRun, EndsRunOnExit
from gpuprof_shim.session import Profiler

log = logging.getLogger("gpuprof.shim")

_OWN = frozenset({"_engine", "_run", "_micro"})


class ProfiledEngine(EndsRunOnExit):
    """A thin proxy over a DeepSpeed engine: everything is the engine's,
    except that ``step()`` also ends gpuprof's steps, and ``close()`` /
    ``destroy()`` (or leaving ``with``) end the profile.

    Attribute reads and writes go to the engine; ``__wrapped__`` is the
    engine itself (for ``isinstance`` checks or code that needs the module).
    """

    def __init__(self, engine: Any, run: AdapterRun) -> None:
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_micro", 0)

    @property
    def __wrapped__(self) -> Any:
        return self._engine

    @property
    def profiler(self) -> Profiler | None:
        """The profile this proxy started (None if it could not start)."""
        return self._run.profiler

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _OWN:  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._engine, name, value)

    def __repr__(self) -> str:
        return f"ProfiledEngine({self._engine!r})"

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """``engine.step()``; at the accumulation boundary gpuprof's step ends."""
        engine = self._engine
        before = _counters(engine)
        result = engine.step(*args, **kwargs)
        self._micro += 1
        after = _counters(engine)
        ended, skipped = _step_outcome(before, after)
        if ended:
            micro, self._micro = self._micro, 0
            self._run.mark_step_end(skipped=skipped, micro=micro)
        return result

    def close(self) -> None:
        """End the profile (training done); the engine stays usable."""
        self._run.stop()

    def destroy(self, *args: Any, **kwargs: Any) -> Any:
        """End the profile, then ``engine.destroy()``."""
        self._run.stop()
        return self._engine.destroy(*args, **kwargs)


def wrap_deepspeed_engine(engine: Any, run_name: str, **profile_options: Any) -> ProfiledEngine:
    """Start profiling *engine*'s training loop now; returns a proxy to use
    in its place (``engine = gpuprof.wrap_deepspeed_engine(engine, "run")``).

    End the profile with ``engine.close()``, ``engine.destroy()``, or by
    using the proxy as a context manager (``with engine: ...``; an exception
    marks the run failed). If profiling cannot start (another profile is
    active in this process), a warning is logged and the proxy just passes
    calls through.

    Args:
        engine: the engine from ``deepspeed.initialize``.
        run_name: the run's name, as for :func:`gpuprof.profile`.
        **profile_options: other :func:`gpuprof.profile`
            options; not ``auto`` or ``step_source``, which the wrapper sets.

    Raises:
        TypeError: *engine* is not a DeepSpeed engine (see
            :func:`check_engine`), or ``auto`` or ``step_source`` was passed.
        ValueError: an invalid profile option.
    """
    check_engine(engine)
    run = AdapterRun(
        "wrap_deepspeed_engine", run_name, profile_options, {"step_source": "external"}
    )
    proxy = ProfiledEngine(engine, run)
    run.start()
    return proxy


#: What the wrapper needs of an engine, as its TypeError says it.
EXPECTED = (
    "a DeepSpeed engine (the first value deepspeed.initialize returns): callable "
    "(the forward), with step() and global_steps or is_gradient_accumulation_boundary()"
)


def check_engine(engine: Any) -> None:
    """Raise TypeError unless *engine* has what the wrapper uses: it is
    called (the forward), its ``step()`` is called, and a step ends when
    ``global_steps`` grows or ``is_gradient_accumulation_boundary()`` says so.
    Duck-typed: DeepSpeed itself is not imported."""
    has = {
        "__call__": callable(engine),
        "step()": callable(getattr(engine, "step", None)),
        "global_steps/is_gradient_accumulation_boundary()": hasattr(engine, "global_steps")
        or callable(getattr(engine, "is_gradient_accumulation_boundary", None)),
    }
    missing = [name for name, ok in has.items() if not ok]
    if missing:
        shown = repr(engine)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        lacks = " and ".join([", ".join(missing[:-1]), missing[-1]] if missing[:-1] else missing)
        raise TypeError(
            f"gpuprof.wrap_deepspeed_engine expects {EXPECTED}; got {type(engine).__qualname__} "
            f"{shown}, which lacks {lacks}"
        )


def _counters(engine: Any) -> tuple[int | None, int | None, bool]:
    """``(global_steps, skipped_steps, boundary)`` read before or after a
    ``step()``; an unreadable counter is None (never raises)."""
    values: list[Any] = []
    for name in ("global_steps", "skipped_steps"):
        try:
            value = getattr(engine, name)
            values.append(int(value))
        except Exception:
            values.append(None)
    try:
        boundary = bool(engine.is_gradient_accumulation_boundary())
    except Exception:
        boundary = False
    return values[0], values[1], boundary


def _step_outcome(
    before: tuple[int | None, int | None, bool], after: tuple[int | None, int | None, bool]
) -> tuple[bool, bool]:
    """Whether a ``step()`` ended an optimizer step, and whether that update
    was skipped, from the counters read around it."""
    (steps0, skipped0, boundary), (steps1, skipped1, _) = before, after
    if steps0 is not None and steps1 is not None:
        ended = steps1 > steps0
    else:
        ended = boundary
    skipped = skipped0 is not None and skipped1 is not None and skipped1 > skipped0
    return ended, skipped and ended
