"""Where the dashboard listens: ``gpuprofd --http HOST:PORT`` parsed, and
the URL said to people.

Loopback only until viewers can log in (the team server brings the login):
a node's dashboard shows every run's names, commands and errors to anyone
who can reach the port.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from gpuprofd.core.errors import BadInputError

#: The dashboard's port when none is given (unassigned by IANA; "7311" has no
#: other meaning). A per-user daemon that finds it taken picks a free one.
DEFAULT_PORT = 7311
DEFAULT_HOST = "127.0.0.1"
OFF = "off"
#: Why a non-loopback address is refused (one line, what to do instead).
NOT_LOOPBACK = (
    "without a login the dashboard listens on loopback only (127.0.0.1, ::1, "
    "localhost): add --viewer-password-file FILE (an argon2 hash or the password, "
    "the same viewer login as the team server's), or from another machine: "
    "ssh -L {port}:127.0.0.1:{port} this-host"
)


@dataclass(frozen=True)
class HttpAddress:
    """An address to serve the dashboard on.

    *fallback*: when *port* is taken, listen on a free port instead (the
    default address of a per-user daemon); False: a taken port is an error
    (an address the user gave)."""

    host: str
    port: int
    fallback: bool = False

    def url(self, port: int | None = None) -> str:
        """``http://HOST:PORT`` (IPv6 hosts bracketed; every address: this host's name)."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port if port is None else port}"


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP literal (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse(value: str | None, login: bool = False) -> HttpAddress | None:
    """``--http``'s value: None (not given) → the default address with
    fallback; ``off`` → None; ``HOST:PORT``, ``:PORT`` (loopback),
    ``[::1]:PORT`` or ``PORT``; port 0: a free port, picked at start. Any
    host only with *login* (the viewers' password is set).

    Raises:
        BadInputError: malformed, a port outside 0-65535, or not loopback without *login*.
    """
    if value is None:
        return HttpAddress(DEFAULT_HOST, DEFAULT_PORT, fallback=True)
    text = value.strip()
    if text.lower() == OFF:
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = DEFAULT_HOST, text
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        raise BadInputError(
            f"--http {value!r}: give HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT}) or off"
        ) from None
    if not 0 <= port <= 65535:
        raise BadInputError(f"--http {value!r}: the port must be 0-65535 (0: a free one)")
    if not is_loopback(host) and not login:
        raise BadInputError(f"--http {value!r} refused: " + NOT_LOOPBACK.format(port=port))
    return HttpAddress(host, port)
