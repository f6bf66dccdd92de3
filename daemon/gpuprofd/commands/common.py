"""Options and output helpers shared by gpuprofctl's commands."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from gpuprof import config
from gpuprofd.core.errors import BadInputError
from gpuprofd.storage import unreadable
from gpuprofd.storage.reader import Reader, open_reader
from gpuprofd.views.compare import run_ref

T = TypeVar("T")

format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)


class DbOrUrl(click.ParamType):
    """A database file's path, or a storage URL given in its place (the
    summary's ``Full report:`` line for a Postgres run), kept as written."""

    name = "db"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        return text if "://" in text else Path(text)


#: The largest run id: SQLite's (and Postgres' BIGINT's) largest integer.
MAX_RUN_ID = 2**63 - 1


class RunId(click.ParamType):
    """A run's id (``gpuprofctl runs`` lists them): a whole number from 1,
    shown as ``RUN_ID`` in help (not click's ``[1<=x<=9223372036854775807]``)."""

    name = "run_id"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "RUN_ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            number = value
        else:
            text = str(value).strip()
            # at most 19 digits: int() refuses over 4300 (ValueError), and none is an id
            digits = text.isascii() and text.isdigit() and len(text.lstrip("0")) <= 19
            number = int(text) if digits else 0
        if not 1 <= number <= MAX_RUN_ID:
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
            self.fail(
                f"{shown} is not a run id: a whole number from 1 (gpuprofctl runs lists them)",
                param,
                ctx,
            )
        return number


run_id_type = RunId()


class RunRef(click.ParamType):
    """A run by id or by name (the latest run of that name):
    :func:`gpuprofd.views.compare.run_ref`, shown as ``RUN`` in help."""

    name = "run"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "RUN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        try:
            return run_ref(str(value))
        except BadInputError as e:
            self.fail(f"{e} (gpuprofctl runs lists the ids and names)", param, ctx)


run_ref_type = RunRef()

db_argument = click.argument("db", type=DbOrUrl(), required=False)

#: ``--storage-url URL``: the database as a storage URL, instead of DB.
storage_url_option = click.option(
    "--storage-url",
    "storage_url",
    metavar="URL",
    default=None,
    help="The database as a URL instead of DB: sqlite:///path.db or "
    "postgres://user@host/db (a team server's).",
)


def socket_dir_option(help: str) -> Any:
    """``--socket-dir DIR`` (None when not given), with *help*."""
    return click.option("--socket-dir", type=click.Path(path_type=Path), default=None, help=help)


#: ``--timeout SECONDS`` of a command that asks the daemon (``timeout_s``).
timeout_option = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.05),
    metavar="SECONDS",
    default=1.0,
    show_default=True,
    help="Seconds to wait for the daemon's answer.",
)


def resolve_socket_dir(socket_dir: Path | None, db: Path | None = None) -> Path:
    """*socket_dir*, or ``GPUPROF_SOCKET`` / the per-user daemon's of *db*
    (default ``GPUPROF_DB`` / ``./gpuprof.db``), absolute."""
    if socket_dir is None and db is not None:
        socket_dir = config.socket_dir(db=db.expanduser())
    return (socket_dir or config.socket_dir()).expanduser().absolute()


def resolve_db(db: Path | None) -> Path:
    """*db*, or ``GPUPROF_DB`` / ``./gpuprof.db``."""
    return (db or config.db_path()).expanduser()


def resolve_target(db: Path | str | None, storage_url: str | None) -> Path | str:
    """What to read: *storage_url*, else :func:`resolve_db` of *db*.

    Raises:
        click.UsageError: both given.
    """
    if storage_url is not None:
        if db is not None:
            raise click.UsageError("give DB or --storage-url, not both")
        return storage_url
    if isinstance(db, str):  # a storage URL given as DB
        return db
    return resolve_db(db)


def read_with(target: Path | str, reads: Callable[[Reader], Awaitable[T]]) -> T:
    """*reads* run on a :class:`Reader` of *target* (a path or storage URL,
    :func:`gpuprofd.storage.reader.open_reader`), closed after; the values
    it could not decode (:mod:`gpuprofd.storage.unreadable`: shown with
    U+FFFD, empty or left out) are said on stderr, a line per kind."""

    async def main() -> T:
        async with open_reader(target) as reader:
            lost.where = reader.where
            return await reads(reader)

    with unreadable.collecting() as lost:
        got = asyncio.run(main())
    for note in lost.notes():
        click.echo(f"gpuprofctl: warning: {note}", err=True)
    return got


def echo_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode())
