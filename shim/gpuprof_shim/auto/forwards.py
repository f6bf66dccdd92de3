"""Auto mode's forward detector: finds each micro-batch's forward (the
outermost call, grad enabled, of a module with parameters) and no-grad
evaluation calls, and feeds them to a :class:`~gpuprof_shim.auto.machine.StepMachine`.

Two modes, so that steady-state training pays almost nothing:

*Discovery* patches ``torch.nn.Module.__call__`` at class level. Every
module call goes through the patch; nested calls take a short fast path.
The outermost calls of modules with parameters are the *roots* (the model,
a ``DistributedDataParallel``, an ``OptimizedModule``...).

*Hooked*: once a discovery window has seen :data:`DISCOVERY_BACKWARDS`
backward calls (or a compiled root is about to run), ``Module.__call__`` is
restored and each root's ``_compiled_call_impl`` (the attribute torch's
``Module.__call__`` calls in place of ``_call_impl`` when set) becomes a
wrapper that times the outermost call around the root's own ``_call_impl``
(its hooks included, e.g. FSDP's all-gather) and that runs even when the
forward raises. No forward hook is added, so every module, the root too,
keeps torch's hook-free fast path. A root compiled in place
(``module.compile()``) has its compiled call wrapped the same way, so
nothing of ours lands in a graph. torch drops the attribute when a module
is pickled or copied: a checkpoint holds nothing of gpuprof.

A new DataLoader iterator (an epoch or a validation pass begins) or a
``Module.train()``/``eval()`` call also starts a window (:meth:`ForwardDetector.rediscover`):
an evaluation-only model first called after the first window (an EMA
copy evaluated at epoch end) is found there, so its time is eval time, not
loader wait. Such a window ends like any other, at the second backward.

A backward that arrives with no root forward seen since the last one means
an unknown root (or a forward outside any module): discovery starts again,
at most :data:`MAX_FRUITLESS` times in a row without finding a new root,
since every switch writes a class attribute of ``nn.Module`` and so
invalidates CPython's type caches.

torch.compile: the patched ``__call__`` first asks whether dynamo is
tracing and then only calls torch's original through a module global, so a
trace that sees it has no graph break and no guard that fails once it is
restored (a closure read while tracing would be guarded). Discovery ends
before a compiled root's first call, so dynamo normally never sees it.

Every call into the machine is guarded: an internal error is logged once
(by the owner's ``internal_error``) and the user's call goes on.

Longer than 500 lines: one detector, whose discovery patch and root wrappers
(closures run on every module call) share its per-thread state and the
module globals dynamo must see; its module walk is :mod:`gpuprof_shim.modwalk`.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from gpuprof_shim.auto.machine import AFTER_BACKWARD as _AFTER_BACKWARD
from gpuprof_shim.auto.machine import IDLE as _IDLE
from gpuprof_shim.auto.machine import OPTIMIZER as _OPTIMIZER
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.modwalk import ModuleWalk

log = logging.getLogger("gpuprof.shim")

#: Backward calls a discovery window sees before it may end (it ends at the
#: next one once a root with grad is known): the first micro-batch's
#: forward, loss and backward, and the next one's, show every root of a step.
DISCOVERY_BACKWARDS = 2
#: A window ends after this many backward calls even if it found no root
#: (a model that is not an ``nn.Module``): the patch costs every module call.
MAX_WINDOW_BACKWARDS = 8
#: Discovery windows in a row that found no new root (e.g. two backward
#: calls per forward) before a backward with no forward stops restarting one.
MAX_FRUITLESS = 2
#: Most roots hooked; further ones are left to the backward fallback.
MAX_ROOTS = 64

# What the outermost call on a thread is doing.
_NONE, _TRAIN, _EVAL, _LOSS = 0, 1, 2, 3
# Root flags, cached per module during discovery.
_NOT_ROOT, _ROOT, _COMPILED_ROOT = 0, 1, 2
#: A root's ``_compiled_call_impl`` was not in its ``__dict__`` (torch's class default).
_ABSENT = object()

#: torch's own ``Module.__call__`` as first found, for calls made while
#: dynamo traces the patch. A module global, not a closure cell: dynamo
#: guards the closures it reads, and that guard would fail (a recompile)
#: once the patch is gone. Set once and never changed, so it can never
#: point into a chain that contains one of our wrappers.
_traced_call: Callable[..., Any] | None = None


class _Depth(threading.local):
    """Per-thread state of root calls: nesting depth (only while another
    thread holds :attr:`ForwardDetector.owner`), what the outermost call
    does (``_TRAIN``, ``_EVAL``...), and when an eval call started (ns)."""

    n = 0
    kind = _NONE
    t_start_ns = 0


_get_ident = threading.get_ident


def _has_parameters(module: Any) -> bool:
    """True if *module* or a submodule holds a parameter (or the tree is too
    big to tell: then it counts). Reads ``_parameters`` directly:
    ``module.parameters()`` costs ~10x more."""
    try:
        walk = ModuleWalk(module)
        for m in walk:
            for p in m._parameters.values():
                if p is not None:
                    return True
        return walk.truncated
    except Exception:  # not a standard Module: let it count
        return True


def _is_script_module(module: Any) -> bool:
    """True for a TorchScript module (``torch.jit.script``): it refuses hooks."""
    jit = sys.modules.get("torch.jit")
    script_module = getattr(jit, "ScriptModule", None)
    return script_module is not None and isinstance(module, script_module)


def _is_compiled(module: Any) -> bool:
    """True if calling *module* enters dynamo: an ``OptimizedModule``
    (``torch.compile(module)``) or a module compiled in place."""
    call = vars(module).get("_compiled_call_impl")
    if call is not None:
        # our root wrapper around torch's own _call_impl is not compiled
        return bool(getattr(call, "_gpuprof_compiled", True))
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return optimized is not None and isinstance(module, optimized)


def _contains_compiled(module: Any) -> bool:
    """True if *module* or a submodule is compiled (see :func:`_is_compiled`)."""
    if "torch._dynamo" not in sys.modules:
        return False  # nothing can have been compiled yet
    try:
        walk = ModuleWalk(module)
        return any(_is_compiled(m) for m in walk) or walk.truncated
    except Exception:
        return True


class _NoFlags:
    """Stands in for ``torch.compiler`` where it has no ``_is_compiling_flag``."""

    _is_compiling_flag = False


class Tracing(NamedTuple):
    """How the wrappers that run every step ask whether torch.compile (or
    export) is tracing them: ``dynamo() or flags._is_compiling_flag``, what
    ``torch.compiler.is_compiling()`` answers (dynamo takes
    ``is_dynamo_compiling()`` as True while it traces, as it takes
    ``is_compiling()``), in one Python frame instead of two."""

    dynamo: Callable[[], bool]
    flags: Any

    @classmethod
    def of(cls, compiler: Any) -> Tracing:
        """The check for the module ``torch.compiler``: its
        ``is_compiling`` alone where it lacks what the faster check reads."""
        dynamo = getattr(compiler, "is_dynamo_compiling", None)
        if dynamo is None or not hasattr(compiler, "_is_compiling_flag"):
            return cls(compiler.is_compiling, _NoFlags)
        return cls(dynamo, compiler)


class ForwardDetector:
    """Discovery patch and per-root wrappers for one session; see the module doc.

    Args:
        machine: receives the events.
        internal_error: logs an internal error (first one loudly).
        module_cls: ``torch.nn.Module``.
        is_grad_enabled: ``torch.is_grad_enabled``.
        is_compiling: ``torch.compiler.is_compiling``.
        tracing: the same question, asked faster by the root wrappers
            (default: *is_compiling* itself).
    """

    def __init__(
        self,
        machine: StepMachine,
        internal_error: Callable[[], None],
        module_cls: Any,
        is_grad_enabled: Callable[[], bool],
        is_compiling: Callable[[], bool],
        tracing: Tracing | None = None,
    ) -> None:
        self.machine = machine
        self.internal_error = internal_error
        self.module_cls = module_cls
        self.is_grad_enabled = is_grad_enabled
        self.is_compiling = is_compiling
        self.tracing = tracing if tracing is not None else Tracing(is_compiling, _NoFlags)
        self.enabled = False
        # Which threads are inside an outermost call. One thread at a time
        # holds ``owner`` (its ident; 0: none): a plain attribute, read and
        # written for every root call, costs a fifth of a thread-local's.
        # Another thread that enters meanwhile is marked in ``depth.n`` (its
        # own), and ``others`` counts such threads.
        self.owner = 0
        self.others = 0
        self._others_lock = threading.Lock()
        self.depth = _Depth()
        self.orig_call: Callable[..., Any] = vars(module_cls)["__call__"]
        self.module_call = self._make_module_call()
        #: Class-level patches made (one per discovery window), for tests and benches.
        self.windows = 0
        self._patched = False
        self._stuck = False  # someone patched over ours: discovery never ends
        self._roots: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._hooked: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
        self._window_backwards = 0
        self._window_new_roots = 0
        self._fruitless = 0
        self._forward_seen = False
        #: Called with each new root when discovery first sees it (before
        #: its call runs; the DDP comm timer looks for DDPs there). Must not raise.
        self.on_new_root: Callable[[Any], None] | None = None

    # --- lifecycle -----------------------------------------------------------

    @property
    def discovering(self) -> bool:
        """True while ``Module.__call__`` is patched."""
        return self._patched

    def hooked_roots(self) -> list[Any]:
        """The modules that carry our wrapper now."""
        return list(self._hooked.keys())

    def install(self) -> None:
        """Start the first discovery window (patches ``Module.__call__``)."""
        global _traced_call
        if _traced_call is None:
            _traced_call = self.orig_call
        self.enabled = True
        _live.add(self)
        self._start_discovery()

    def remove(self) -> None:
        """Restore ``Module.__call__`` and every root's ``_compiled_call_impl``;
        never raises. Afterwards every wrapper is a pass-through."""
        self.enabled = False
        if self._patched:
            self._unpatch()
        for module, undo in list(self._hooked.items()):
            self._unhook(module, undo)
        self._hooked.clear()
        self._roots.clear()
        _live.discard(self)

    def rediscover(self) -> None:
        """Start a discovery window now unless one is open (a new DataLoader
        iterator, ``Module.train()``/``eval()``: a new phase of the loop may
        bring a model not seen yet). Cheap when a window is open."""
        if self.enabled and not self._patched:
            self._start_discovery()

    def on_backward(self) -> None:
        """A backward call starts (outermost, on this thread)."""
        if not self.enabled:
            return
        seen, self._forward_seen = self._forward_seen, False
        if self._patched:
            self._window_backwards += 1
            if self._window_backwards > MAX_WINDOW_BACKWARDS or (
                len(self._roots) and self._window_backwards >= DISCOVERY_BACKWARDS
            ):
                self._end_discovery()
        elif not seen and self._fruitless < MAX_FRUITLESS:
            self._start_discovery()

    # --- discovery -------------------------------------------------------------

    def _start_discovery(self) -> None:
        if self._stuck:
            return
        if vars(self.module_cls).get("__call__") is not self.orig_call:
            log.debug("gpuprof: Module.__call__ was replaced by someone else; no discovery")
            return
        self._window_backwards = 0
        self._window_new_roots = 0
        self.module_cls.__call__ = self.module_call
        self._patched = True
        self.windows += 1

    def _unpatch(self) -> None:
        try:
            if vars(self.module_cls).get("__call__") is self.module_call:
                self.module_cls.__call__ = self.orig_call
                self._patched = False
            else:
                self._stuck = True
                log.warning(
                    "gpuprof: torch.nn.Module.__call__ was re-patched by someone else; "
                    "leaving theirs in place"
                )
        except Exception:
            log.warning("gpuprof: could not restore Module.__call__", exc_info=True)

    def _end_discovery(self) -> None:
        self._unpatch()
        if self._patched:
            return  # someone patched over ours: keep the patch working
        if self._window_new_roots:
            self._fruitless = 0
        else:
            self._fruitless += 1
        for module in list(self._roots.keys()):
            undo = self._hooked.get(module)
            if undo is not None and undo[0] == "call" and not self._still_hooked(module, undo):
                del self._hooked[module]  # compiled in place since (module.compile()): hook again
            if module not in self._hooked and len(self._hooked) < MAX_ROOTS:
                if _is_script_module(module):
                    # TorchScript modules take no Python hooks: their forwards
                    # stay unseen (steps start at the backward)
                    self._hooked[module] = ("none",)
                    continue
                try:
                    self._hooked[module] = self._hook(module)
                except Exception:
                    self.internal_error()

    def _root_flags(self, module: Any) -> int:
        flags = self._roots.get(module)
        if flags is None:
            if not _has_parameters(module):
                return _NOT_ROOT
            flags = _COMPILED_ROOT if _contains_compiled(module) else _ROOT
            if len(self._roots) < MAX_ROOTS:
                self._roots[module] = flags
                self._window_new_roots += 1
                on_new_root = self.on_new_root
                if on_new_root is not None:
                    on_new_root(module)
        return flags

    def _make_module_call(self) -> Callable[..., Any]:
        orig = self.orig_call
        is_compiling = self.is_compiling
        detector = self

        # The first argument must be named ``self`` and no closure variable may
        # be: torch.profiler's Python tracer (``with_stack=True``) takes the
        # frame local ``self`` of ``Module.__call__``'s code as the module and
        # reads its ``_parameters``.
        def module_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if is_compiling():  # dynamo traces this: stay out of its way (module doc)
                return _traced_call(self, *args, **kwargs)  # type: ignore[misc]
            if not detector.enabled or detector.inside():  # a nested submodule call
                return orig(self, *args, **kwargs)
            return detector._outermost(self, args, kwargs)

        module_call.__wrapped__ = orig  # type: ignore[attr-defined]
        return module_call

    def _outermost(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An outermost module call seen by the discovery patch."""
        held = self.claim()
        self.depth.kind = _NONE
        try:
            try:
                flags = self._root_flags(module)
                if flags == _COMPILED_ROOT and self._patched:
                    self._end_discovery()  # dynamo must not trace the patch
                if flags != _NOT_ROOT:
                    self._enter()
                elif self.is_grad_enabled():
                    self.depth.kind = _LOSS  # e.g. a loss module: extends the forward
            except Exception:
                self.internal_error()
            return self.orig_call(module, *args, **kwargs)
        finally:
            self.release(held)
            self._exit()

    # --- which threads are inside an outermost call -----------------------------

    def inside(self) -> bool:
        """True if this thread is inside an outermost module call."""
        owner = self.owner
        if owner and owner == _get_ident():
            return True
        return bool(self.others) and self.depth.n == 1

    def claim(self, me: int = 0) -> int:
        """Mark this thread (ident *me*, read if 0) inside an outermost call;
        it must not be inside one already.

        Returns:
            the token :meth:`release` takes: 1 if it holds :attr:`owner`,
            2 if another thread does (this one is marked in its ``depth``).
        """
        me = me or _get_ident()
        # no call between the test and the store: the GIL changes hands only
        # at calls and backward jumps, so no other thread claims in between
        if not self.owner:
            self.owner = me
            return 1
        with self._others_lock:
            self.others += 1
        self.depth.n = 1
        return 2

    def release(self, held: int) -> None:
        """This thread's outermost call ended; *held* is :meth:`claim`'s token."""
        if held == 1:
            self.owner = 0
        else:
            self.depth.n = 0
            with self._others_lock:
                self.others -= 1

    # --- roots: shared by the discovery patch and the root wrappers -------------

    def _enter(self) -> None:
        """An outermost root call starts (this thread already claimed)."""
        machine = self.machine
        if self.is_grad_enabled():
            self.depth.kind = _TRAIN
            self._forward_seen = True
            if machine.accepts_forward():
                machine.on_forward(machine.clock())
        elif machine.wants_eval():
            self.depth.kind = _EVAL
            self.depth.t_start_ns = machine.clock()

    def _exit(self) -> None:
        """The outermost call ends (returned or raised)."""
        depth = self.depth
        kind, depth.kind = depth.kind, _NONE
        if kind == _NONE:
            return
        try:
            t = self.machine.clock()
            if kind == _EVAL:
                self.machine.on_eval_call(depth.t_start_ns, t)
            else:
                self.machine.on_forward_end(t)
        except Exception:
            self.internal_error()

    def _make_root_call(self, inner: Callable[..., Any], compiled: bool) -> Callable[..., Any]:
        """A root's ``_compiled_call_impl``: :meth:`_enter` and :meth:`_exit`
        around *inner* (the root's own ``_call_impl``, or the call that
        ``module.compile()`` made) for an outermost call, inlined (it runs
        every micro-batch); nested and traced calls go straight to *inner*.

        ``Module._wrapped_call_impl`` calls it in place of ``_call_impl``, so
        the root keeps torch's fast path (no hook makes torch build its hook
        lists), and its own hooks (FSDP's all-gather) run inside the timed
        span. torch leaves it out when the module is pickled or copied
        (``Module.__getstate__``): a checkpoint saved while profiled holds
        nothing of gpuprof, and a copy (an EMA model) is a model of its own
        that discovery finds like any other."""
        detector = self
        machine = self.machine
        clock = machine.clock
        dynamo, flags = self.tracing
        is_grad_enabled = self.is_grad_enabled
        idle, after_backward, optimizer = _IDLE, _AFTER_BACKWARD, _OPTIMIZER

        def root_call(*args: Any, **kwargs: Any) -> Any:
            # traced (a compiled caller), or removed
            if dynamo() or flags._is_compiling_flag or not detector.enabled:
                return inner(*args, **kwargs)
            me = _get_ident()
            owner = detector.owner
            if owner == me:  # nested in another root
                return inner(*args, **kwargs)
            if not owner and not detector.others:  # claim(), inlined
                detector.owner = me
                held = 1
            elif detector.others and detector.depth.n:  # nested, on another thread
                return inner(*args, **kwargs)
            else:
                held = detector.claim(me)
            kind = _NONE
            try:
                if is_grad_enabled():
                    kind = _TRAIN
                    detector._forward_seen = True
                    state = machine.state  # machine.accepts_forward(), inlined
                    if state is idle or state is after_backward or state is optimizer:
                        machine.on_forward(clock(), me)
                elif machine.state is idle:  # machine.wants_eval(), inlined
                    kind = _EVAL
                    t_start = clock()
            except Exception:
                detector.internal_error()
            try:
                return inner(*args, **kwargs)
            finally:
                if held == 1:
                    detector.owner = 0
                else:
                    detector.release(held)
                if kind != _NONE:
                    try:
                        if kind == _TRAIN:
                            machine.on_forward_end(clock())
                        else:
                            machine.on_eval_call(t_start, clock())
                    except Exception:
                        detector.internal_error()

        root_call.__wrapped__ = inner  # type: ignore[attr-defined]
        root_call._gpuprof_compiled = compiled  # type: ignore[attr-defined]
        return root_call

    def _hook(self, module: Any) -> tuple[Any, ...]:
        """Attach to a root; returns what :meth:`_unhook` needs."""
        found = vars(module).get("_compiled_call_impl", _ABSENT)
        compiled = found is not None and found is not _ABSENT
        wrapper = self._make_root_call(found if compiled else module._call_impl, compiled)
        vars(module)["_compiled_call_impl"] = wrapper
        return ("call", found, wrapper)

    @staticmethod
    def _still_hooked(module: Any, undo: tuple[Any, ...]) -> bool:
        return vars(module).get("_compiled_call_impl") is undo[2]

    def _unhook(self, module: Any, undo: tuple[Any, ...]) -> None:
        try:
            if undo[0] == "none" or not self._still_hooked(module, undo):
                return  # TorchScript, or replaced since (module.compile()): not ours
            found = undo[1]
            if found is _ABSENT:
                del vars(module)["_compiled_call_impl"]
            else:
                vars(module)["_compiled_call_impl"] = found
        except Exception:
            log.warning("gpuprof: could not unhook a root module", exc_info=True)


#: Detectors installed and not yet removed (the test suite's leak check reads it).
_live: set[ForwardDetector] = set()


def live_detectors() -> list[ForwardDetector]:
    """Detectors not yet removed (empty when nothing of gpuprof is attached)."""
    return list(_live)
