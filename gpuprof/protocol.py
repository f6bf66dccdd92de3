"""The wire protocol between the shim (in the training process) and gpuprofd.

Transport: ZeroMQ over ``ipc://``. Data events (``step``, ``mark``, ``workers``,
``loaders``, ``kernels``, ``model_info``, ``clock``, ``stacks``) go shim
``PUSH`` → daemon ``PULL``, alone or many of one run in one ``batch``
message (see :func:`decode_events`); requests (``hello``, ``bye``, ``ping``; and
``stop`` from gpuprofctl) go ``REQ`` → daemon ``ROUTER`` and always get one
JSON reply.

Every message is one orjson-encoded object with ``v`` (protocol version) and
``type``. Times are ``time.monotonic_ns()`` of the node (ranks on one node
share ``CLOCK_MONOTONIC``); ``hello`` also carries a wall-clock anchor.
Durations are integer nanoseconds (fields ending in ``_ns`` or the step's
``t0``/``t1``/``wait`` and phase values).

This module is pure: no sockets, no I/O. :func:`decode` is the daemon's
gate: it raises :class:`ProtocolError` with a short, countable ``reason`` for
anything malformed, oversized, of another version or of an unknown type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gpuprof.comm import wire_rows as _comm_rows
from gpuprof.evidence import report_problem as _evidence_report_problem
from gpuprof.evidence import tag_problem as _evidence_tag_problem
from gpuprof.flops import arch_problem
from gpuprof.kernels import KERNEL_CLASSES, KINDS, MAX_NAME_CHARS, MAX_ROWS, SOURCES
from gpuprof.labels import MAX_PROJECT_CHARS, tags_ok
from gpuprof.text import clean_text, is_printable

PROTOCOL_VERSION = 1

#: Largest message the daemon accepts (bytes). A step event is ~250 bytes; a
#: hello with options well under 4 KiB. A ``kernels`` window is the big one:
#: :data:`gpuprof.kernels.MAX_ROWS` rows of names up to
#: :data:`gpuprof.kernels.MAX_NAME_CHARS` characters are ~160 KiB of ASCII at
#: worst (templated CUDA names are often 200+ characters), so 256 KiB.
MAX_MESSAGE_BYTES = 256 * 1024

#: Longest run name kept (characters); longer names are cut by the shim.
MAX_RUN_NAME_CHARS = 200
#: A ``hello``'s ``group`` (torchrun's run id, or ``profile(group=...)``).
MAX_GROUP_CHARS = 128
MAX_PHASES = 32
MAX_PHASE_NAME_CHARS = 64
#: Optimizers listed per step (a GAN has 2; more is unusual).
MAX_OPTIMIZERS = 16
MAX_ERROR_CHARS = 2000
#: Longest step, loader wait or phase accepted (ns): 7 days. Nothing real is
#: longer, and the bound keeps sums over a run far from int64 overflow.
MAX_DURATION_NS = 7 * 86_400 * 10**9
#: Largest torch allocator figure accepted in a step's ``mem`` (bytes): 16 TiB,
#: far above any one device (an H200 has 141 GB, a B300 288 GB), and far
#: below int64, so a garbage value cannot pass as a reading.
MAX_MEMORY_BYTES = 1 << 44

#: The phase that carries loader time spent inside a step (between
#: micro-batches); the shim writes it, the rules and ``gpuprofctl runs`` read it.
DATA_PHASE = "data"
#: The phase that carries gpuprof's own time inside a step (the shim sending
#: a burst of events); rules take it out of step compute time.
OWN_TIME_PHASE = "gpuprof"

#: DataLoader worker processes listed per ``workers`` event (one loader
#: iterator's pool); torch caps nothing, but no host has 1024 cores to feed.
MAX_WORKERS = 1024
#: DataLoader settings listed per ``loaders`` event (a train and an eval
#: loader, a few more; later ones are not reported).
MAX_LOADERS = 8
#: Largest ``prefetch_factor`` accepted (torch's default is 2).
MAX_PREFETCH_FACTOR = 1 << 16
#: Largest pid accepted (Linux ``pid_max`` is at most 2**22; 2**31 as ``hello``).
MAX_PID = 2**31

#: Step indices listed per ``kernels`` window (a continuous window of a run
#: with 1 ms steps at 1 Hz covers ~1000; a snapshot one or a few).
MAX_WINDOW_STEPS = 4096
#: Largest launch/call count of one row in one window.
MAX_KERNEL_COUNT = 1 << 40
#: Largest FLOP figure of one row (an exaFLOP/s machine for a week is ~6e23).
MAX_ROW_FLOPS = 1e30

DATA_TYPES = frozenset(
    {"step", "mark", "workers", "loaders", "kernels", "model_info", "clock", "stacks"}
)
#: The data message that carries many data events of one run (a burst of
#: steps): one ZeroMQ send and one decode instead of one per event.
BATCH_TYPE = "batch"
#: Most events in one ``batch``. The shim sends bursts of 64 steps; a step
#: is ~250 bytes, so 1024 of them stay well inside :data:`MAX_MESSAGE_BYTES`
#: unless they carry comm rows (then the byte bound decides).
MAX_BATCH_EVENTS = 1024
CONTROL_TYPES = frozenset({"hello", "bye", "ping", "stop", "ack"})
#: Largest shim sequence number (``batch``'s ``seq``): a message a ms for 10^5 years.
MAX_SEQ = 1 << 62
RUN_STATUSES_AT_BYE = frozenset({"finished", "failed"})

_RUN_KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_INT64_MAX = 2**63 - 1


class ProtocolError(ValueError):
    """A message that breaks the protocol. ``reason`` is a short stable key
    (``oversized``, ``not_json``, ``not_object``, ``bad_version``,
    ``unknown_type``, ``wrong_channel``, ``bad_field:<name>``) used to count drops."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def encode(msg: Mapping[str, Any]) -> bytes:
    """Encode one message (a mapping with ``v`` and ``type``) to bytes."""
    return orjson.dumps(msg)


