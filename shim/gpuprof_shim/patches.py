"""The one owner of gpuprof's global changes to torch.

Auto mode replaces ``torch.autograd.backward`` (which ``Tensor.backward`` calls),
``torch.amp.GradScaler.step``, ``torch.nn.Module.train`` and
``torch.utils.data.DataLoader.__iter__`` (to open a forward-discovery
window), the DataLoader iterators' ``__next__`` (to time each fetch);
registers torch's global optimizer step pre/post hooks (removable handles;
``Optimizer.step`` itself is untouched); and starts the forward detector
(:mod:`gpuprof_shim.auto.forwards`: ``torch.nn.Module.__call__`` patched for a
short discovery window, then a wrapper on the root modules only).
With a DDP comm timer (:mod:`gpuprof_shim.comm`), new roots are shown to it
and ``DistributedDataParallel.register_comm_hook`` is replaced (a user's
hook registered inside the profile is wrapped, so it is timed), and so is
``_register_builtin_comm_hook`` (a builtin hook becomes its Python twin,
wrapped the same way).
Originals are recorded exactly as found (the raw class/module dict entry)
and put back on :meth:`TorchPatches.remove`. Only one owner may be
installed per process; nothing is patched at import time. torch is
imported only here, and only by :meth:`TorchPatches.install`.

Every attribute gpuprof replaces anywhere goes through a :class:`PatchSet`
(auto mode's owner here, the trace windows' profiler guard in
:mod:`gpuprof_shim.trace.guard`), so :func:`live_patches` lists all that is still
in place: the tests' leak check asserts it is empty after each test.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuprof_shim.auto.forwards import Tracing
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.auto.wrappers import Wrappers
from gpuprof_shim.comm import CommTimer

log = logging.getLogger("gpuprof.shim")

_owner_lock = threading.Lock()
_owner: TorchPatches | None = None


def _new_lock_in_child() -> None:
    """A fork child gets a fresh lock: one held by another parent thread at
    fork time would otherwise stay held forever in the child."""
    global _owner_lock
    _owner_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


@dataclass
class _Patch:
    target: Any
    name: str
    original: Any
    replacement: Any


def _raw(target: Any, name: str) -> Any:
    """The attribute as stored on *target* itself (no descriptor binding)."""
    return vars(target)[name]


#: Every patch set with patches in place, in this process.
_live_sets: set[PatchSet] = set()
_live_lock = threading.Lock()


class PatchSet:
    """Attributes replaced on classes or modules, put back by :meth:`remove`.

    Args:
        label: who owns it, for warnings and :func:`live_patches`.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self._patches: list[_Patch] = []

    def __bool__(self) -> bool:
        return bool(self._patches)

    def patch(self, target: Any, name: str, replacement: Any) -> Any:
        """Replace ``target.name`` (as stored on *target* itself) with
        *replacement*; returns the original."""
        original = _raw(target, name)
        setattr(target, name, replacement)
        self._patches.append(_Patch(target, name, original, replacement))
        with _live_lock:
            _live_sets.add(self)
        return original

    def names(self) -> list[str]:
        """``"Class.attr"`` of each patch in place."""
        return [f"{getattr(p.target, '__name__', p.target)}.{p.name}" for p in self._patches]

    def remove(self) -> None:
        """Restore every original, newest first; never raises.

        If someone replaced one of ours after us, their replacement stays
        (removing it would break them); the caller switches ours to a
        pass-through.
        """
        while self._patches:
            p = self._patches.pop()
            try:
                if vars(p.target).get(p.name) is p.replacement:
                    setattr(p.target, p.name, p.original)
                else:
                    log.warning(
                        "gpuprof: %s.%s was re-patched by someone else; leaving theirs in place",
                        getattr(p.target, "__name__", p.target),
                        p.name,
                    )
            except Exception:
                log.warning("gpuprof: could not restore %s", p.name, exc_info=True)
        with _live_lock:
            _live_sets.discard(self)


def live_patches() -> list[str]:
    """``"owner: Class.attr"`` for every gpuprof patch still in place."""
    with _live_lock:
        sets = list(_live_sets)
    return [f"{s.label}: {name}" for s in sets for name in s.names()]


