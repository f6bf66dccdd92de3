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