def clean_run_name(name: object) -> str:
    """Make any user-supplied run name safe to store and show.

    Unprintable characters become spaces (see :func:`clean_text`),
    surrounding blanks are stripped, the result is cut to
    :data:`MAX_RUN_NAME_CHARS`; an empty name becomes ``"unnamed"``.
    HTML/SQL escaping is still the job of whoever renders or queries it;
    this only guarantees a printable, bounded, UTF-8-encodable string.
    """
    text = clean_text(name, 4 * MAX_RUN_NAME_CHARS).strip()[:MAX_RUN_NAME_CHARS]
    return text or "unnamed"


# --- field checks -----------------------------------------------------------

Check = Callable[[Any], bool]


def _int(lo: int = 0, hi: int = _INT64_MAX) -> Check:
    return lambda x: type(x) is int and lo <= x <= hi


def _str(max_chars: int, pattern: re.Pattern[str] | None = None) -> Check:
    def check(x: Any) -> bool:
        if type(x) is not str or not x or len(x) > max_chars:
            return False
        return pattern.match(x) is not None if pattern else True

    return check


def _printable(max_chars: int) -> Check:
    base = _str(max_chars)
    return lambda x: base(x) and is_printable(x)


def _optional(check: Check) -> Check:
    return lambda x: x is None or check(x)


def _bool(x: Any) -> bool:
    return type(x) is bool


def _phases(x: Any) -> bool:
    if type(x) is not dict or len(x) > MAX_PHASES:
        return False
    for k, v in x.items():  # a loop, not all(): every step row has one (team-server ingest)
        if type(v) is not int or not 0 <= v <= MAX_DURATION_NS:
            return False
        if k not in _GOOD_PHASE_NAMES:
            if not _PHASE_NAME_OK(k):
                return False
            if len(_GOOD_PHASE_NAMES) < _GOOD_PHASE_NAMES_KEPT:
                _GOOD_PHASE_NAMES.add(k)
    return True


_PHASE_NAME_OK = _printable(MAX_PHASE_NAME_CHARS)
#: Phase names already found good: the same few recur in every step.
_GOOD_PHASE_NAMES: set[str] = set()
_GOOD_PHASE_NAMES_KEPT = 1024
_OPTIMIZER_FIELDS = frozenset({"name", "updates", "skipped", "ns"})


