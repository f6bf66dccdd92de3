"""``gpuprofd serve``: the team server's command line (see ``docs/team-server.md``).

Expected failures (a database that is down or not gpuprof's, a missing key
or password file, an address that cannot be bound) print one line and exit
non-zero.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from gpuprof import config
from gpuprofd.core.errors import EXIT_BAD_INPUT, BadInputError, GpuprofdError
from gpuprofd.server.ingest_api import DEFAULT_MAX_BODY_BYTES, MIB, IngestLimits
from gpuprofd.server.serve import ServeOptions, run_server
from gpuprofd.storage.url import has_password
from gpuprofd.storage.url import parse as parse_storage_url
from gpuprofd.views.rollups import duration_s
from gpuprofd.web import auth

LOG_FORMAT = "%(asctime)s gpuprofd-serve[%(process)d] %(levelname)s %(name)s: %(message)s"
DEFAULT_HTTP = "127.0.0.1:8000"


def read_url_file(path: Path) -> str:
    """The storage URL in file *path*: its first line that is not blank or a ``#`` comment.

    Raises:
        BadInputError: the file missing, unreadable, or holding no URL.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInputError(
            f"cannot read the storage URL file {path} ({exc.strerror or exc})"
        ) from None
    for line in text.splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()
    raise BadInputError(f"the storage URL file {path} holds no URL")


