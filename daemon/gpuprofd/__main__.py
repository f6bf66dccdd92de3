"""``gpuprofd`` / ``python -m gpuprofd``: the daemon's entry point (one per
database when auto-started, or one per node under systemd).

The only place the daemon configures logging (to stderr). Expected failures
(a bad database, an unusable socket directory) print one line and exit 2.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuprof import config
from gpuprofd import __version__
from gpuprofd.commands.common import socket_dir_option
from gpuprofd.core.errors import EXIT_BAD_INPUT, BadInputError, GpuprofdError
from gpuprofd.daemon import DaemonOptions, run_daemon
from gpuprofd.forward.config import DEFAULT_MAX_MB
from gpuprofd.forward.config import resolve as resolve_forward
from gpuprofd.sampling.gpu_sampler import DEFAULT_SAMPLE_HZ
from gpuprofd.services.sinks import STORED_GPU_HZ
from gpuprofd.storage.dialect import SQLITE
from gpuprofd.storage.upkeep import COMM_KEEP_EVERY, COMM_STEPS_KEPT, DEFAULT_RAW_WINDOW_S
from gpuprofd.storage.url import StorageUrl
from gpuprofd.storage.url import parse as parse_storage_url
from gpuprofd.web import address as http_address

if TYPE_CHECKING:
    from gpuprofd.web.auth import AuthConfig

LOG_FORMAT = "%(asctime)s gpuprofd[%(process)d] %(levelname)s %(name)s: %(message)s"


def _gpu_rate() -> tuple[float | None, tuple[str, ...]]:
    """``GPUPROF_GPU_RATE``, or (None, a note) when it is malformed."""
    try:
        return config.gpu_rate_usd_per_hour(), ()
    except ValueError as exc:
        return None, (f"{exc}; cost estimates use the price table",)


class FiniteRange(click.FloatRange):
    """A float range that also refuses NaN and infinity (click's lets NaN
    through: every comparison with it is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return out


def _setting(*decls: str, type: click.ParamType, default: float, help: str, **kw: Any) -> Any:
    """A daemon setting's option (``--NAME VALUE``), its default shown in --help."""
    return click.option(*decls, type=type, default=default, show_default=True, help=help, **kw)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@socket_dir_option(
    "Directory for the sockets and lock [default: GPUPROF_SOCKET, or "
    "one per database under $XDG_RUNTIME_DIR/gpuprof or /tmp/gpuprof-$UID]."
)
@click.option(
    "--db",
    type=click.Path(path_type=Path),
    default=None,
    help="SQLite database [default: GPUPROF_DB or ./gpuprof.db].",
)
@click.option(
    "--storage-url",
    metavar="URL",
    default=None,
    help="Where to store runs instead of --db: sqlite:///path.db or "
    "postgres://user@host/db (a password in it is never printed).",
)
@_setting(
    "--idle-exit",
    "idle_exit_s",
    type=FiniteRange(min=0),
    default=0.0,
    metavar="SECONDS",
    help="Exit after this long with no live run and no message (0 = never).",
)
@_setting(
    "--sample-hz",
    type=FiniteRange(min=0.1, max=1000),
    default=DEFAULT_SAMPLE_HZ,
    metavar="HZ",
    help="GPU fast-loop sampling rate (per GPU): utilization, memory, power, "
    "temperature, clocks. Every sample feeds the per-second rollups; raw rows are stored "
    f"at most {STORED_GPU_HZ:g} a second. Energy, PCIe bytes and GPM metrics are read "
    "once a second.",
)
@_setting(
    "--raw-window",
    "raw_window_s",
    type=FiniteRange(min=1),
    default=DEFAULT_RAW_WINDOW_S,
    metavar="SECONDS",
    help=f"Seconds of raw GPU samples (at most {STORED_GPU_HZ:g} a second per GPU) to keep; "
    "older ones live on as per-second rollups "
    "(min/mean/max) for the whole run.",
)
@_setting(
    "--comm-steps-kept",
    type=click.IntRange(min=1),
    default=COMM_STEPS_KEPT,
    metavar="STEPS",
    help="Per-bucket DDP comm rows are kept for each run's last STEPS steps (the group "
    "rules read the last 2000 common steps) ...",
)
@_setting(
    "--comm-keep-every",
    type=click.IntRange(min=1),
    default=COMM_KEEP_EVERY,
    metavar="N",
    help="... and for every Nth step; the others are deleted (each step's exposed comm "
    "time is kept).",
)
@click.option(
    "--http",
    "http",
    metavar="HOST:PORT|off",
    default=None,
    help=f"Where the dashboard listens [default: {http_address.DEFAULT_HOST}:"
    f"{http_address.DEFAULT_PORT}, or a free port when that one is taken]. Loopback only "
    "unless --viewer-password-file gives it a login; a port given here that is taken is an "
    "error; "
    "off: no dashboard.",
)
@click.option(
    "--viewer-password-file",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Put the dashboard behind the viewer login (the team server's): FILE holds an "
    "argon2 hash or the password itself. Needed for an --http address beyond loopback.",
)
@click.option(
    "--metrics-key-file",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With the login: API keys (one a line) a scraper may send as 'Authorization: "
    "Bearer KEY' to read /metrics without a session.",
)
@click.option(
    "--server",
    metavar="URL",
    default=None,
    help="Forward every run to this team server (gpuprofd serve), e.g. "
    "https://gpuprof.example:8000. The database keeps what the server has not "
    "acknowledged: an outage loses nothing. [also GPUPROF_SERVER]",
)
@click.option(
    "--api-key-file",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The API key to forward with (its first line; read again when it changes). "
    "[also GPUPROF_API_KEY_FILE, or the key itself in GPUPROF_API_KEY]",
)
@click.option(
    "--forward-max-mb",
    type=click.FloatRange(min=1),
    default=DEFAULT_MAX_MB,
    show_default=True,
    metavar="MB",
    help="Most MiB kept for the team server while it is unreachable; past it the oldest "
    "raw samples go first (then rollups, insights, steps), counted in gpuprofctl status.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@click.version_option(__version__, prog_name="gpuprofd")
def cli(
    socket_dir: Path | None,
    db: Path | None,
    storage_url: str | None,
    idle_exit_s: float,
    sample_hz: float,
    raw_window_s: float,
    comm_steps_kept: int,
    comm_keep_every: int,
    http: str | None,
    viewer_password_file: Path | None,
    metrics_key_file: Path | None,
    server: str | None,
    api_key_file: Path | None,
    forward_max_mb: float,
    log_level: str,
) -> int:
    """gpuprofd: the gpuprof daemon (ingest, GPU/host sampling, storage, insights).

    gpuprof.profile() starts one per database when none answers; under
    systemd one serves the whole node (systemd/gpuprofd.service).
    gpuprofd serve --help: the team server (every node's runs in one place).
    """
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("aiosqlite").setLevel(logging.WARNING)  # one line per SQL call
    rate, notes = _gpu_rate()
    try:
        nvml = config.nvml_backend()
    except ValueError as exc:
        click.echo(f"gpuprofd: error: {exc}", err=True)
        return EXIT_BAD_INPUT
    try:
        storage = _storage(db, storage_url)
        http_at = http_address.parse(http, login=viewer_password_file is not None)
        viewers = _viewer_login(viewer_password_file, metrics_key_file)
        forward = resolve_forward(server, api_key_file, forward_max_mb)
        if forward is not None and storage.path is None:
            raise BadInputError(
                "--server forwards a node's own database; runs stored in Postgres are "
                "shared already: point gpuprofd serve --storage-url at that database instead"
            )
    except GpuprofdError as exc:
        click.echo(f"gpuprofd: error: {exc}", err=True)
        return exc.exit_code
    db_file = storage.path if storage.path is not None else config.db_path()
    opts = DaemonOptions(
        socket_dir=(socket_dir or _default_socket_dir(storage)).expanduser().absolute(),
        db=db_file,
        storage=storage,
        idle_exit_s=idle_exit_s,
        sample_hz=sample_hz,
        raw_window_s=raw_window_s,
        comm_steps_kept=comm_steps_kept,
        comm_keep_every=comm_keep_every,
        http=http_at,
        viewers=viewers,
        forward=forward,
        nvml_backend=nvml,
        gpu_rate_usd_per_hour=rate,
        base_notes=notes,
    )
    try:
        return run_daemon(opts)
    except GpuprofdError as exc:
        click.echo(f"gpuprofd: error: {exc}", err=True)
        return exc.exit_code
    except ValueError as exc:  # e.g. a socket path too long for a Unix socket
        click.echo(f"gpuprofd: error: {exc}", err=True)
        return EXIT_BAD_INPUT


def _viewer_login(password_file: Path | None, metrics_keys: Path | None) -> AuthConfig | None:
    """The dashboard's login (``--viewer-password-file``), or None.

    Raises:
        BadInputError: an unreadable password or key file, or a key file without the login.
    """
    if password_file is None:
        if metrics_keys is not None:
            raise BadInputError(
                "--metrics-key-file needs --viewer-password-file (without a login, /metrics "
                "is open on loopback)"
            )
        return None
    from gpuprofd.web import auth

    keys = auth.ApiKeys([metrics_keys] if metrics_keys else [], required=False)
    return auth.AuthConfig(keys=keys, viewer_hash=auth.viewer_hash(password_file))


def _storage(db: Path | None, storage_url: str | None) -> StorageUrl:
    """The storage from ``--db`` / ``--storage-url`` / ``GPUPROF_DB`` (a file's path resolved).

    Raises:
        BadInputError: both options given, or a URL of an unknown kind.
    """
    if db is not None and storage_url is not None:
        raise BadInputError("give --db or --storage-url, not both")
    url = parse_storage_url(storage_url) if storage_url else None
    if url is not None and url.path is None:
        return url
    path = url.path if url is not None else db
    return StorageUrl(SQLITE, path=path.expanduser().resolve() if path else config.db_path())


def _default_socket_dir(storage: StorageUrl) -> Path:
    """One daemon per database: a file's socket directory is named by its
    path, a Postgres database's by its URL (password left out)."""
    if storage.path is not None:
        return config.socket_dir(db=storage.path)
    if os.environ.get(config.ENV_SOCKET):
        return config.socket_dir()
    key = hashlib.sha256(storage.display.encode()).hexdigest()[:12]
    return config.socket_base_dir() / key


def main(args: list[str] | None = None) -> int:
    """Run the daemon; return its exit code (the console script exits with it).
    ``gpuprofd serve ...`` runs the team server instead (:mod:`gpuprofd.server.cli`)."""
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["serve"]:
        from gpuprofd.server.cli import main as serve_main

        return serve_main(argv[1:])
    try:
        rv = cli.main(args=args, prog_name="gpuprofd", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