def _optimizers(x: Any) -> bool:
    if type(x) is not list or len(x) > MAX_OPTIMIZERS:
        return False
    name_ok, count_ok, ns_ok = (
        _printable(MAX_PHASE_NAME_CHARS),
        _int(0, 1 << 20),
        _int(0, MAX_DURATION_NS),
    )
    return all(
        type(o) is dict
        and o.keys() == _OPTIMIZER_FIELDS
        and name_ok(o["name"])
        and count_ok(o["updates"])
        and count_ok(o["skipped"])
        and ns_ok(o["ns"])
        for o in x
    )


_WORKER_FIELDS = frozenset({"worker_id", "pid"})


def _workers(x: Any) -> bool:
    """1..:data:`MAX_WORKERS` ``{"worker_id", "pid"}`` entries, ids and pids unique."""
    if type(x) is not list or not 0 < len(x) <= MAX_WORKERS:
        return False
    id_ok, pid_ok = _int(0, MAX_WORKERS - 1), _int(1, MAX_PID)
    if not all(
        type(w) is dict
        and w.keys() == _WORKER_FIELDS
        and id_ok(w["worker_id"])
        and pid_ok(w["pid"])
        for w in x
    ):
        return False
    return len({w["worker_id"] for w in x}) == len(x) == len({w["pid"] for w in x})


_LOADER_FIELDS = frozenset({"num_workers", "persistent_workers", "pin_memory", "prefetch_factor"})


def _loaders(x: Any) -> bool:
    """1..:data:`MAX_LOADERS` DataLoader settings, each exactly
    ``{"num_workers": 0..MAX_WORKERS, "persistent_workers": bool,
    "pin_memory": bool, "prefetch_factor": None | 1..MAX_PREFETCH_FACTOR}``
    (None exactly when ``num_workers`` is 0, as torch has it)."""
    if type(x) is not list or not 0 < len(x) <= MAX_LOADERS:
        return False
    workers_ok, prefetch_ok = _int(0, MAX_WORKERS), _int(1, MAX_PREFETCH_FACTOR)
    return all(
        type(d) is dict
        and d.keys() == _LOADER_FIELDS
        and workers_ok(d["num_workers"])
        and type(d["persistent_workers"]) is bool
        and type(d["pin_memory"]) is bool
        and (
            d["prefetch_factor"] is None
            if d["num_workers"] == 0
            else prefetch_ok(d["prefetch_factor"])
        )
        for d in x
    )


def _mem(x: Any) -> bool:
    """``[allocated, reserved, peak]``: three ints, 0..:data:`MAX_MEMORY_BYTES`.
    Their order (allocated ≤ peak, allocated ≤ reserved) is not checked: a
    sender that reads them one by one races other threads' allocations."""
    return type(x) is list and len(x) == 3 and all(_int(0, MAX_MEMORY_BYTES)(v) for v in x)


def _flops(x: Any) -> bool:
    """FLOP per step: a positive number below 1e30 (``nan`` fails both bounds)."""
    return type(x) in (int, float) and 0 < x < 1e30


def _options(x: Any) -> bool:
    """``hello`` options: ``flops_per_step`` (FLOP), ``dtype``, ``arch`` (a
    :meth:`gpuprof.flops.TransformerArch.to_dict`), ``tokens_per_step``,
    ``samples_per_step``, ``flops_source`` (``"user"`` or ``"arch"``), ``count_flops`` (bool)."""
    if type(x) is not dict or len(x) > 32:
        return False
    flops = x.get("flops_per_step")
    if flops is not None and not _flops(flops):
        return False
    if x.get("arch") is not None and arch_problem(x["arch"]) is not None:
        return False
    for count in ("tokens_per_step", "samples_per_step"):
        if x.get(count) is not None and not _int(1, 1 << 40)(x[count]):
            return False
    if x.get("flops_source") not in (None, "user", "arch"):
        return False
    if x.get("count_flops") is not None and not _bool(x["count_flops"]):
        return False
    dtype = x.get("dtype")
    return dtype is None or _printable(32)(dtype)


def _model_info(msg: Mapping[str, Any]) -> bool:
    """A ``model_info`` event says something: a dtype or counted FLOPs."""
    return "dtype" in msg or "flops_counted" in msg


