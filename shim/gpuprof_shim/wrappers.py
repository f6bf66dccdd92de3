"""The functions that stand in for torch's during auto mode, feeding a
:class:`~gpuprof_shim.auto.StepMachine`.

``Module.__call__`` is the hot path: every submodule call goes through it.
A nested call (depth > 0 on this thread) does one thread-local read and
calls the original. Only the outermost call on a thread is timed, and only
when grad is enabled (``no_grad`` evaluation is not training) and the
module has parameters (a parameterless module such as a torchvision
transform run by the loader, or a loss, cannot start a forward phase).

Every call into the machine is guarded: an internal error is logged once
and the user's call goes on. Once :attr:`Wrappers.enabled` is False the
wrappers are pure pass-throughs (for a patch someone else stacked on ours).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuprof_shim.auto import StepMachine

log = logging.getLogger("gpuprof.shim")


class _Depth(threading.local):
    """Per-thread nesting depths of module calls and backward calls."""

    module = 0
    backward = 0


#: Most modules walked looking for a parameter before giving up (and saying yes).
_MAX_WALK = 10_000


def _has_parameters(module: Any) -> bool:
    """True if *module* or a submodule holds a parameter.

    Walks ``_parameters``/``_modules`` directly: ``module.parameters()``
    costs ~10x more (it builds generators and a memo set), and this runs
    once per micro-batch inside the measured gap.
    """
    try:
        stack = [module]
        for _ in range(_MAX_WALK):
            if not stack:
                return False
            m = stack.pop()
            for p in m._parameters.values():
                if p is not None:
                    return True
            stack.extend(c for c in m._modules.values() if c is not None)
        return True
    except Exception:  # not a standard Module: let it count
        return True


class Wrappers:
    """Builds the replacement callables for one profiling session.

    Args:
        machine: receives the events.
        orig_module_call: the original ``torch.nn.Module.__call__``.
        orig_tensor_backward: the original ``torch.Tensor.backward``.
        orig_autograd_backward: the original ``torch.autograd.backward``.
        is_grad_enabled: ``torch.is_grad_enabled``.
    """

    def __init__(
        self,
        machine: StepMachine,
        orig_module_call: Callable[..., Any],
        orig_tensor_backward: Callable[..., Any],
        orig_autograd_backward: Callable[..., Any],
        is_grad_enabled: Callable[[], bool],
    ) -> None:
        self.machine = machine
        self.enabled = True
        self._errors = 0
        depth = _Depth()
        self.module_call = self._make_module_call(orig_module_call, depth, is_grad_enabled)
        self.tensor_backward = self._make_backward(orig_tensor_backward, depth)
        self.autograd_backward = self._make_backward(orig_autograd_backward, depth)

    def internal_error(self) -> None:
        """Log the first internal error with its traceback, later ones quietly."""
        self._errors += 1
        if self._errors == 1:
            log.warning("gpuprof: internal error; step timing may be off", exc_info=True)
        else:
            log.debug("gpuprof: internal error", exc_info=True)

    def _make_module_call(
        self,
        orig: Callable[..., Any],
        depth: _Depth,
        is_grad_enabled: Callable[[], bool],
    ) -> Callable[..., Any]:
        machine = self.machine
        clock = machine.clock
        wrappers = self

        # The first argument must be named ``self`` and no closure variable may
        # be: torch.profiler's Python tracer (``with_stack=True``) takes the
        # frame local ``self`` of ``Module.__call__``'s code as the module and
        # reads its ``_parameters``.
        def module_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if depth.module:  # nested submodule call: the fast path
                return orig(self, *args, **kwargs)
            if not wrappers.enabled:
                return orig(self, *args, **kwargs)
            depth.module = 1
            timed = False
            try:
                try:
                    timed = is_grad_enabled()
                    if timed and machine.accepts_forward() and _has_parameters(self):
                        machine.on_forward(clock())
                except Exception:
                    wrappers.internal_error()
                return orig(self, *args, **kwargs)
            finally:
                depth.module = 0
                if timed:
                    try:
                        machine.on_forward_end(clock())
                    except Exception:
                        wrappers.internal_error()

        module_call.__wrapped__ = orig  # type: ignore[attr-defined]
        return module_call

    def _make_backward(self, orig: Callable[..., Any], depth: _Depth) -> Callable[..., Any]:
        machine = self.machine
        clock = machine.clock

        def backward(*args: Any, **kwargs: Any) -> Any:
            # Tensor.backward calls torch.autograd.backward: count the pair once.
            if depth.backward or not self.enabled:
                return orig(*args, **kwargs)
            depth.backward = 1
            counted = False
            try:
                try:
                    counted = machine.on_backward_start(clock())
                except Exception:
                    self.internal_error()
                return orig(*args, **kwargs)
            finally:
                depth.backward = 0
                if counted:
                    try:
                        machine.on_backward_end(clock())
                    except Exception:
                        self.internal_error()

        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        backward.__doc__ = getattr(orig, "__doc__", None)
        return backward

    def optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global ``register_optimizer_step_pre_hook`` callback; returns None
        so torch keeps the step's arguments."""
        if self.enabled:
            try:
                self.machine.on_optimizer_pre(self.machine.clock(), optimizer)
            except Exception:
                self.internal_error()

    def optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global ``register_optimizer_step_post_hook`` callback."""
        if self.enabled:
            try:
                self.machine.on_optimizer_post(self.machine.clock(), optimizer)
            except Exception:
                self.internal_error()

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
