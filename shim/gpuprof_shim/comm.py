"""Per-bucket timing of DDP's gradient all-reduces: how much of a step waits
on the network, and which rank is late.

In auto mode the session's :class:`CommTimer` registers a gpuprof comm hook
(:class:`CommHook`) on each ``torch.nn.parallel.DistributedDataParallel``
the training uses, once per instance, when the forward detector first sees
it (:meth:`CommTimer.on_root`: a root module's first call, before its first
backward in the profile).

The hook does what DDP's default all-reduce does (scale the bucket by
``1 / process group size``, ``all_reduce`` it asynchronously on
``ddp.process_group``, return a future of the tensor, as torch's
``allreduce_hook``), so training results equal plain DDP's. Per call it
records the bucket index, the launch time (``time.monotonic_ns()`` at hook
entry), the bucket's bytes, and the completion time: a ``fut.then(...)``
callback reads the clock when the collective completes (on gloo that is the
completion). On CUDA tensors a ``torch.cuda.Event(enable_timing=True)`` is
recorded at entry and inside the callback (which runs on a stream ordered
after the collective) and resolved later without synchronizing
(``event.query()``): end = start + the events' elapsed time. Records still
unresolved :data:`HOLD_NS` after their step (or at the profile's end, after
:meth:`CommTimer.settle`) are left out and counted. (No GPU in CI:
the CUDA path is unit-tested with fake event objects.)

``no_sync()`` needs nothing: DDP calls no comm hook then.

User hooks. While a profile is active ``DistributedDataParallel.register_comm_hook``
is patched (by :class:`gpuprof_shim.patches.TorchPatches`): a hook the user
registers is wrapped by a :class:`CommHook` that times it and calls theirs
with their state (``_comm_hooks`` holds the wrapper, named like their hook,
which pickles as their hook); a builtin hook registered inside the profile
(``_register_builtin_comm_hook``, also patched) is registered as its Python
twin in ``default_hooks`` and wrapped the same way. A DDP that already has a hook when found (a
Python one in ``_comm_hooks``, or a builtin one per its logging data's
``comm_hook``) is left alone with one notice (log warning + summary note).

A comm hook can never be unregistered from DDP's reducer: when the profile
ends (:meth:`CommTimer.stop`) every hook becomes a pass-through (the default
all-reduce, or the user's hook) that records nothing. So a hook registered
on such a DDP *after* the profile fails in the reducer ("can only be called
once"), as a second registration always does. A later profile takes over the
hook already there (it times again; a user hook registered inside that
profile is wrapped by it).

Records are attached to steps where the session sends them
(:meth:`CommTimer.attach`): the buckets launched within a step's
``[t0, t1]`` become its ``comm`` and its exposed comm time moves from
``backward`` to the ``comm`` phase (:func:`gpuprof.comm.split_backward`).
A step whose CUDA events have not completed yet (the CPU runs ahead of the
GPU) waits for the next send, up to :data:`HOLD_NS`. Records outside any
step are dropped and counted; at most :data:`MAX_PENDING` wait to be attached.

Nothing here raises into training: hook bookkeeping is guarded, and a
registration the reducer refuses becomes a notice.
"""

from __future__ import annotations

import logging
import operator
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from gpuprof.comm import MAX_BUCKET_BYTES, MAX_BUCKETS_PER_STEP, BucketTiming, split_backward
from gpuprof_shim.modwalk import ModuleWalk
from gpuprof_shim.steps import StepRecord

log = logging.getLogger("gpuprof.shim")

#: Bucket records waiting to be attached to a step (oldest dropped beyond
#: this): DDP's 25 MB buckets make ~280 per step for a 7B model, and steps
#: go out every step or every few steps.
MAX_PENDING = 4096
#: Longest a step waits (ns after its end) for its buckets' CUDA events before
#: it is sent without them: the CPU runs a few steps ahead of the GPU at most,
#: and a live view should not lag more than this.
HOLD_NS = 2_000_000_000
#: At the profile's end, how long (s) the last steps' CUDA events may take.
SETTLE_S = 0.5
#: Most DDP instances timed in one profile.
MAX_DDPS = 64


#: Every DDP carrying a gpuprof hook (on its reducer for good), by any profile
#: of this process: a later profile takes the hook over instead of failing to
#: register a second one.
_ddp_hooks: weakref.WeakKeyDictionary[Any, CommHook] = weakref.WeakKeyDictionary()