def _kernel_row(row: Any) -> bool:
    """One :meth:`gpuprof.kernels.KernelAgg.to_wire` row: ``[name, kind, cls,
    count, total_ns, self_ns, flops]`` with a printable name of at most
    :data:`~gpuprof.kernels.MAX_NAME_CHARS`, kind and class from the contract's
    sets, counts and ns in range, ``self_ns <= total_ns``, flops None or a
    finite number in ``[0, MAX_ROW_FLOPS]``."""
    if type(row) is not list or len(row) != 7:
        return False
    name, kind, cls, count, total_ns, self_ns, flops = row
    ns_ok = _int(0, MAX_DURATION_NS)
    return (
        _printable(MAX_NAME_CHARS)(name)
        and kind in KINDS
        and cls in KERNEL_CLASSES
        and _int(0, MAX_KERNEL_COUNT)(count)
        and ns_ok(total_ns)
        and ns_ok(self_ns)
        and self_ns <= total_ns
        and (flops is None or (type(flops) in (int, float) and 0 <= flops <= MAX_ROW_FLOPS))
    )


def _kernel_rows(x: Any) -> bool:
    """At most :data:`~gpuprof.kernels.MAX_ROWS` valid rows (see :func:`_kernel_row`)."""
    return type(x) is list and len(x) <= MAX_ROWS and all(_kernel_row(r) for r in x)


def _window_steps(x: Any) -> bool:
    """At most :data:`MAX_WINDOW_STEPS` step indices (ints, 0..2**40)."""
    ok = _int(0, 1 << 40)
    return type(x) is list and len(x) <= MAX_WINDOW_STEPS and all(ok(i) for i in x)


#: Where a ``stacks`` event's samples were taken: the training thread
#: between its phases, or the DataLoader worker processes.
STACK_SOURCES = frozenset({"main", "loader"})
#: Rows per ``stacks`` event: each is ≤ ~1.3 KB at the bounds below, so 128
#: rows stay well inside :data:`MAX_MESSAGE_BYTES`; the shim sends more
#: events when it has more.
MAX_STACK_ROWS = 128
#: A frame's file path (PATH_MAX is 4096; real source paths are far shorter).
MAX_STACK_PATH_CHARS = 1024
#: A function's name, or the qualified library call it was in.
MAX_STACK_NAME_CHARS = 256
#: Samples one row may count since the last event (100 Hz for 7 days is 6e7).
MAX_STACK_COUNT = 1 << 32


def _stack_row(row: Any) -> bool:
    """``[path, line, function, call, step, count]``: a printable path and
    function, a line 0..2**24, *call* ``""`` (the sample was in the user
    frame itself) or a printable qualified name, a step 0..2**40 and a
    count 1..:data:`MAX_STACK_COUNT`."""
    if type(row) is not list or len(row) != 6:
        return False
    path, line, function, call, step, count = row
    return (
        _printable(MAX_STACK_PATH_CHARS)(path)
        and _int(0, 1 << 24)(line)
        and _printable(MAX_STACK_NAME_CHARS)(function)
        and (call == "" or _printable(MAX_STACK_NAME_CHARS)(call))
        and _int(0, 1 << 40)(step)
        and _int(1, MAX_STACK_COUNT)(count)
    )


def _stack_rows(x: Any) -> bool:
    """1..:data:`MAX_STACK_ROWS` valid rows (see :func:`_stack_row`)."""
    return type(x) is list and 0 < len(x) <= MAX_STACK_ROWS and all(_stack_row(r) for r in x)


_RUN_KEY = _str(64, _RUN_KEY_RE)

