"""Every environment variable gpuprof reads, and the defaults they override.

==================  ==========================================================
GPUPROF_SOCKET      directory holding gpuprofd's sockets (default: one
                    directory per database under ``$XDG_RUNTIME_DIR/gpuprof``
                    or ``/tmp/gpuprof-$UID``, so each database has its daemon)
GPUPROF_DB          SQLite database path (default ``./gpuprof.db``)
GPUPROF_GPU_RATE    USD per GPU-hour for the cost estimate (default: price table)
GPUPROF_NVML        GPU sampler backend: ``real`` (default), ``mock``, or
                    ``replay:PATH`` (play a recorded NVML trace, e.g. the
                    H200 fixture's ``nvml_trace.jsonl``)
GPUPROF_API_KEY     an API key for a team server's ingest (a node sends it;
                    ``gpuprofd serve`` accepts it besides its key file)
GPUPROF_API_KEY_FILE  a file of such keys, one a line (see ``api_keys``)
GPUPROF_PROJECT     the project a run counts to (``profile(project=)`` wins)
GPUPROF_TAGS        a run's tags, ``key=value,key=value`` (merged under
                    ``profile(tags=)``, whose keys win)
==================  ==========================================================

Pure functions of an environment mapping, so tests pass their own.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from gpuprof.labels import clean_project, parse_tags

ENV_SOCKET = "GPUPROF_SOCKET"
ENV_DB = "GPUPROF_DB"
ENV_GPU_RATE = "GPUPROF_GPU_RATE"
ENV_NVML = "GPUPROF_NVML"
ENV_API_KEY = "GPUPROF_API_KEY"
ENV_API_KEY_FILE = "GPUPROF_API_KEY_FILE"
ENV_SERVER = "GPUPROF_SERVER"
ENV_PROJECT = "GPUPROF_PROJECT"
ENV_TAGS = "GPUPROF_TAGS"

DEFAULT_DB_NAME = "gpuprof.db"
INGEST_SOCKET_NAME = "ingest.sock"
CONTROL_SOCKET_NAME = "control.sock"
LOCK_NAME = "gpuprofd.lock"
LOG_NAME = "gpuprofd.log"

#: Linux's sun_path holds 108 bytes including the NUL: longer ipc paths fail.
MAX_IPC_PATH_BYTES = 107


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def socket_base_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where per-user daemons keep their socket directories."""
    e = _env(env)
    if e.get("XDG_RUNTIME_DIR"):
        return Path(e["XDG_RUNTIME_DIR"]) / "gpuprof"
    return Path(f"/tmp/gpuprof-{os.getuid()}")


def socket_dir(env: Mapping[str, str] | None = None, db: Path | None = None) -> Path:
    """The directory of gpuprofd's sockets, lock and log (not created here).

    ``GPUPROF_SOCKET`` if set (e.g. ``/run/gpuprof``, a node-wide daemon's under systemd);
    otherwise a directory under :func:`socket_base_dir` named by a hash of
    the database path (*db*, default :func:`db_path`), so scripts writing to
    different databases get their own daemons and never each other's runs.
    """
    e = _env(env)
    if e.get(ENV_SOCKET):
        return Path(e[ENV_SOCKET]).expanduser()
    database = Path(db).resolve() if db is not None else db_path(e)
    key = hashlib.sha256(str(database).encode()).hexdigest()[:12]
    return socket_base_dir(e) / key


def db_path(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The canonical database path (absolute, ``..`` and symlinks resolved):
    ``GPUPROF_DB`` or ``./gpuprof.db``. Canonical, so one file is one daemon."""
    e = _env(env)
    raw = Path(e[ENV_DB]).expanduser() if e.get(ENV_DB) else Path(DEFAULT_DB_NAME)
    return ((cwd or Path.cwd()) / raw).resolve()


def gpu_rate_usd_per_hour(env: Mapping[str, str] | None = None) -> float | None:
    """``GPUPROF_GPU_RATE`` as USD per GPU-hour, or None if unset.

    Raises:
        ValueError: if it is set but not a positive number.
    """
    raw = _env(env).get(ENV_GPU_RATE)
    if not raw:
        return None
    rate = float(raw)
    if not rate > 0:
        raise ValueError(f"{ENV_GPU_RATE} must be a positive USD/hour, got {raw!r}")
    return rate


def nvml_backend(env: Mapping[str, str] | None = None) -> str:
    """``real`` unless ``GPUPROF_NVML`` asks for ``mock`` or ``replay:PATH``
    (returned as ``replay:`` and the path, ``~`` expanded). Unset or empty:
    ``real``.

    Raises:
        ValueError: any other value (a typo must not silently mean "real").
    """
    raw = _env(env).get(ENV_NVML, "").strip()
    kind, sep, path = raw.partition(":")
    if kind.lower() == "replay" and sep and path.strip():
        return f"replay:{Path(path.strip()).expanduser()}"
    if raw.lower() in ("", "real", "mock"):
        return raw.lower() or "real"
    raise ValueError(
        f"{ENV_NVML}={raw!r} is not a GPU backend: use real (the default), mock, or "
        "replay:PATH (a recorded nvml_trace.jsonl)"
    )


def endpoint(directory: Path, name: str) -> str:
    """The ``ipc://`` address of socket *name* in *directory*.

    Raises:
        ValueError: if the path is too long for a Unix socket; pick a shorter
            ``GPUPROF_SOCKET``.
    """
    path = str(Path(directory).absolute() / name)
    if len(path.encode()) > MAX_IPC_PATH_BYTES:
        raise ValueError(
            f"socket path {path!r} is {len(path.encode())} bytes; Unix sockets allow "
            f"{MAX_IPC_PATH_BYTES}. Set {ENV_SOCKET} to a shorter directory."
        )
    return f"ipc://{path}"


def ingest_endpoint(directory: Path) -> str:
    return endpoint(directory, INGEST_SOCKET_NAME)


def control_endpoint(directory: Path) -> str:
    return endpoint(directory, CONTROL_SOCKET_NAME)


def api_key(env: Mapping[str, str] | None = None) -> str | None:
    """``GPUPROF_API_KEY`` (stripped), or None when unset or empty."""
    raw = _env(env).get(ENV_API_KEY, "").strip()
    return raw or None


def api_key_file(env: Mapping[str, str] | None = None) -> Path | None:
    """``GPUPROF_API_KEY_FILE`` (``~`` expanded), or None when unset or empty."""
    raw = _env(env).get(ENV_API_KEY_FILE, "").strip()
    return Path(raw).expanduser() if raw else None


def server_url(env: Mapping[str, str] | None = None) -> str | None:
    """``GPUPROF_SERVER`` (stripped, no trailing ``/``): the team server an
    auto-started gpuprofd forwards runs to; None when unset or empty."""
    raw = _env(env).get(ENV_SERVER, "").strip().rstrip("/")
    return raw or None


def project(env: Mapping[str, str] | None = None) -> str | None:
    """``GPUPROF_PROJECT`` cleaned (:func:`gpuprof.labels.clean_project`), or None."""
    return clean_project(_env(env).get(ENV_PROJECT))


def tags(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``GPUPROF_TAGS`` (``key=value,key=value``) as cleaned tags; {} when unset."""
    return parse_tags(_env(env).get(ENV_TAGS, ""))