class TorchPatches:
    """Installs auto mode's wrappers and hooks for one session; see module doc."""

    def __init__(
        self,
        machine: StepMachine,
        on_loader_iterator: Callable[[Any], None] | None = None,
        comm: CommTimer | None = None,
    ) -> None:
        self.machine = machine
        self.on_loader_iterator = on_loader_iterator
        """Gets each iterator ``DataLoader.__iter__`` returns (worker pids)."""
        self.comm = comm
        """The DDP bucket timer, if any (gets new roots; wraps user comm hooks)."""
        self.wrappers: Wrappers | None = None
        #: Given to the wrappers (see :attr:`Wrappers.prepare_loader`).
        self.prepare_loader: Callable[[Any], Callable[[], None] | None] | None = None
        self._patches = PatchSet("auto mode")
        self._handles: list[Any] = []

    @property
    def installed(self) -> bool:
        forwards = self.wrappers.forwards if self.wrappers is not None else None
        return bool(self._patches or self._handles or (forwards and forwards.enabled))

    def install(self) -> None:
        """Import torch and patch it.

        Raises:
            RuntimeError: another owner's patches are installed.
            ImportError: torch cannot be imported.
        """
        global _owner
        with _owner_lock:
            if _owner is not None:
                raise RuntimeError(
                    "gpuprof: torch is already patched by another auto-mode profile; "
                    "only one may be active per process"
                )
            _owner = self
        try:
            self._install()
        except BaseException:
            self.remove()
            raise

    def _install(self) -> None:
        import torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        module_cls, autograd = torch.nn.Module, torch.autograd
        w = Wrappers(
            self.machine,
            module_cls=module_cls,
            orig_autograd_backward=_raw(autograd, "backward"),
            is_grad_enabled=torch.is_grad_enabled,
            is_compiling=torch.compiler.is_compiling,
            tracing=Tracing.of(torch.compiler),
            on_loader_iterator=self.on_loader_iterator,
        )
        w.prepare_loader = self.prepare_loader
        self.wrappers = w
        comm = self.comm
        if comm is not None:
            w.forwards.on_new_root = comm.on_root
        w.forwards.install()
        # GradScaler.step may skip optimizer.step() (inf/NaN grads): its own
        # call is the optimizer's turn, so a skipped update still ends a step
        scaler_cls = torch.amp.GradScaler
        # a new loader iterator or train()/eval(): look for models not seen yet
        loader_cls = torch.utils.data.DataLoader
        # every DataLoader fetch is timed: loader wait is loading, not the gap
        loader_iter_cls = torch.utils.data.dataloader._BaseDataLoaderIter
        for target, name, replacement in (
            (loader_cls, "__iter__", w.make_loader_iter(_raw(loader_cls, "__iter__"))),
            (loader_iter_cls, "__next__", w.make_loader_next(_raw(loader_iter_cls, "__next__"))),
            (
                module_cls,
                "train",
                w.make_rediscover(_raw(module_cls, "train"), on_mode_change=True),
            ),
            (autograd, "backward", w.autograd_backward),
            (scaler_cls, "step", w.make_scaler_step(_raw(scaler_cls, "step"))),
        ):
            self._patches.patch(target, name, replacement)
        self._handles.append(register_optimizer_step_pre_hook(w.optimizer_pre_hook))
        self._handles.append(register_optimizer_step_post_hook(w.optimizer_post_hook))
        ddp_cls = comm.ddp_class() if comm is not None and comm.enabled else None
        if ddp_cls is not None:
            replacement = comm.make_register_comm_hook(_raw(ddp_cls, "register_comm_hook"))
            self._patches.patch(ddp_cls, "register_comm_hook", replacement)
            if "_register_builtin_comm_hook" in vars(ddp_cls):
                original = _raw(ddp_cls, "_register_builtin_comm_hook")
                twin = comm.make_register_builtin_comm_hook(original, replacement)
                self._patches.patch(ddp_cls, "_register_builtin_comm_hook", twin)

    def remove(self) -> None:
        """Restore every original and remove the hooks; never raises.

        If someone replaced one of our wrappers after us, their replacement
        stays (removing it would break them) and our wrapper, still inside
        their chain, is switched to a pass-through.
        """
        global _owner
        if self.wrappers is not None:
            self.wrappers.enabled = False
            self.wrappers.forwards.on_new_root = None
            self.wrappers.forwards.remove()
        while self._handles:
            handle = self._handles.pop()
            try:
                handle.remove()
            except Exception:
                log.warning("gpuprof: could not remove an optimizer hook", exc_info=True)
        self._patches.remove()
        with _owner_lock:
            if _owner is self:
                _owner = None


def current_owner() -> TorchPatches | None:
    """The installed patch owner, if any (for diagnostics and tests)."""
    return _owner
