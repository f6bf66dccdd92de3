"""``gpuprofctl``: read gpuprof databases and talk to their gpuprofd (one per
database, or a node-wide one under systemd).

:func:`main` maps every expected error to a one-line message and an exit
code, here and only here (0 ok, 1 unexpected, 2 bad input / database,
3 no daemon); it returns the code instead of raising ``SystemExit``.
"""

from __future__ import annotations

import logging
import platform
import sys

import click

from gpuprof.protocol import PROTOCOL_VERSION
from gpuprofd import __version__
from gpuprofd.commands.common import echo_json, format_option
from gpuprofd.commands.compare import compare_cmd
from gpuprofd.commands.drain import drain_cmd
from gpuprofd.commands.insights import insights_cmd
from gpuprofd.commands.kernels import kernels_cmd
from gpuprofd.commands.nsys import nsys_import_cmd
from gpuprofd.commands.rollup import rollup_cmd
from gpuprofd.commands.runs import runs_cmd
from gpuprofd.commands.status import status_cmd
from gpuprofd.commands.stop import stop_cmd
from gpuprofd.commands.top import top_cmd
from gpuprofd.commands.watch import watch_cmd
from gpuprofd.core.errors import EXIT_FAILURE, EXIT_OK, GpuprofdError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


cli.add_command(compare_cmd)
cli.add_command(drain_cmd)
cli.add_command(insights_cmd)
cli.add_command(kernels_cmd)
cli.add_command(nsys_import_cmd)
cli.add_command(rollup_cmd)
cli.add_command(runs_cmd)
cli.add_command(status_cmd)
cli.add_command(stop_cmd)
cli.add_command(top_cmd)
cli.add_command(watch_cmd)


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
