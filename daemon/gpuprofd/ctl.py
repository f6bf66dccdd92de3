"""``gpuprofctl``: read gpuprof databases and talk to their gpuprofd (one per
database, or a node-wide one under systemd).

:func:`main` maps every expected error to a one-line message and an exit
code, here and only here (0 ok, 1 unexpected, 2 bad input / database,
3 no daemon); it returns the code instead of raising ``SystemExit``.
"""

from __future__ import annotations

import importlib
import logging
import platform
import sys

import click

from gpuprof.protocol import PROTOCOL_VERSION
from gpuprofd import __version__
from gpuprofd.commands.common import echo_json, format_option
from gpuprofd.core.errors import EXIT_FAILURE, EXIT_OK, GpuprofdError

#: Each command's module and function, imported when the command runs (or
#: ``--help`` lists them): ``gpuprofctl insights`` does not load the team
#: server's HTTP client that ``drain`` needs (a third of a cold start-up).
COMMANDS = {
    "compare": "gpuprofd.commands.compare:compare_cmd",
    "drain": "gpuprofd.commands.drain:drain_cmd",
    "insights": "gpuprofd.commands.insights:insights_cmd",
    "kernels": "gpuprofd.commands.kernels:kernels_cmd",
    "nsys-import": "gpuprofd.commands.nsys:nsys_import_cmd",
    "rollup": "gpuprofd.commands.rollup:rollup_cmd",
    "runs": "gpuprofd.commands.runs:runs_cmd",
    "status": "gpuprofd.commands.status:status_cmd",
    "stop": "gpuprofd.commands.stop:stop_cmd",
    "top": "gpuprofd.commands.top:top_cmd",
    "watch": "gpuprofd.commands.watch:watch_cmd",
}


class LazyGroup(click.Group):
    """A click group whose :data:`COMMANDS` are imported on first use
    (click's documented pattern for lazily loaded subcommands)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module, name = COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuprofctl", message="gpuprof %(version)s")
def cli() -> None:
    """gpuprof's command line: read the runs in a gpuprof database and talk
    to its gpuprofd. Every command takes --format json.

    \b
    Example:
      gpuprofctl insights          # the latest run in ./gpuprof.db

    `gpuprofctl COMMAND --help` says more about each.
    """


@cli.command("version", short_help="gpuprof's version (json: Python's, the protocol's).")
@format_option
def version_cmd(fmt: str) -> None:
    """Print gpuprof's version (json: also Python's and the wire protocol's).

    \b
    Example:
      gpuprofctl version --format json
    """
    if fmt == "json":
        echo_json(
            {
                "gpuprof": __version__,
                "python": platform.python_version(),
                "protocol": PROTOCOL_VERSION,
            }
        )
    else:
        click.echo(f"gpuprof {__version__}")


def main(args: list[str] | None = None) -> int:
    """Run gpuprofctl with *args* (default ``sys.argv[1:]``); return the exit code."""
    logging.basicConfig(level=logging.WARNING, format="gpuprofctl: %(message)s")
    try:
        rv = cli.main(args=args, prog_name="gpuprofctl", standalone_mode=False)
    except GpuprofdError as exc:
        click.echo(f"gpuprofctl: error: {exc}", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_FAILURE
    except BrokenPipeError:  # `gpuprofctl runs | head`
        return EXIT_OK
    return rv if isinstance(rv, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
