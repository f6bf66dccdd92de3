"""Build the protocol messages the shim sends (pure: no sockets, no clock
reads beyond what callers pass). Field sets follow
``gpuprof.protocol.SCHEMAS``; values are made to pass its checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuprof.comm import MAX_BUCKETS_PER_STEP, ClockOffset
from gpuprof.flops import TransformerArch
from gpuprof.protocol import (
    MAX_DURATION_NS,
    MAX_ERROR_CHARS,
    MAX_OPTIMIZERS,
    MAX_PHASE_NAME_CHARS,
    MAX_PHASES,
    PROTOCOL_VERSION,
    clean_text,
)
from gpuprof_shim.identity import Ranks
from gpuprof_shim.steps import OptimizerUse, StepRecord

#: Phases beyond the protocol's limit are summed under this name.
OVERFLOW_PHASE = "other"


def phase_name(name: object) -> str:
    """A phase name the protocol accepts: printable, 1-64 characters."""
    if type(name) is str and 0 < len(name) <= MAX_PHASE_NAME_CHARS and name.isprintable():
        if name[0] != " " and name[-1] != " ":
            return name  # the common case, without the regex
    text = clean_text(name, 4 * MAX_PHASE_NAME_CHARS).strip()[:MAX_PHASE_NAME_CHARS]
    return text or "unnamed"


#: Phase names already cleaned (they repeat every step), bounded.
_clean_names: dict[object, str] = {}
_CLEAN_NAMES_MAX = 1024


def _cached_phase_name(name: object) -> str:
    key = _clean_names.get(name)
    if key is None:
        key = phase_name(name)
        if len(_clean_names) < _CLEAN_NAMES_MAX and type(name) is str:
            _clean_names[name] = key
    return key


#: Phase names that pass the protocol as they are (the machine's own, and
#: user names seen before), bounded like :data:`_clean_names`.
_valid_names: set[str] = set()


def phases_ok(phases: Mapping[str, int]) -> bool:
    """True if *phases*, non-negative int ns by construction (the manual
    API's), pass the protocol as they are: not too many, every name seen
    valid before (by :func:`clean_phases`), their total (so each) within
    bounds. Three checks done in C, once per step."""
    return (
        len(phases) < MAX_PHASES
        and _valid_names.issuperset(phases)
        and sum(phases.values()) <= MAX_DURATION_NS
    )


def clean_phases(phases: Mapping[str, int]) -> dict[str, int]:
    """Clamp durations to 0..``MAX_DURATION_NS`` and keep at most
    ``MAX_PHASES`` names (the rest are summed into ``"other"``). Runs once per
    step: a step whose names were all seen clean before and whose values are
    in range is copied as it is, without the per-name work."""
    if len(phases) < MAX_PHASES and _valid_names.issuperset(phases):
        for ns in phases.values():
            if type(ns) is not int or ns < 0 or ns > MAX_DURATION_NS:
                break
        else:
            return dict(phases)
    out: dict[str, int] = {}
    for name, ns in phases.items():
        key = _cached_phase_name(name)
        if key not in out and len(out) >= MAX_PHASES - 1:
            key = OVERFLOW_PHASE
        out[key] = min(MAX_DURATION_NS, out.get(key, 0) + max(0, int(ns)))
    for name in out:
        if len(_valid_names) < _CLEAN_NAMES_MAX and name in phases:
            _valid_names.add(name)  # its cleaned form is itself
    return out


def hello(
    *,
    run_key: str,
    run_name: str,
    pid: int,
    host: str,
    ranks: Ranks,
    wall_ns: int,
    mono_ns: int,
    auto: bool,
    options: Mapping[str, Any],
    cuda_uuid: str | None,
    argv: str | None,
    pid_ns: str | None = None,
    group: str | None = None,
    server: str | None = None,
    user: str | None = None,
    project: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``hello`` request; ``options`` entries that are None are left out;
    ``group``: the torchrun group id (:func:`identity.group_id`), if any."""
    msg: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "type": "hello",
        "run_key": run_key,
        "run_name": run_name,
        "pid": pid,
        "host": host,
        "rank": ranks.rank,
        "local_rank": ranks.local_rank,
        "world_size": ranks.world_size,
        "local_world_size": ranks.local_world_size,
        "wall_ns": wall_ns,
        "mono_ns": mono_ns,
        "auto": auto,
        "options": {k: v for k, v in options.items() if v is not None},
    }
    if cuda_uuid:
        msg["cuda_uuid"] = cuda_uuid
    if argv:
        msg["argv"] = argv
    if pid_ns:
        msg["pid_ns"] = pid_ns
    if group:
        msg["group"] = group
    if server:
        msg["server"] = server
    if user:
        msg["user"] = user
    if project:
        msg["project"] = project
    if tags:
        msg["tags"] = dict(tags)
    return msg


