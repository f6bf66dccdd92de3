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


def resolve_db(db: Path | None) -> Path:
    """*db*, or ``GPUPROF_DB`` / ``./gpuprof.db``."""
    return (db or config.db_path()).expanduser()


def echo_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode())
