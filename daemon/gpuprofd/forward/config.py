"""Where a node forwards to and with which key: ``--server URL`` (or
``GPUPROF_SERVER``), ``--api-key-file F`` (or ``GPUPROF_API_KEY_FILE``) or
``GPUPROF_API_KEY``, and the outbox bound ``--forward-max-mb``.

The key file is read again whenever it changes (a rotated key is used from
the next batch on); its first non-empty line is the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gpuprof import config
from gpuprofd.core.errors import BadInputError

#: The outbox bound by default, MiB: an 8-GPU node at 100 ms steps writes
#: 139 MiB an hour (bench/forward.py, 2026-12-02), so this holds a ~7-hour outage.
DEFAULT_MAX_MB = 1024


def check_server_url(url: str) -> str:
    """*url* without a trailing ``/``.

    Raises:
        BadInputError: not an http(s) URL with a host.
    """
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInputError(
            f"--server {url!r} is not a team server URL: give http(s)://HOST[:PORT], "
            "as gpuprofd serve prints it"
        )
    if parts.query or parts.fragment:
        raise BadInputError(f"--server {url!r}: give the server's base URL, without ? or #")
    return url


@dataclass
class ApiKey:
    """The key sent with each batch: given as text, or read from *path*
    (again whenever the file changes)."""

    text: str | None = None
    path: Path | None = None
    _stamp: tuple[int, int] | None = field(default=None, repr=False)
    _cached: str | None = field(default=None, repr=False)

    def get(self) -> str:
        """The key now.

        Raises:
            BadInputError: no key given, or the file is unreadable or empty (said how to fix).
        """
        if self.path is None:
            if not self.text:
                raise BadInputError(
                    "no API key for the team server: set GPUPROF_API_KEY or "
                    "GPUPROF_API_KEY_FILE, or pass --api-key-file"
                )
            return self.text
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                lines = [ln.strip() for ln in self.path.read_text().splitlines()]
                self._cached = next((ln for ln in lines if ln and not ln.startswith("#")), None)
                self._stamp = stamp
        except OSError as exc:
            raise BadInputError(
                f"cannot read the API key file {self.path} ({exc.strerror or exc})"
            ) from None
        if not self._cached:
            raise BadInputError(f"the API key file {self.path} holds no key")
        return self._cached


@dataclass
class ForwardConfig:
    """A node's forwarding: the server's base URL, its key, the outbox bound (bytes)."""

    server: str
    key: ApiKey
    max_bytes: int = DEFAULT_MAX_MB * 1024 * 1024

    @property
    def ingest_url(self) -> str:
        return f"{self.server}/api/v1/ingest"

    def run_url(self, run_uuid: str) -> str:
        """The run's page on the team server (it redirects to the run's view)."""
        return f"{self.server}/runs/{run_uuid}"


def resolve(
    server: str | None,
    api_key_file: str | Path | None,
    max_mb: float = DEFAULT_MAX_MB,
    env: Mapping[str, str] | None = None,
) -> ForwardConfig | None:
    """The forwarding the flags (or, for what they leave out, the
    environment) ask for; None when no server is named.

    Raises:
        BadInputError: a bad URL or bound (said how to fix).
    """
    env = os.environ if env is None else env
    server = server or config.server_url(env)
    if not server:
        return None
    url = check_server_url(server)
    if not max_mb > 0:
        raise BadInputError(f"--forward-max-mb {max_mb} must be more than 0")
    path = Path(api_key_file).expanduser() if api_key_file else config.api_key_file(env)
    # a missing key is not fatal here: the forwarder says so (log, status) and
    # keeps the outbox until a key file appears or the daemon restarts with a key
    key = ApiKey(text=None if path else config.api_key(env), path=path)
    return ForwardConfig(url, key, int(max_mb * 1024 * 1024))