def server_url(url: str | None) -> str | None:
    """A team server URL as ``profile(server=)`` or ``GPUPROF_SERVER`` gave
    it, without a trailing ``/``; None for none.

    Raises:
        ValueError: not an ``http(s)://`` URL (said how to fix).
    """
    if url is None or not str(url).strip():
        return None
    url = str(url).strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url) > 1000 or "\n" in url:
        raise ValueError(
            f"gpuprof: server must be the team server's http(s):// URL (what gpuprofd serve "
            f"prints), got {url[:80]!r}"
        )
    return url


def error_text(exc: BaseException) -> str:
    """``"TypeName: message"`` cut to the protocol's 2000 characters."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a broken __str__ must not hide the user's error
        text = f"{type(exc).__name__}: <unprintable>"
    return clean_text(text, MAX_ERROR_CHARS, keep_newlines=True)


def bye(
    *,
    run_key: str,
    error: BaseException | None,
    sent: int,
    dropped: int,
    mono_ns: int,
    wall_ns: int,
    cuda_uuid: str | None,
    eval_ns: int = 0,
) -> dict[str, Any]:
    """The ``bye`` request: status ``failed`` with the error text if the loop
    raised *error*, else ``finished``. ``eval_ns``: evaluation after the last
    step (a final validation loop), ns."""
    msg: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "type": "bye",
        "run_key": run_key,
        "status": "failed" if error is not None else "finished",
        "sent": sent,
        "dropped": dropped,
        "mono_ns": mono_ns,
        "wall_ns": wall_ns,
    }
    if error is not None:
        msg["error"] = error_text(error)
    if cuda_uuid:
        msg["cuda_uuid"] = cuda_uuid
    if eval_ns > 0:
        msg["eval_ns"] = min(eval_ns, MAX_DURATION_NS)
    return msg


def step(run_key: str, rec: StepRecord) -> dict[str, Any]:
    """The ``step`` data event for *rec*, on its own (see :func:`step_events`)."""
    return {"v": PROTOCOL_VERSION, "run_key": run_key, **step_events((rec,))[0]}


def step_events(recs: Iterable[StepRecord]) -> list[dict[str, Any]]:
    """The ``step`` events for *recs* as they go in a ``batch`` (no ``v``
    and ``run_key``: the batch's apply), in order; ``skipped``, ``eval``,
    ``optimizers`` and ``mem`` (torch allocator bytes) only when they say
    something. Runs once per burst, its loop once per step: a
    :attr:`~StepRecord.clean` record's phases and optimizers
    (:class:`OptimizerUse` dicts) go as they are (unless DDP buckets were
    attached, which rewrote the phases)."""
    events: list[dict[str, Any]] = []
    append = events.append
    for rec in recs:
        # one unpack: cheaper than fourteen attribute reads
        (
            i,
            t0,
            t1,
            wait,
            explicit,
            micro,
            phases,
            skipped,
            eval_ns,
            optimizers,
            mem,
            traced,
            comm,
            clean,
        ) = rec
        msg: dict[str, Any]
        if clean and not comm:  # also t1 >= t0 and wait >= 0, by construction
            msg = {
                "type": "step",
                "i": i,
                "t0": t0,
                "t1": t1,
                "wait": wait,
                "explicit": explicit,
                "micro": micro,
                "phases": phases,
            }
        else:
            msg = {
                "type": "step",
                "i": i,
                "t0": t0,
                "t1": t1 if t1 > t0 else t0,
                "wait": wait if wait > 0 else 0,
                "explicit": explicit,
                "micro": micro,
                "phases": clean_phases(phases),
            }
        if optimizers:
            if clean:
                msg["optimizers"] = optimizers  # valid as they are
            else:
                msg["optimizers"] = [_optimizer_use(o) for o in optimizers[:MAX_OPTIMIZERS]]
        if skipped:
            msg["skipped"] = True
        if eval_ns > 0:
            msg["eval"] = eval_ns if eval_ns <= MAX_DURATION_NS else MAX_DURATION_NS
        if mem is not None:
            msg["mem"] = list(mem)
        if traced:
            msg["traced"] = True
        if comm:
            msg["comm"] = [b.to_wire() for b in comm[:MAX_BUCKETS_PER_STEP]]
        append(msg)
    return events


def _optimizer_use(o: OptimizerUse) -> dict[str, Any]:
    ns, name = o["ns"], o["name"]
    return {
        "name": _clean_names.get(name) or _cached_phase_name(name),
        "updates": o["updates"],
        "skipped": o["skipped"],
        "ns": ns if 0 <= ns <= MAX_DURATION_NS else min(max(0, ns), MAX_DURATION_NS),
    }


def clock(run_key: str, offset: ClockOffset) -> dict[str, Any]:
    """The ``clock`` data event: this rank's clock offset against the
    reference rank (:class:`gpuprof.comm.ClockOffset`)."""
    return {
        "v": PROTOCOL_VERSION,
        "type": "clock",
        "run_key": run_key,
        "offset_ns": offset.offset_ns,
        "uncertainty_ns": offset.uncertainty_ns,
        "rtt_ns": offset.rtt_ns,
        "round_trips": max(1, offset.round_trips),
        "reference_rank": offset.reference_rank,
    }


def workers(
    run_key: str, loader_seq: int, pids: Sequence[tuple[int, int]], t_ns: int
) -> dict[str, Any]:
    """The ``workers`` data event: one loader iterator's ``(worker_id, pid)``
    pairs (unique, at most ``MAX_WORKERS``), its per-process *loader_seq*,
    and the monotonic ns *t_ns* at which its workers were seen started."""
    return {
        "v": PROTOCOL_VERSION,
        "type": "workers",
        "run_key": run_key,
        "loader_seq": loader_seq,
        "workers": [{"worker_id": w, "pid": p} for w, p in pids],
        "t_ns": t_ns,
    }


def stacks(run_key: str, source: str, rows: Sequence[list[Any]]) -> dict[str, Any]:
    """The ``stacks`` data event: sampled stack counts of *source* (``main``:
    the training thread between its phases; ``loader``: DataLoader workers)
    since the last one, as :func:`gpuprof_shim.stacks.wire_rows` rows (at
    most ``MAX_STACK_ROWS``)."""
    return {
        "v": PROTOCOL_VERSION,
        "type": "stacks",
        "run_key": run_key,
        "source": source,
        "rows": list(rows),
    }


def loaders(run_key: str, configs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``loaders`` data event: the settings of the run's DataLoaders so far
    (each ``num_workers``, ``persistent_workers``, ``pin_memory``,
    ``prefetch_factor``; at most ``MAX_LOADERS``), in first-use order."""
    return {
        "v": PROTOCOL_VERSION,
        "type": "loaders",
        "run_key": run_key,
        "loaders": [dict(c) for c in configs],
    }


def normalize_options(
    flops_per_step: object,
    dtype: object,
    arch: object = None,
    tokens_per_step: object = None,
    count_flops: object = None,
    samples_per_step: object = None,
) -> dict[str, Any]:
    """Check the user's hello options; None values are kept (and left out
    of the message later).

    Args:
        flops_per_step: model FLOP per optimizer step, a positive number.
        dtype: the training dtype, a string or a ``torch.dtype``
            (``torch.bfloat16`` becomes ``"bfloat16"``).
        arch: a :class:`gpuprof.TransformerArch` (or its ``to_dict()``);
            with *tokens_per_step* it gives ``flops_per_step`` unless that
            is given too (the user's number wins; ``flops_source`` says which).
        tokens_per_step: tokens per optimizer step on this rank (batch ×
            seq_len × micro-batches); needed with *arch*.
        count_flops: count one step's FLOP with FlopCounterMode: None (the
            default) when neither *flops_per_step* nor *arch* is given,
            True always, False never.
        samples_per_step: samples per optimizer step on this rank (batch ×
            micro-batches): what ``gpuprofctl compare`` normalises by.

    Raises:
        ValueError: for a value the protocol would reject (misuse, raised
            before anything starts).
    """
    if flops_per_step is not None:
        ok = type(flops_per_step) in (int, float) and 0 < flops_per_step < 1e30  # type: ignore[operator]
        if not ok:
            raise ValueError(
                f"gpuprof: flops_per_step must be a positive number, got {flops_per_step!r}"
            )
    if dtype is not None:
        text = str(dtype).strip()
        text = text[len("torch.") :] if text.startswith("torch.") else text
        if not text or len(text) > 32 or clean_text(text, 32) != text:
            raise ValueError(f"gpuprof: dtype must be a short name like 'bf16', got {dtype!r}")
        dtype = text
    if count_flops is not None and type(count_flops) is not bool:
        raise ValueError(f"gpuprof: count_flops must be True, False or None, got {count_flops!r}")
    out: dict[str, Any] = {"flops_per_step": flops_per_step, "dtype": dtype}
    if tokens_per_step is not None and not (
        type(tokens_per_step) is int and 0 < tokens_per_step <= 1 << 40
    ):
        raise ValueError(
            f"gpuprof: tokens_per_step must be a positive int, got {tokens_per_step!r}"
        )
    if samples_per_step is not None and not (
        type(samples_per_step) is int and 0 < samples_per_step <= 1 << 40
    ):
        raise ValueError(
            f"gpuprof: samples_per_step must be a positive int, got {samples_per_step!r}"
        )
    if arch is not None:
        spec = arch if isinstance(arch, TransformerArch) else None
        if spec is None:
            if not isinstance(arch, Mapping):
                raise ValueError(f"gpuprof: arch must be a gpuprof.TransformerArch, got {arch!r}")
            spec = TransformerArch.from_dict(dict(arch))
        if tokens_per_step is None:
            raise ValueError(
                "gpuprof: arch needs tokens_per_step (batch × seq_len × micro-batches per "
                "optimizer step on this rank)"
            )
        out["arch"] = spec.to_dict()
        if flops_per_step is None:
            out["flops_per_step"] = spec.flops_per_step(tokens_per_step)
            out["flops_source"] = "arch"
    if flops_per_step is not None:
        out["flops_source"] = "user"
    out["tokens_per_step"] = tokens_per_step
    out["samples_per_step"] = samples_per_step
    out["count_flops"] = count_flops
    return out


def model_info(
    run_key: str,
    *,
    dtype: str | None = None,
    dtype_source: str | None = None,
    flops_counted: float | None = None,
    flops_step: int | None = None,
) -> dict[str, Any]:
    """The ``model_info`` data event: the compute dtype the shim saw
    (``dtype_source`` ``"autocast"`` or ``"params"``) and/or the FLOP it
    counted in step *flops_step*; only the fields given."""
    msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": "model_info", "run_key": run_key}
    if dtype is not None:
        msg["dtype"] = dtype
        if dtype_source is not None:
            msg["dtype_source"] = dtype_source
    if flops_counted is not None:
        msg["flops_counted"] = float(flops_counted)
        if flops_step is not None:
            msg["flops_step"] = flops_step
    return msg
