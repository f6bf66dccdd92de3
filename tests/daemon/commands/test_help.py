"""gpuprofctl's help: the top level lists every command on one line each,
and each command's help leads with one example that its own parser accepts."""

from __future__ import annotations

import inspect
import shlex

import pytest

from gpuprofd.ctl import cli, main


def test_top_level_help_lists_every_command_on_one_line(capsys: pytest.CaptureFixture[str]):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = out.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == sorted(cli.commands)
    for line, name in zip(listed, sorted(cli.commands), strict=True):
        short = cli.commands[name].short_help
        assert short and line.split(None, 1)[1] == short  # whole, not cut with "..."


def example_of(name: str) -> list[str]:
    """The command line under ``Example:`` in *name*'s help, split; the
    example must be the paragraph right after the summary."""
    text = inspect.cleandoc(cli.commands[name].help or "")
    paragraphs = [p.replace("\b\n", "").strip() for p in text.split("\n\n")]
    head, line = paragraphs[1].splitlines()
    assert head == "Example:", f"{name}'s help goes on with {paragraphs[1]!r}"
    return shlex.split(line.split("#")[0])


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_each_command_leads_with_one_example_that_parses(name: str):
    argv = example_of(name)
    assert argv[:2] == ["gpuprofctl", name]
    cmd = cli.commands[name]
    ctx = cmd.make_context(name, argv[2:])  # raises on an unknown option or a bad value
    assert ctx.params  # parsed into the command's parameters


def test_no_help_speaks_of_the_node_daemon(capsys: pytest.CaptureFixture[str]):
    for name in cli.commands:
        assert main([name, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "node's gpuprofd" not in text and "node daemon" not in text, name


#: click's own metavars and range texts for a number (``INTEGER RANGE``,
#: ``[1<=x<=9223372036854775807]``): a reader wants to know what the number is.
CLICK_NUMBER_TEXT = ("INTEGER RANGE", "FLOAT RANGE", "INTEGER", "FLOAT", str(2**63 - 1))


def _helps() -> dict[str, str]:
    """Every gpuprofctl command's help, gpuprofd's and gpuprofd serve's."""
    import click

    from gpuprofd.__main__ import cli as gpuprofd_cli
    from gpuprofd.server.cli import serve_cli

    commands = {f"gpuprofctl {n}": c for n, c in cli.commands.items()}
    commands.update({"gpuprofd": gpuprofd_cli, "gpuprofd serve": serve_cli})
    out = {}
    for name, cmd in commands.items():
        with click.Context(cmd, info_name=name, terminal_width=200) as ctx:
            out[name] = cmd.get_help(ctx)
    return out


def test_no_help_shows_clicks_number_metavars():
    helps = _helps()
    found = {n: [t for t in CLICK_NUMBER_TEXT if t in text] for n, text in helps.items()}
    assert {n: f for n, f in found.items() if f} == {}
    kernels = " ".join(helps["gpuprofctl kernels"].split())
    assert "--compare OTHER_RUN Compare RUN (A) with this run (B)." in kernels
    assert "Usage: gpuprofctl kernels [OPTIONS] [DB] [RUN_ID]" in kernels
    assert "--run RUN_ID" in helps["gpuprofctl nsys-import"]


@pytest.mark.parametrize(
    "argv",
    [
        ["kernels", "x.db", "3", "--compare", "0"],
        ["insights", "x.db", str(2**63)],
        ["insights", "x.db", "9" * 5000],  # past int()'s 4300 digits: no traceback
        ["kernels", "x.db", "\u0663"],  # a non-ASCII digit (insights takes it as a name)
    ],
)
def test_a_bad_run_id_is_a_usage_error_that_says_what_a_run_id_is(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is not a run id: a whole number from 1 (gpuprofctl runs lists" in err
    assert len(err) < 600  # a long value is shown shortened


def test_drain_help_says_what_it_does_and_when_without_jargon(capsys):
    assert main(["drain", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for word in ("outbox", "acknowledg", "dead-letter", "backlog"):  # how it works inside
        assert word not in text.lower(), word
    for said in (
        "Upload what a stopped gpuprofd had not yet sent to the team server.",
        "started with --server, or with GPUPROF_SERVER set",  # which daemons leave any
        "Run drain to send it now: before you delete or move the file",  # when to use it
        "drain refuses while one runs; stop it first (gpuprofctl stop)",
        "Exit 0: the server confirmed everything. Exit 1: something is left",
    ):
        assert said in text, said
