"""Who this training process is: rank, host, argv and its CUDA device, as
the ``hello`` and ``bye`` messages carry them. Never initializes CUDA."""

from __future__ import annotations

import logging
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from gpuprof.protocol import MAX_GROUP_CHARS, clean_text

log = logging.getLogger("gpuprof.shim")

_MAX_HOST_CHARS = 255
_MAX_ARGV_CHARS = 1000


@dataclass(frozen=True)
class Ranks:
    """Distributed position from torchrun's env vars (defaults 0/0/1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1


def _env_int(env: Mapping[str, str], name: str, default: int, lo: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        log.warning("gpuprof: ignoring %s=%r (not an integer)", name, raw)
        return default
    if value < lo or value > 1 << 20:
        log.warning("gpuprof: ignoring %s=%r (out of range)", name, raw)
        return default
    return value


def process_group_ranks() -> tuple[int, int] | None:
    """``(rank, world size)`` of torch.distributed's default process group if
    it is initialized, else None. Never imports torch; never raises."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        log.debug("gpuprof: could not read the process group's rank", exc_info=True)
    return None


def read_ranks(
    env: Mapping[str, str] | None = None, process_group: tuple[int, int] | None = None
) -> Ranks:
    """``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` from *env* (default ``os.environ``).

    Without ``RANK`` and ``WORLD_SIZE`` (``torch.multiprocessing.spawn``, a
    launcher of one's own: ``init_process_group(rank=..., world_size=...)``)
    the rank and world size come from *process_group* (default: the
    initialized default group, :func:`process_group_ranks`): every rank was
    "rank 0 of 1" (every rank printed its summary, and a named group's ranks
    overwrote each other as rank 0).

    A missing, non-integer or out-of-range value falls back to its default;
    a rank that is not below the world size resets all three.
    """
    e = os.environ if env is None else env
    if not e.get("RANK") and not e.get("WORLD_SIZE"):
        pg = process_group
        if pg is None and env is None:
            pg = process_group_ranks()
        if pg is not None and 0 <= pg[0] < pg[1] <= 1 << 20:
            e = {**e, "RANK": str(pg[0]), "WORLD_SIZE": str(pg[1])}
    ranks = Ranks(
        rank=_env_int(e, "RANK", 0, 0),
        local_rank=_env_int(e, "LOCAL_RANK", 0, 0),
        world_size=_env_int(e, "WORLD_SIZE", 1, 1),
    )
    if ranks.rank >= ranks.world_size:
        log.warning("gpuprof: RANK %d >= WORLD_SIZE %d; using 0/0/1", ranks.rank, ranks.world_size)
        return Ranks()
    local_world = _env_int(e, "LOCAL_WORLD_SIZE", 1, 1)
    # at least this process's slot, at most the world
    local_world = min(ranks.world_size, max(local_world, ranks.local_rank + 1))
    return Ranks(ranks.rank, ranks.local_rank, ranks.world_size, local_world)


#: torchrun's ``TORCHELASTIC_RUN_ID`` when no ``--rdzv-id`` was given: shared
#: by every launch, so it cannot name a group by itself.
_DEFAULT_RUN_ID = "none"


def group_id(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The group this rank belongs to: *explicit* (``profile(group=...)``),
    else torchrun's ``TORCHELASTIC_RUN_ID`` (its default ``none`` becomes
    ``torchrun-<agent pid>``, one per launch on this node), else None: a run
    outside torchrun is its own group. Printable, at most
    :data:`~gpuprof.protocol.MAX_GROUP_CHARS` characters; None if empty."""
    e = os.environ if env is None else env
    raw = explicit if explicit is not None else e.get("TORCHELASTIC_RUN_ID")
    if raw is None:
        return None
    text = clean_text(str(raw), MAX_GROUP_CHARS).strip()
    if explicit is None and text == _DEFAULT_RUN_ID:
        text = f"torchrun-{os.getppid()}"
    return text or None


def host_name() -> str:
    """This node's host name, printable and at most 255 characters."""
    try:
        name = socket.gethostname()
    except OSError:
        name = ""
    name = "".join(c for c in name if c.isprintable())[:_MAX_HOST_CHARS]
    return name or "unknown"


def user_name() -> str | None:
    """Who runs the training (the login name, printable, at most 64
    characters), or None when the system cannot say (no passwd entry)."""
    try:
        import getpass

        name = getpass.getuser()
    except Exception:  # noqa: BLE001 - KeyError/OSError in a container without a user
        return None
    return "".join(c for c in name if c.isprintable())[:64] or None


def argv_text() -> str | None:
    """The command line, shell-quoted and cut to 1000 characters; None if empty."""
    try:
        text = clean_text(shlex.join(str(a) for a in sys.argv), _MAX_ARGV_CHARS)
    except Exception:
        return None
    return text or None


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]``), or None if unknown.
    Sent in ``hello`` so a daemon in another namespace (the training runs in a
    container, the daemon on the host) does not judge liveness by our pid."""
    try:
        return os.readlink("/proc/self/ns/pid")[:64]
    except OSError:
        return None


def cuda_uuid() -> str | None:
    """``GPU-<uuid>`` of the current CUDA device, only if torch is already
    imported and CUDA already initialized by the user; else None.

    Never imports torch and never initializes CUDA (that would cost the user
    seconds and GPU memory, and breaks forked DataLoader workers).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if not (cuda.is_initialized() and cuda.is_available()):
            return None
        props = cuda.get_device_properties(cuda.current_device())
        uuid = str(props.uuid)
    except Exception:
        log.debug("gpuprof: could not read the CUDA device uuid", exc_info=True)
        return None
    if not uuid:
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def cuda_name() -> str | None:
    """The current CUDA device's name (``"NVIDIA H200"``), under the same
    conditions as :func:`cuda_uuid` (torch imported, CUDA initialized by
    the user); else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if not (cuda.is_initialized() and cuda.is_available()):
            return None
        return str(cuda.get_device_name(cuda.current_device())) or None
    except Exception:
        log.debug("gpuprof: could not read the CUDA device name", exc_info=True)
        return None