#: type -> {field: (required, check)}
SCHEMAS: dict[str, dict[str, tuple[bool, Check]]] = {
    "hello": {
        "run_key": (True, _RUN_KEY),
        "run_name": (True, _printable(MAX_RUN_NAME_CHARS)),
        "pid": (True, _int(1, 2**31)),
        "host": (True, _printable(255)),
        "rank": (True, _int(0, 1 << 20)),
        "local_rank": (True, _int(0, 1 << 20)),
        "world_size": (True, _int(1, 1 << 20)),
        # ranks on this node (torchrun's LOCAL_WORLD_SIZE)
        "local_world_size": (False, _int(1, 1 << 20)),
        # the group the rank belongs to (TORCHELASTIC_RUN_ID or group=);
        # absent: the run is its own group
        "group": (False, _optional(_printable(MAX_GROUP_CHARS))),
        "wall_ns": (True, _int()),
        "mono_ns": (True, _int()),
        "auto": (True, _bool),
        "options": (True, _options),
        "cuda_uuid": (False, _optional(_printable(128))),
        "argv": (False, _optional(_str(1000))),
        # the training process's PID namespace (``/proc/self/ns/pid`` link):
        # its pid means nothing to a daemon in another namespace (containers)
        "pid_ns": (False, _optional(_printable(64))),
        # the team server the run asks to be forwarded to (GPUPROF_SERVER,
        # profile(server=)): the daemon says in the summary when it does not
        "server": (False, _optional(_printable(1000))),
        # who trains (the login name), for the team server's user filter
        "user": (False, _optional(_printable(64))),
        # the project the run counts to and its tags (gpuprof.labels)
        "project": (False, _optional(_printable(MAX_PROJECT_CHARS))),
        "tags": (False, _optional(tags_ok)),
    },
    "step": {
        "run_key": (True, _RUN_KEY),
        "i": (True, _int(0, 1 << 40)),
        "t0": (True, _int()),
        "t1": (True, _int()),
        "wait": (True, _int(0, MAX_DURATION_NS)),
        "explicit": (True, _bool),
        "micro": (True, _int(0, 1 << 20)),
        "phases": (True, _phases),
        # the primary optimizer's update was skipped (GradScaler: inf/NaN grads)
        "skipped": (False, _bool),
        # evaluation (no-grad forwards) in the gap before this step, ns
        "eval": (False, _int(0, MAX_DURATION_NS)),
        # per optimizer: {"name", "updates", "skipped", "ns"} (auto mode)
        "optimizers": (False, _optimizers),
        # torch's caching allocator on the run's CUDA device at the step's end,
        # bytes: [memory_allocated, memory_reserved, max_memory_allocated];
        # absent when CUDA is not in use (or not read for this step)
        "mem": (False, _mem),
        # a torch.profiler snapshot ran during this step: its time is not
        # representative (excluded from step statistics, MFU and baselines)
        "traced": (False, _bool),
        # DDP gradient buckets' all-reduces in this step (gpuprof.comm):
        # [[bucket, start_ns, end_ns, nbytes], ...]; absent: none timed
        "comm": (False, _comm_rows),
    },
    # this rank's monotonic clock against the reference rank's (gpuprof.comm.
    # ClockOffset), measured once by the shim's clock alignment
    "clock": {
        "run_key": (True, _RUN_KEY),
        "offset_ns": (True, _int(-(1 << 62), 1 << 62)),
        "uncertainty_ns": (True, _int(0, MAX_DURATION_NS)),
        "rtt_ns": (True, _int(0, MAX_DURATION_NS)),
        "round_trips": (True, _int(1, 1 << 20)),
        "reference_rank": (True, _int(0, 1 << 20)),
    },
    # what the shim learnt about the model during the run (the daemon fills
    # options["dtype"] / options["flops_per_step"] with it unless the user
    # declared them): the compute dtype seen in a forward (autocast, else the
    # parameters'), and the FLOP of step ``flops_step`` counted by
    # torch.utils.flop_counter.FlopCounterMode (gpuprof_shim.flops)
    "model_info": {
        "run_key": (True, _RUN_KEY),
        "dtype": (False, _printable(32)),
        "dtype_source": (False, lambda x: x in ("autocast", "params")),
        "flops_counted": (False, _flops),
        "flops_step": (False, _int(0, 1 << 40)),
    },
    "mark": {
        "run_key": (True, _RUN_KEY),
        "name": (True, _printable(MAX_PHASE_NAME_CHARS)),
        "t_ns": (True, _int()),
    },
    # the worker processes of one multi-process DataLoader iterator, sent when
    # it starts them (every epoch unless persistent_workers)
    "workers": {
        "run_key": (True, _RUN_KEY),
        # per training process, 0, 1, 2... in the order its loader iterators
        # started workers: a new pool (next epoch, another loader) is a new group
        "loader_seq": (True, _int(0, 1 << 40)),
        "workers": (True, _workers),
        "t_ns": (True, _int()),
    },
    # the settings of the run's DataLoaders so far, in first-use order (sent
    # again, whole, when a loader with new settings is first iterated)
    "loaders": {
        "run_key": (True, _RUN_KEY),
        "loaders": (True, _loaders),
    },
    # one window's kernel / operator aggregates (gpuprof.kernels): t0/t1 the
    # window's monotonic ns, rows KernelAgg.to_wire() rows, the top ones by
    # device time (rows_dropped: how many more were folded into "(other)")
    "kernels": {
        "run_key": (True, _RUN_KEY),
        "t0": (True, _int()),
        "t1": (True, _int()),
        "source": (True, lambda x: type(x) is str and x in SOURCES),
        "steps": (True, _window_steps),
        "rows": (True, _kernel_rows),
        "rows_dropped": (False, _int(0, 1 << 40)),
        # source "evidence" only (and there required): the request it answers,
        # {"id", "rule", "time"?} (gpuprof.evidence)
        "evidence": (False, lambda x: _evidence_tag_problem(x) is None),
    },
    # sampled Python stacks since the run's previous stacks event of the same
    # source (gpuprof_shim.stacks): counts per frame and step, added up by
    # the daemon. Only file paths, line numbers and function names.
    "stacks": {
        "run_key": (True, _RUN_KEY),
        "source": (True, lambda x: type(x) is str and x in STACK_SOURCES),
        "rows": (True, _stack_rows),
    },
    "bye": {
        "run_key": (True, _RUN_KEY),
        "status": (True, lambda x: x in RUN_STATUSES_AT_BYE),
        "error": (False, _optional(_str(MAX_ERROR_CHARS))),
        "sent": (True, _int()),
        "dropped": (True, _int()),
        "mono_ns": (True, _int()),
        "wall_ns": (True, _int()),
        "cuda_uuid": (False, _optional(_printable(128))),
        # evaluation after the last step (a final validation loop), ns
        "eval_ns": (False, _int(0, MAX_DURATION_NS)),
    },
    # many data events of one run (see decode_events); each event's own
    # fields are checked against its type's schema one by one
    BATCH_TYPE: {
        "run_key": (True, _RUN_KEY),
        "events": (True, lambda x: type(x) is list and 0 < len(x) <= MAX_BATCH_EVENTS),
        # the shim's number for this message (1, 2, ...): the daemon stores a
        # run's message once, in order, and acknowledges the highest stored
        "seq": (False, _int(1, MAX_SEQ)),
        # the highest seq the shim gave up on (its resend buffer overflowed):
        # messages up to it never come, so a gap up to it is no reorder
        "lost": (False, _int(0, MAX_SEQ)),
    },
    # the highest seq of the run the daemon has stored (reply: ``acked``)
    "ack": {
        "run_key": (True, _RUN_KEY),
        # what the shim did with the daemon's last evidence request
        # (gpuprof.evidence.report_problem); the reply may carry a request
        "evidence": (False, lambda x: _evidence_report_problem(x) is None),
    },
    "ping": {},
    # gpuprofctl stop: exit once the open runs end (now: at once)
    "stop": {"now": (False, lambda x: type(x) is bool)},
}