class _Record:
    """One bucket's collective being timed: ``end_ns`` is set by the
    future's callback (wall clock), or resolved from CUDA events."""

    __slots__ = ("bucket", "start_ns", "end_ns", "nbytes", "ev_start", "ev_end")

    def __init__(self, bucket: int, start_ns: int, nbytes: int, ev_start: Any) -> None:
        self.bucket = bucket
        self.start_ns = start_ns
        self.end_ns: int | None = None
        self.nbytes = nbytes
        self.ev_start = ev_start
        self.ev_end: Any = None

    def resolve(self) -> BucketTiming | None:
        """The finished timing, or None while its collective (its CUDA
        events) has not completed. Never synchronizes."""
        if self.ev_start is None:
            end = self.end_ns
        else:
            ev_end = self.ev_end
            if ev_end is None or not (self.ev_start.query() and ev_end.query()):
                return None
            ms = self.ev_start.elapsed_time(ev_end)
            end = self.start_ns + max(0, int(ms * 1_000_000))
        if end is None:
            return None
        return BucketTiming(self.bucket, self.start_ns, max(end, self.start_ns), self.nbytes)


def _first_value(fut: Any) -> Any:
    """A ``then`` callback: the tensor of an all-reduce's future."""
    return fut.value()[0]


class CommHook:
    """The comm hook gpuprof registers on one DDP (see the module doc).

    Args:
        timer: the session's timer (records go there while it records).
        process_group: ``ddp.process_group`` (the DDP itself is not held: the
            reducer keeps the hook alive and must not keep the DDP alive).
        user_hook: the user's hook this one wraps, or None for the default
            all-reduce.
        user_state: the user's state, passed to *user_hook*.

    Its second parameter is named ``bucket`` (DDP's ``_check_comm_hook``);
    parameters are unannotated (DDP compares annotations with its types).
    """

    def __init__(
        self,
        timer: CommTimer,
        process_group: Any,
        user_hook: Callable[..., Any] | None = None,
        user_state: Any = None,
    ) -> None:
        self.timer = timer
        self.process_group = process_group
        self.user_hook: Callable[..., Any] | None = None
        self.user_state: Any = None
        self.__name__ = self.__qualname__ = "gpuprof_allreduce_hook"
        if user_hook is not None:
            self.wrap(user_hook, user_state)

    def wrap(self, user_hook: Callable[..., Any], user_state: Any) -> None:
        """Call *user_hook* (with *user_state*) instead of the default all-reduce."""
        self.user_state = user_state
        self.__name__ = getattr(user_hook, "__name__", type(user_hook).__name__)
        self.__qualname__ = getattr(user_hook, "__qualname__", self.__name__)
        self.user_hook = user_hook

    def __call__(self, state, bucket):  # unannotated: DDP's _check_comm_hook compares them
        user = self.user_hook
        if isinstance(bucket, tuple):  # DDP's Python reducer: (grad, param), in place
            if user is not None:
                return user(self.user_state, bucket)
            return self._python_reducer_allreduce(bucket)
        timer = self.timer
        rec = timer.begin(bucket) if timer.recording else None
        if user is not None:
            fut = user(self.user_state, bucket)
            if rec is None or not callable(getattr(fut, "then", None)):
                return fut  # not a future: DDP refuses it as without gpuprof
            return fut.then(timer.done_callback(rec, first=False))
        fut = self._allreduce(bucket.buffer())
        return fut.then(_first_value if rec is None else timer.done_callback(rec, first=True))

    def _allreduce(self, tensor: Any) -> Any:
        """DDP's default: scale by 1/size (as the reducer does while copying
        gradients into the bucket: ``mul`` by ``1/size``, not ``div``), sum."""
        import torch.distributed as dist

        pg = self.process_group
        if pg is None:
            pg = dist.group.WORLD
        size = pg.size()
        if size != 1:
            tensor.mul_(1.0 / size)
        return dist.all_reduce(tensor, group=pg, async_op=True).get_future()

    def _python_reducer_allreduce(self, bucket: tuple[Any, ...]) -> None:
        """What DDP does per parameter without a hook in its Python reducer."""
        import torch.distributed._functional_collectives as fcol

        grad = bucket[0]
        gradient = grad / self.process_group.size()
        grad.copy_(fcol.all_reduce(gradient, "sum", self.process_group))

    def __reduce__(self) -> Any:
        """Pickles (a whole DDP saved with ``torch.save``) as the user's hook,
        with the standard library only; the default hook is never stored on
        the DDP, but pickles as an inert stand-in all the same."""
        if self.user_hook is not None:
            return (operator.itemgetter(0), ((self.user_hook,),))
        return (operator.itemgetter(0), ((None,),))


