"""The functions that stand in for torch's during auto mode, feeding a
:class:`~gpuprof_shim.auto.machine.StepMachine`.

Forwards (module calls) are found by :class:`~gpuprof_shim.auto.forwards.ForwardDetector`:
a short discovery window patches ``Module.__call__``, then only the root
modules carry a wrapper. Backward calls are the patched
``torch.autograd.backward`` (``Tensor.backward`` calls it, looked up at each
call); each outermost one also tells the detector (a backward with no
forward seen sends it looking for an unknown root).

Every call into the machine is guarded: an internal error is logged once
and the user's call goes on. Once :attr:`Wrappers.enabled` is False the
wrappers are pure pass-throughs (for a patch someone else stacked on ours).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from gpuprof_shim.auto.forwards import ForwardDetector, Tracing
from gpuprof_shim.auto.machine import StepMachine

log = logging.getLogger("gpuprof.shim")


class Wrappers:
    """Builds the replacement callables for one profiling session.

    Args:
        machine: receives the events.
        module_cls: ``torch.nn.Module`` (its ``__call__`` as found is the original).
        orig_autograd_backward: the original ``torch.autograd.backward``.
        is_grad_enabled: ``torch.is_grad_enabled``.
        is_compiling: ``torch.compiler.is_compiling``.
        tracing: the same question, asked faster by the wrappers that run
            every step (:class:`~gpuprof_shim.auto.forwards.Tracing`; default:
            *is_compiling* itself).
        on_loader_iterator: called with each iterator ``DataLoader.__iter__``
            returns (to report its worker processes); must not raise.
    """

    def __init__(
        self,
        machine: StepMachine,
        module_cls: Any,
        orig_autograd_backward: Callable[..., Any],
        is_grad_enabled: Callable[[], bool],
        is_compiling: Callable[[], bool],
        tracing: Tracing | None = None,
        on_loader_iterator: Callable[[Any], None] | None = None,
    ) -> None:
        self.machine = machine
        self.on_loader_iterator = on_loader_iterator
        #: Called with the DataLoader before ``__iter__`` starts its workers
        #: (the worker stack sampler's init hook); returns the undo, run
        #: after it. None: nothing to prepare.
        self.prepare_loader: Callable[[Any], Callable[[], None] | None] | None = None
        self.is_compiling = is_compiling
        self.enabled = True
        self._errors = 0
        #: A backward call is in progress (any thread): one inside it (a
        #: reentrant checkpoint's, run by the engine, maybe on its device
        #: thread) is part of it. The machine counts one backward at a time.
        self.in_backward = False
        self.forwards = ForwardDetector(
            machine, self.internal_error, module_cls, is_grad_enabled, is_compiling, tracing
        )
        self.autograd_backward = self._make_backward(orig_autograd_backward)
        #: Global ``register_optimizer_step_pre_hook``/``post_hook`` callbacks.
        self.optimizer_pre_hook, self.optimizer_post_hook = self._make_optimizer_hooks()

    def internal_error(self) -> None:
        """Log the first internal error with its traceback, later ones quietly."""
        self._errors += 1
        if self._errors == 1:
            log.warning("gpuprof: internal error; step timing may be off", exc_info=True)
        else:
            log.debug("gpuprof: internal error", exc_info=True)

    def _make_backward(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """The stand-in for ``torch.autograd.backward``: with torch's own
        parameters when *orig* has the ones expected (``Tensor.backward``
        passes ``inputs=`` by keyword, and a ``*args, **kwargs`` pass-through
        costs more than the timing itself), else ``*args, **kwargs``."""
        wrappers = self
        machine = self.machine
        clock = machine.clock
        forwards = self.forwards
        on_backward = forwards.on_backward
        on_start, on_end = machine.on_backward_start, machine.on_backward_end

        def begin() -> int:
            """A backward call starts: 0 to pass it through (reentrant, or
            disabled), 1 entered, 2 entered and counted by the machine."""
            # a reentrant backward (activation checkpointing's, from inside
            # the engine) is part of the outer one: counted once
            if wrappers.in_backward or not wrappers.enabled:
                return 0
            wrappers.in_backward = True
            try:
                if forwards._forward_seen and forwards.enabled and not forwards._patched:
                    forwards._forward_seen = False  # on_backward()'s steady state, inlined
                else:
                    on_backward()
            except Exception:
                wrappers.internal_error()
            try:
                return 2 if on_start(clock()) else 1
            except Exception:
                wrappers.internal_error()
                return 1

        def end(entered: int) -> None:
            """The call that :func:`begin` answered *entered* returned or raised."""
            if entered:
                wrappers.in_backward = False
                if entered == 2:
                    try:
                        on_end(clock())
                    except Exception:
                        wrappers.internal_error()

        if _parameters(orig) == _AUTOGRAD_BACKWARD_PARAMETERS:

            def backward(
                tensors: Any,
                grad_tensors: Any = None,
                retain_graph: Any = None,
                create_graph: Any = False,
                grad_variables: Any = None,
                inputs: Any = None,
            ) -> Any:
                entered = begin()
                try:
                    return orig(
                        tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs
                    )
                finally:
                    end(entered)

        else:

            def backward(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                entered = begin()
                try:
                    return orig(*args, **kwargs)
                finally:
                    end(entered)

        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        backward.__doc__ = getattr(orig, "__doc__", None)
        return backward

    def make_rediscover(
        self, orig: Callable[..., Any], *, on_mode_change: bool = False
    ) -> Callable[..., Any]:
        """A stand-in for ``DataLoader.__iter__`` or ``Module.train``: opens a
        forward-discovery window, then calls *orig* unchanged. With
        *on_mode_change* (``train(mode)``), only when the module's mode changes:
        a loop calling ``model.train()`` every iteration keeps no window open."""
        forwards = self.forwards

        def rediscover_then(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if on_mode_change:
                mode = args[0] if args else kwargs.get("mode", True)
                changing = getattr(self_, "training", None) != bool(mode)
            else:
                changing = True
            if changing and forwards.enabled:
                try:
                    forwards.rediscover()
                except Exception:
                    self.internal_error()
            return orig(self_, *args, **kwargs)

        return _stand_in(rediscover_then, orig)

    def make_loader_iter(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """A stand-in for ``DataLoader.__iter__``: a new iterator (an epoch or
        a validation pass) opens a forward-discovery window and is noted for
        the step machine (a validation loader's start-up is eval time); the
        iterator it returns goes to ``on_loader_iterator`` (its worker pids)."""
        rediscover_then = self.make_rediscover(orig)
        machine = self.machine

        def loader_iter(self_: Any) -> Any:
            if self.enabled:
                try:
                    machine.on_loader_iter(machine.clock())
                except Exception:
                    self.internal_error()
            prepare, undo = self.prepare_loader, None
            if self.enabled and prepare is not None:
                try:
                    undo = prepare(self_)
                except Exception:
                    self.internal_error()
            try:
                it = rediscover_then(self_)
            finally:
                if undo is not None:
                    try:
                        undo()
                    except Exception:
                        self.internal_error()
            report = self.on_loader_iterator
            if self.enabled and report is not None:
                try:
                    report(it)
                except Exception:
                    self.internal_error()
            return it

        return _stand_in(loader_iter, orig)

    def make_loader_next(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """A stand-in for the DataLoader iterators' ``__next__``: each fetch
        is timed as loader wait (or, inside a step, its data phase) unless
        the user times the loader with ``prof.wrap_dataloader`` (then that
        alone counts). The last one (StopIteration: workers shut down) ends
        an eval loop or is loader wait; a fetch that raises otherwise is not
        counted."""
        wrappers = self
        machine = self.machine
        clock = machine.clock
        add_loader_wait = machine.add_loader_wait

        def loader_next(self_: Any) -> Any:
            if machine.explicit or not wrappers.enabled:
                return orig(self_)
            t = clock()
            try:
                item = orig(self_)
            except StopIteration:
                try:
                    machine.on_loader_exhausted(t, clock())
                except Exception:
                    wrappers.internal_error()
                raise
            try:
                add_loader_wait(clock() - t)
            except Exception:
                wrappers.internal_error()
            return item

        return _stand_in(loader_next, orig)

    def _make_optimizer_hooks(self) -> tuple[Callable[..., None], Callable[..., None]]:
        """The global optimizer step pre and post hooks. They return None so
        torch keeps the step's arguments, and do nothing while dynamo traces
        a compiled ``step()`` (a clock read there would break its graph)."""
        wrappers = self
        machine = self.machine
        clock = machine.clock
        dynamo, flags = self.forwards.tracing
        on_pre, on_post = machine.on_optimizer_pre, machine.on_optimizer_post

        def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if wrappers.enabled and not (dynamo() or flags._is_compiling_flag):
                try:
                    on_pre(clock(), optimizer)
                except Exception:
                    wrappers.internal_error()

        def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if wrappers.enabled and not (dynamo() or flags._is_compiling_flag):
                try:
                    on_post(clock(), optimizer)
                except Exception:
                    wrappers.internal_error()

        return optimizer_pre_hook, optimizer_post_hook

    def make_scaler_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """A stand-in for ``torch.amp.GradScaler.step``: the scaler's step is
        the optimizer's turn even when it skips ``optimizer.step()`` because
        the gradients hold inf/NaN (then the step is marked skipped)."""
        machine = self.machine

        def scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return orig(scaler, optimizer, *args, **kwargs)
            try:
                machine.on_scaler_step_start(machine.clock(), optimizer)
            except Exception:
                self.internal_error()
            try:
                return orig(scaler, optimizer, *args, **kwargs)
            finally:
                try:
                    machine.on_scaler_step_end(machine.clock(), optimizer)
                except Exception:
                    self.internal_error()

        scaler_step.__wrapped__ = orig  # type: ignore[attr-defined]
        scaler_step.__doc__ = getattr(orig, "__doc__", None)
        scaler_step.__name__ = "step"
        scaler_step.__qualname__ = getattr(orig, "__qualname__", "step")
        return scaler_step


#: ``torch.autograd.backward``'s parameters (name, default) in torch 2.x.
_AUTOGRAD_BACKWARD_PARAMETERS = (
    ("tensors", inspect.Parameter.empty),
    ("grad_tensors", None),
    ("retain_graph", None),
    ("create_graph", False),
    ("grad_variables", None),
    ("inputs", None),
)


def _parameters(fn: Callable[..., Any]) -> tuple[tuple[str, Any], ...] | None:
    """*fn*'s parameters as ``(name, default)`` if all are plain
    positional-or-keyword ones, else (or if unreadable) None."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    return tuple((p.name, p.default) for p in params)


def _stand_in(fn: Callable[..., Any], orig: Callable[..., Any]) -> Callable[..., Any]:
    """*fn* dressed as *orig* (name, qualname, doc, ``__wrapped__``) so that
    tracebacks, ``inspect`` and unpatching see the original."""
    fn.__wrapped__ = orig  # type: ignore[attr-defined]
    for attr in ("__name__", "__qualname__", "__doc__"):
        setattr(fn, attr, getattr(orig, attr, None))
    return fn