def decode(data: bytes, channel: str | None = None) -> dict[str, Any]:
    """Decode and validate one message.

    Args:
        data: the raw frame, at most :data:`MAX_MESSAGE_BYTES` bytes.
        channel: ``"data"`` or ``"control"`` to also check that the type
            belongs on that socket; ``None`` accepts any known type.

    Returns:
        The message as a dict (unknown extra fields are kept but ignored).
        A ``batch`` comes back with only its envelope checked; use
        :func:`decode_events` to check and expand its events.

    Raises:
        ProtocolError: with a countable ``reason`` for any invalid message.
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError("oversized", f"{len(data)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("not_json", str(exc)[:100]) from None
    if type(msg) is not dict:
        raise ProtocolError("not_object")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", repr(msg.get("v"))[:20])
    kind = msg.get("type")
    if channel == "data" and kind != BATCH_TYPE and kind in CONTROL_TYPES:
        raise ProtocolError("wrong_channel", kind)
    if channel == "control" and (kind in DATA_TYPES or kind == BATCH_TYPE):
        raise ProtocolError("wrong_channel", kind)
    _check(msg)
    return msg


def _check(msg: dict[str, Any]) -> None:
    """Check one decoded object against its type's schema (raises ProtocolError)."""
    kind = msg.get("type")
    schema = SCHEMAS.get(kind) if type(kind) is str else None
    if schema is None:
        raise ProtocolError("unknown_type", repr(kind)[:40])
    for field, (required, check) in schema.items():
        if field not in msg:
            if required:
                raise ProtocolError(f"bad_field:{field}", "missing")
            continue
        if not check(msg[field]):
            raise ProtocolError(f"bad_field:{field}", repr(msg[field])[:60])
    if kind in ("step", "kernels") and not 0 <= msg["t1"] - msg["t0"] <= MAX_DURATION_NS:
        raise ProtocolError("bad_field:t1", "t1 before t0 or more than 7 days after it")
    if kind == "kernels" and (msg["source"] == "evidence") != ("evidence" in msg):
        raise ProtocolError("bad_field:evidence", "source evidence needs its tag, and only it")
    if kind == "model_info" and not _model_info(msg):
        raise ProtocolError("bad_field:model_info", "neither dtype nor flops_counted")