def storage_url_of(url: str | None, url_file: Path | None) -> str:
    """The storage URL given as ``--storage-url`` or in ``--storage-url-file``
    (one of the two); a password given on the command line is warned of.

    Raises:
        BadInputError: neither given, or both.
    """
    if (url is None) == (url_file is None):
        raise BadInputError(
            "give the database as --storage-url URL or --storage-url-file FILE (one of the two)"
        )
    if url_file is not None:
        return read_url_file(url_file)
    assert url is not None
    if has_password(url):
        click.echo(
            "gpuprofd serve: warning: the database password is on the command line, where "
            "ps shows it: put the URL in --storage-url-file, or the password in PGPASSWORD "
            "or ~/.pgpass",
            err=True,
        )
    return url


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:PORT`` for IPv6, ``:PORT`` or ``PORT``: all addresses).

    Raises:
        BadInputError: malformed, or a port outside 0-65535.
    """
    host, sep, port_text = value.strip().rpartition(":")
    if not sep:
        host, port_text = "", value.strip()
    try:
        port = int(port_text)
    except ValueError:
        raise BadInputError(f"--http {value!r}: give HOST:PORT (e.g. 0.0.0.0:8000)") from None
    if not 0 <= port <= 65535:
        raise BadInputError(f"--http {value!r}: the port must be 0-65535")
    return host.strip("[]") or "0.0.0.0", port


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--storage-url",
    metavar="URL",
    default=None,
    help="Where the team's runs live: postgres://user@host/db or sqlite:///path.db "
    "(a password in it is never printed; keep it out of the command line: "
    "--storage-url-file, PGPASSWORD or ~/.pgpass).",
)
@click.option(
    "--storage-url-file",
    type=click.Path(path_type=Path),
    default=None,
    help="File holding the storage URL (its first line), instead of --storage-url: a "
    "password in it stays out of ps.",
)
@click.option(
    "--http",
    "listen",
    metavar="HOST:PORT",
    default=DEFAULT_HTTP,
    show_default=True,
    help="Where to serve the ingest API and the dashboard (0.0.0.0:8000: every address).",
)
@click.option(
    "--api-key-file",
    "key_files",
    type=click.Path(path_type=Path),
    multiple=True,
    help="File of the API keys nodes send (one a line, or sha256:<hex digest>); read again "
    "when it changes. Repeatable. [also GPUPROF_API_KEY_FILE, GPUPROF_API_KEY]",
)
@click.option(
    "--viewer-password-file",
    type=click.Path(path_type=Path),
    required=True,
    help="File holding the viewers' password: an argon2 hash, or the password itself "
    "(hashed at start).",
)
@click.option(
    "--keep-days",
    type=click.FloatRange(min=0, min_open=True),
    metavar="DAYS",
    default=None,
    help="Delete runs that ended more than this many days ago (checked every 10 minutes).",
)
@click.option(
    "--trust-proxy",
    "proxies",
    metavar="ADDR",
    multiple=True,
    help="A reverse proxy (address or network) whose X-Forwarded-For and X-Forwarded-Proto "
    "are believed. Repeatable. [default: none]",
)
@click.option(
    "--session-hours",
    type=click.FloatRange(min=0, min_open=True),
    metavar="HOURS",
    default=auth.DEFAULT_SESSION_S / 3600,
    show_default=True,
    help="How long a viewer's login lasts.",
)
@click.option(
    "--max-body-mb",
    type=click.FloatRange(min=0.01),
    metavar="MB",
    default=DEFAULT_MAX_BODY_BYTES / MIB,
    show_default=True,
    help="Largest ingest body accepted as sent (4x that once decompressed).",
)
@click.option(
    "--digest-webhook",
    "digest_url",
    metavar="URL",
    default=None,
    help="Post the team's GPU-hours digest (totals, the three costliest findings, their "
    "fixes and runs) here once a period, sent by one replica.",
)
@click.option(
    "--digest-every",
    "digest_every",
    metavar="LENGTH",
    default="7d",
    show_default=True,
    help="The digest's period: 7d, 1d, 12h ... (periods end on multiples of it since the epoch).",
)
@click.option(
    "--digest-format",
    "digest_format",
    type=click.Choice(["slack", "json"]),
    default="slack",
    show_default=True,
    help="The digest's body: Slack's incoming-webhook blocks, or JSON.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
def serve_cli(
    storage_url: str | None,
    storage_url_file: Path | None,
    listen: str,
    key_files: tuple[Path, ...],
    viewer_password_file: Path,
    keep_days: float | None,
    proxies: tuple[str, ...],
    session_hours: float,
    max_body_mb: float,
    digest_url: str | None,
    digest_every: str,
    digest_format: str,
    log_level: str,
) -> int:
    """gpuprofd serve: the team server (every node's runs in one place, behind a login)."""
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("aiosqlite").setLevel(logging.WARNING)  # one line per SQL call
    try:
        storage = parse_storage_url(storage_url_of(storage_url, storage_url_file))
        if storage.path is not None:
            storage = type(storage)(storage.dialect, path=storage.path.expanduser().resolve())
        host, port = parse_listen(listen)
        files = list(key_files)
        env_file = config.api_key_file()
        if env_file is not None:
            files.append(env_file)
        keys = auth.ApiKeys(files, auth.env_keys())
        body = int(max_body_mb * MIB)
        opts = ServeOptions(
            storage=storage,
            host=host,
            port=port,
            auth=auth.AuthConfig(
                keys=keys,
                viewer_hash=auth.viewer_hash(viewer_password_file),
                trusted_proxies=auth.parse_proxies(proxies),
                session_s=max(1, int(session_hours * 3600)),
            ),
            keep_days=keep_days,
            limits=IngestLimits(max_body_bytes=body, max_inflated_bytes=4 * body),
            gpu_rate_usd_per_hour=_gpu_rate(),
            digest_url=_digest_url(digest_url),
            digest_every_s=_digest_every(digest_every),
            digest_format=digest_format,
        )
        run_server(opts)
    except GpuprofdError as exc:
        click.echo(f"gpuprofd serve: error: {exc}", err=True)
        return exc.exit_code
    return 0


def _digest_url(url: str | None) -> str | None:
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter("give an http:// or https:// URL", param_hint="--digest-webhook")
    return url


def _digest_every(text: str) -> int:
    seconds = duration_s(text)
    if seconds is None or seconds < 1:
        raise click.BadParameter(
            f"{text!r}: give a length (7d, 1d, 12h, 30m)", param_hint="--digest-every"
        )
    return int(seconds)


def _gpu_rate() -> float | None:
    try:
        return config.gpu_rate_usd_per_hour()
    except ValueError as exc:
        click.echo(f"gpuprofd serve: {exc}; cost estimates use the price table", err=True)
        return None


def main(args: list[str]) -> int:
    """``gpuprofd serve ARGS``; returns the exit code."""
    try:
        rv = serve_cli.main(args=args, prog_name="gpuprofd serve", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 1
    return rv if isinstance(rv, int) else 0


__all__ = ["EXIT_BAD_INPUT", "main", "parse_listen", "serve_cli"]