class CommTimer:
    """The session's bucket timer; see the module docstring.

    Args:
        enabled: time buckets (``profile(time_comm=...)``); False: only
            report DDPs found (*on_ddp*), register nothing.
        on_ddp: called (no arguments, must not raise) when the first DDP is
            found: the session starts clock alignment then.
        clock: ``time.monotonic_ns``.
        max_pending: records kept waiting for their step.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        on_ddp: Callable[[], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.enabled = bool(enabled)
        self.on_ddp = on_ddp
        self.clock = clock
        #: Hooks run and record (False after :meth:`stop`: pass-through).
        self.recording = self.enabled
        #: Summary notes (one per distinct notice).
        self.notes: list[str] = []
        #: Records dropped: launched outside any step, or over the bound.
        self.dropped = 0
        #: Records left out because their CUDA events had not completed.
        self.unresolved = 0
        #: Bucket timings attached to steps.
        self.attached = 0
        self._records: deque[_Record] = deque()
        self._max = max(1, int(max_pending))
        self._lock = threading.Lock()
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._hooks: weakref.WeakKeyDictionary[Any, CommHook] = weakref.WeakKeyDictionary()
        self._errors = 0

    # --- DDP discovery ---------------------------------------------------------

    @staticmethod
    def ddp_class() -> Any:
        """``DistributedDataParallel`` if torch.distributed works here, else None."""
        try:
            import torch.distributed as dist

            if not dist.is_available():
                return None
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel
        except Exception:
            return None

    def on_root(self, module: Any) -> None:
        """The forward detector found a new root: time every DDP in it not
        seen yet (the root, a compiled root's original, or a submodule).
        Never raises."""
        try:
            dist = sys.modules.get("torch.distributed")
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return  # no process group: no DDP can exist
            ddp_cls = self.ddp_class()
            if ddp_cls is None:
                return
            for ddp in _find_ddps(module, ddp_cls):
                if ddp not in self._seen and len(self._seen) < MAX_DDPS:
                    self._seen.add(ddp)
                    self._on_new_ddp(ddp)
        except Exception:
            self._internal_error()

    def _on_new_ddp(self, ddp: Any) -> None:
        on_ddp, self.on_ddp = self.on_ddp, None
        if on_ddp is not None:
            try:
                on_ddp()
            except Exception:
                log.debug("gpuprof: DDP callback failed", exc_info=True)
        if not self.enabled or not self.recording or ddp in self._hooks:
            return  # off, over, or its user hook was registered (wrapped) inside the profile
        ours = _ddp_hooks.get(ddp)
        if ours is not None:  # an earlier profile's hook, a pass-through on the reducer
            ours.timer = self
            self._hooks[ddp] = ours
            return
        existing = _existing_hook(ddp)
        if existing is not None:
            self.notice(
                f"DDP comm hook {existing} was registered before the profile; "
                "gradient bucket timing skipped for that model: register it inside "
                "`with gpuprof.profile(...)` to time its buckets"
            )
            return
        try:
            import torch.distributed as dist

            hook = CommHook(self, ddp.process_group)
            dist._register_comm_hook(ddp.reducer, None, hook)
            self._hooks[ddp] = _ddp_hooks[ddp] = hook
        except Exception as exc:
            self.notice(
                f"could not time DDP gradient buckets ({type(exc).__name__}: {str(exc)[:200]})"
            )

    def make_register_comm_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The replacement of ``DistributedDataParallel.register_comm_hook``
        while the profile is active: the user's hook is wrapped (timed)."""
        timer = self

        def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
            if not timer.recording:
                return original(self, state, hook)
            self._check_comm_hook(hook)  # their invalid hook fails as without gpuprof
            ours = _ddp_hooks.get(self)
            if ours is not None:
                if ours.user_hook is not None:
                    return original(self, state, hook)  # a second hook: the reducer refuses it
                # ours is on the reducer already (this profile's first forward, or an
                # earlier profile's): it calls theirs from now on
                ours.timer = timer
                ours.wrap(hook, state)
                timer._hooks[self] = ours
                self._comm_hooks.append((ours, state))
                if getattr(self, "logger", None) is not None:
                    self.logger._set_comm_hook_name(getattr(hook, "__qualname__", ours.__name__))
                return None
            try:
                wrapper = CommHook(timer, self.process_group, hook, state)
            except Exception:
                timer._internal_error()
                return original(self, state, hook)
            original(self, state, wrapper)  # the reducer's refusal is theirs to see
            timer._hooks[self] = _ddp_hooks[self] = wrapper  # found later: nothing to do
            return None

        register_comm_hook.__wrapped__ = original  # type: ignore[attr-defined]
        register_comm_hook.__name__ = getattr(original, "__name__", "register_comm_hook")
        register_comm_hook.__qualname__ = getattr(original, "__qualname__", "register_comm_hook")
        register_comm_hook.__doc__ = getattr(original, "__doc__", None)
        return register_comm_hook

    def make_register_builtin_comm_hook(
        self, original: Callable[..., Any], register: Callable[..., Any]
    ) -> Callable[..., Any]:
        """The replacement of ``DistributedDataParallel._register_builtin_comm_hook``
        while the profile is active: a builtin hook (``ALLREDUCE``,
        ``FP16_COMPRESS``) is registered as its Python twin in
        ``default_hooks`` (the same arithmetic) through *register* (the
        replacement of ``register_comm_hook``), so it is timed, and it works
        after the model's first forward, when gpuprof's hook is on the reducer
        already: the builtin one would then be refused ("can only be called
        once"), raising in code that works without gpuprof."""
        timer = self

        def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
            twin = _builtin_twin(comm_hook_type) if timer.recording else None
            if twin is None:
                return original(self, comm_hook_type)
            register(self, self.process_group, twin)
            logger = getattr(self, "logger", None)
            if logger is not None:
                logger._set_comm_hook_name(str(comm_hook_type))
            return None

        name = "_register_builtin_comm_hook"
        _register_builtin_comm_hook.__wrapped__ = original  # type: ignore[attr-defined]
        _register_builtin_comm_hook.__name__ = getattr(original, "__name__", name)
        _register_builtin_comm_hook.__qualname__ = getattr(original, "__qualname__", name)
        _register_builtin_comm_hook.__doc__ = getattr(original, "__doc__", None)
        return _register_builtin_comm_hook

    def stop(self) -> None:
        """The profile ends: hooks become pass-throughs; records already
        made can still be attached."""
        self.recording = False

    def close(self) -> None:
        """After the last steps were sent: forget what is left (the hooks
        keep this timer alive as long as their DDPs live)."""
        self.recording = False
        self.on_ddp = None
        with self._lock:
            self._records.clear()

    def notice(self, text: str) -> None:
        """Log *text* once and keep it for the run summary."""
        if text not in self.notes:
            self.notes.append(text)
            log.warning("gpuprof: %s", text)

    def summary_notes(self) -> list[str]:
        """Notes for the run summary: notices, and records left out."""
        notes = list(self.notes)
        if self.unresolved:
            notes.append(
                f"{self.unresolved} DDP bucket timing{'s' if self.unresolved > 1 else ''} "
                "left out (CUDA events not complete 2 s after their step, or at the end)"
            )
        return notes

    # --- the hook's records ------------------------------------------------------

    def begin(self, bucket: Any) -> _Record | None:
        """A bucket's collective is launched now; None if it cannot be timed."""
        try:
            start = self.clock()
            buf = bucket.buffer()
            nbytes = buf.numel() * buf.element_size()
            ev = self.new_event() if getattr(buf, "is_cuda", False) else None
            rec = _Record(int(bucket.index()), start, nbytes, ev)
            with self._lock:
                if len(self._records) >= self._max:
                    self._records.popleft()
                    self.dropped += 1
                self._records.append(rec)
            return rec
        except Exception:
            self._internal_error()
            return None

    def new_event(self) -> Any:
        """A timing CUDA event recorded on the current stream (for a bucket
        on a GPU; tests replace this with a fake)."""
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def done_callback(self, rec: _Record, *, first: bool) -> Callable[[Any], Any]:
        """The ``then`` callback of *rec*'s future: note the completion, then
        hand the value on (the tensor; ``first``: the all-reduce's list's first)."""
        clock = self.clock

        def done(fut: Any) -> Any:
            try:
                rec.end_ns = clock()
                if rec.ev_start is not None:
                    rec.ev_end = self.new_event()
            except Exception:
                self._internal_error()
            value = fut.value()
            return value[0] if first else value

        return done

    def attach(
        self, steps: list[StepRecord], *, now_ns: int | None = None, final: bool = False
    ) -> int:
        """Give each step (in order, replaced in *steps*) the buckets launched within its
        ``[t0, t1]`` and its ``comm`` phase; drop (and count) older records
        outside every step; keep those launched after the last step.

        Returns how many leading steps are ready to send. A step with a
        record whose CUDA events have not completed is not ready: it and the
        steps after it wait for the next send, for at most :data:`HOLD_NS`
        after the step's end (by *now_ns*); then, or when *final*, it goes
        without those records (counted in :attr:`unresolved`).
        """
        if not self._records:
            return len(steps)  # no DDP timed (most runs): nothing to attach
        now = self.clock() if now_ns is None else now_ns
        for k, step in enumerate(steps):
            with self._lock:
                records = self._records
                taken: list[_Record] = []
                while records and records[0].start_ns <= step.t1:
                    taken.append(records.popleft())
            timings: list[BucketTiming] = []
            late: list[_Record] = []
            for rec in taken:
                if rec.start_ns < step.t0:
                    self.dropped += 1  # launched between steps
                    continue
                try:
                    timing = rec.resolve()
                except Exception:
                    timing = None
                if timing is None:
                    late.append(rec)
                elif (
                    0 <= timing.bucket < MAX_BUCKETS_PER_STEP and timing.nbytes <= MAX_BUCKET_BYTES
                ):
                    timings.append(timing)
            if late and not final and now - step.t1 < HOLD_NS:
                with self._lock:  # back in front, in order: the next send tries again
                    self._records.extendleft(reversed([r for r in taken if r.start_ns >= step.t0]))
                return k
            self.unresolved += len(late)
            if timings:
                timings = timings[:MAX_BUCKETS_PER_STEP]
                steps[k] = step._replace(comm=timings, phases=split_backward(step.phases, timings))
                self.attached += len(timings)
        return len(steps)

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """At the profile's end: give records whose CUDA events are still
        running up to *timeout_s* to complete (polling, never synchronizing)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                waiting = [r for r in self._records if r.ev_start is not None]
            try:
                if all(r.resolve() is not None for r in waiting):
                    return
            except Exception:
                return
            time.sleep(0.002)

    def pending(self) -> int:
        """Records waiting for their step."""
        return len(self._records)

    def _internal_error(self) -> None:
        self._errors += 1
        if self._errors == 1:
            log.warning("gpuprof: internal error in DDP bucket timing", exc_info=True)
        else:
            log.debug("gpuprof: internal error in DDP bucket timing", exc_info=True)


def _builtin_twin(comm_hook_type: Any) -> Callable[..., Any] | None:
    """The ``default_hooks`` function doing what builtin comm hook
    *comm_hook_type* does (C++ ``AllReduceCommHook``: divide, all-reduce;
    ``FP16CompressCommHook``: to fp16, divide, all-reduce, copy back), or
    None for another type or when they cannot be imported."""
    try:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        kinds = dist.BuiltinCommHookType
        if comm_hook_type == kinds.ALLREDUCE:
            return default_hooks.allreduce_hook
        if comm_hook_type == kinds.FP16_COMPRESS:
            return default_hooks.fp16_compress_hook
    except Exception:
        return None
    return None


def _existing_hook(ddp: Any) -> str | None:
    """The name of the comm hook *ddp* has already, or None."""
    hooks = getattr(ddp, "_comm_hooks", None)
    if hooks:
        hook = hooks[0][0]
        return repr(getattr(hook, "__qualname__", type(hook).__name__))
    try:
        builtin = ddp._get_ddp_logging_data().get("comm_hook")
    except Exception:
        builtin = None
    if builtin:
        return repr(str(builtin))
    return None


def _find_ddps(root: Any, ddp_cls: Any) -> Iterable[Any]:
    """The DDP instances in *root*: itself or its submodules (a compiled
    module's ``_orig_mod`` is one), not looking inside a DDP."""
    walk = ModuleWalk(root, descend=lambda m: not isinstance(m, ddp_cls))
    return [m for m in walk if isinstance(m, ddp_cls)]
