"""Options and output helpers shared by gpuprofctl's commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from gpuprof import config

format_option = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="Output format.",
)  # fmt: skip

db_argument = click.argument("db", type=click.Path(path_type=Path), required=False)


def socket_dir_option(help: str) -> Any:
    """``--socket-dir DIR`` (None when not given), with *help*."""
    return click.option("--socket-dir", type=click.Path(path_type=Path), default=None, help=help)


#: ``--timeout SECONDS`` of a command that asks the daemon (``timeout_s``).
timeout_option = click.option(
    "--timeout", "timeout_s", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
    help="Seconds to wait for the daemon's answer.",
)  # fmt: skip


def resolve_socket_dir(socket_dir: Path | None) -> Path:
    """*socket_dir*, or ``GPUPROF_SOCKET`` / the database's per-user daemon's, absolute."""
    return (socket_dir or config.socket_dir()).expanduser().absolute()


def resolve_db(db: Path | None) -> Path:
    """*db*, or ``GPUPROF_DB`` / ``./gpuprof.db``."""
    return (db or config.db_path()).expanduser()


def echo_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode())