def batch(
    run_key: str, events: list[dict[str, Any]], seq: int | None = None, lost: int = 0
) -> dict[str, Any]:
    """A ``batch`` message of *events* (data events of run *run_key*, each a
    dict with its ``type`` and fields; their ``v`` and ``run_key`` may be
    left out: the envelope's apply), at most :data:`MAX_BATCH_EVENTS`;
    numbered *seq* by the shim (see the ``batch`` schema) if given."""
    msg = {"v": PROTOCOL_VERSION, "type": BATCH_TYPE, "run_key": run_key, "events": events}
    if seq is not None:
        msg["seq"] = seq
        if lost:
            msg["lost"] = lost
    return msg


def decode_events(data: bytes) -> tuple[list[dict[str, Any]], list[ProtocolError]]:
    """Decode one data-socket frame into its events (see :func:`decode_frame`)."""
    events, errors, _ = decode_frame(data)
    return events, errors


def decode_frame(
    data: bytes,
) -> tuple[list[dict[str, Any]], list[ProtocolError], dict[str, Any] | None]:
    """Decode one data-socket frame into its events: the daemon's gate.

    A single data event comes back as a list of one. A ``batch`` is expanded:
    each event gets the envelope's ``v`` and ``run_key`` (one that carries
    another version or run key is invalid) and is checked exactly as a
    single event would be; invalid ones are left out and returned as errors
    (one per event, each with its countable ``reason``), the valid ones are
    kept in order.

    Args:
        data: the raw frame, at most :data:`MAX_MESSAGE_BYTES` bytes.

    Returns:
        ``(events, errors, envelope)``: the valid events, one
        :class:`ProtocolError` per invalid event inside a batch, and the
        batch's envelope (``run_key``, ``seq``, ``lost``; None for a single event).

    Raises:
        ProtocolError: the frame itself (or a batch's envelope: version, run
            key, an ``events`` list of 1..:data:`MAX_BATCH_EVENTS`) is
            invalid: one drop for the whole message.
    """
    msg = decode(data, channel="data")
    if msg["type"] != BATCH_TYPE:
        return [msg], [], None
    run_key = msg["run_key"]
    events: list[dict[str, Any]] = []
    errors: list[ProtocolError] = []
    for ev in msg["events"]:
        try:
            if type(ev) is not dict:
                raise ProtocolError("not_object")
            if ev.setdefault("v", PROTOCOL_VERSION) != PROTOCOL_VERSION:
                raise ProtocolError("bad_version", repr(ev.get("v"))[:20])
            if ev.setdefault("run_key", run_key) != run_key:
                raise ProtocolError("bad_field:run_key", "not the batch's run")
            kind = ev.get("type")
            if type(kind) is str and kind not in DATA_TYPES and kind in SCHEMAS:
                raise ProtocolError("wrong_channel", f"{kind} inside a batch")
            _check(ev)
        except ProtocolError as exc:
            errors.append(exc)
            continue
        events.append(ev)
    return events, errors, msg
