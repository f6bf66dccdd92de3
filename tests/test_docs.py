"""The README and docs/ hold together: every relative link resolves (a file,
and a heading for a ``#anchor``), and every command of the README's
quickstart runs (its ``--help``, with this environment's executables; its
Python blocks compile)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BIN = Path(sys.executable).parent

_FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """*text* without its fenced code blocks (links there are code)."""
    return _FENCE.sub("", text)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+ (.+)$", prose(page.read_text()), re.M)}


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(prose(page.read_text()))
        if not re.match(r"[a-z][a-z+.-]*:", target)  # http:, https:, mailto:
    ]


#: Wording that gives each node one gpuprofd: there is one per database (or
#: ``--socket-dir``), and only a daemon under systemd serves a whole node.
NODE_DAEMON = re.compile(r"\bnode(?:'s)? (?:gpuprofd|daemon)", re.I)


def user_texts() -> dict[str, str]:
    """What a user reads: the README, docs/, ``help()`` of the public API and
    gpuprofd's own ``--help`` (gpuprofctl's: tests/daemon/commands/test_help.py)."""
    import pydoc

    import gpuprof

    texts = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
    for name in ("profile", "Profiler", "LightningCallback", "HFTrainerCallback"):
        obj = getattr(gpuprof, name)  # an adapter resolves even without its framework
        texts[f"help(gpuprof.{name})"] = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    for argv in (["--help"], ["serve", "--help"]):
        done = subprocess.run(
            [sys.executable, "-m", "gpuprofd", *argv], capture_output=True, text=True, timeout=60
        )
        texts[" ".join(["gpuprofd", *argv])] = done.stdout
    return texts


def test_no_text_gives_a_node_one_gpuprofd():
    texts = user_texts()
    assert len(texts) > len(PAGES) + 3 and all(texts.values())
    found = [
        (where, m.string[m.start() - 30 : m.end() + 30])
        for where, text in texts.items()
        for m in NODE_DAEMON.finditer(" ".join(text.split()))
    ]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    assert [p.name for p in PAGES[1:] if p not in linked] == []


def quickstart_blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced block in the README's Quickstart."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w*)\n(.*?)^```", section, re.M | re.S)


def commands() -> list[list[str]]:
    """Each shell line of the quickstart, as argv, its comment cut."""
    out = []
    for lang, body in quickstart_blocks():
        if lang != "python":
            for line in body.splitlines():
                argv = shlex.split(line, comments=True)
                if argv:
                    out.append(argv)
    return out


def test_the_quickstart_has_commands_and_code():
    assert len(commands()) >= 5
    assert any(lang == "python" for lang, _ in quickstart_blocks())


def test_the_quickstart_commands_work_right_after_the_demo():
    """The demo makes one run per ``digits_mlp.py`` line (IDs 1, 2, ...), none
    traced: the quickstart names no other run and no kernel table."""
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    demo_runs = len(re.findall(r"^\S*python examples/digits_mlp\.py\b", demo, re.M))
    assert demo_runs == 2
    assert "trace_" not in (ROOT / "examples" / "digits_mlp.py").read_text()
    ctl = [argv for argv in commands() if argv[0] == "gpuprofctl"]
    ids = [int(arg) for argv in ctl for arg in argv[1:] if arg.isdigit()]
    assert ids and max(ids) <= demo_runs
    assert [argv for argv in ctl if argv[1] == "kernels"] == []


def manual_api_snippet(page: Path) -> str:
    (body,) = [
        b
        for b in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)
        if "auto=False) as prof:" in b
    ]
    return body


def test_the_readme_and_the_options_page_show_the_same_manual_api():
    readme = manual_api_snippet(ROOT / "README.md")
    assert readme == manual_api_snippet(ROOT / "docs" / "usage.md")
    assert 's.phase("optimizer")' in readme


@pytest.mark.parametrize("body", [b for lang, b in quickstart_blocks() if lang == "python"])
def test_quickstart_python_compiles(body: str):
    compile(body, "README.md quickstart", "exec")


@pytest.mark.parametrize("argv", commands(), ids=[" ".join(a) for a in commands()])
def test_quickstart_command_runs(argv: list[str]):
    exe = BIN / argv[0]
    assert exe.exists(), f"{argv[0]} is not installed in {BIN}"
    words = [argv[0]]
    for arg in argv[1:]:  # the command and its subcommands: what --help is asked of
        if not re.fullmatch(r"[a-z][a-z-]*", arg):
            break
        words.append(arg)
    done = subprocess.run(
        [str(exe), *words[1:], "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: {' '.join(words)} "), done.stdout[:200]


#: An extra as a message or a page names it: ``install_hint("hf")`` in code,
#: ``gpuprof[hf]`` or ``.[hf]`` in a command.
EXTRA_NAMED = re.compile(r"""install_hint\(["'](\w[\w-]*)["']\)|(?:gpuprof|\.)\[([\w,-]+)\]""")


def test_every_extra_a_message_or_a_page_names_exists():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    sources = [*PAGES, *sorted(ROOT.glob("*/**/*.py"))]
    named: dict[str, set[str]] = {}
    for path in sources:
        if ".venv" in path.parts:
            continue
        for m in EXTRA_NAMED.finditer(path.read_text()):
            for extra in (m.group(1) or m.group(2)).split(","):
                named.setdefault(extra, set()).add(str(path.relative_to(ROOT)))
    assert {"lightning", "hf", "wandb", "postgres"} <= set(named)
    assert {e: sorted(where) for e, where in named.items() if e not in extras} == {}


#: Installing gpuprof from PyPI: ``gpuprof`` there is another project.
FROM_PYPI = re.compile(r"""pip install (?:-U |--upgrade )?["']?gpuprof\b""")


def test_no_page_or_message_installs_gpuprof_from_pypi():
    sources = [*PAGES, *sorted(ROOT.glob("*/**/*.py"))]
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in sources
        if ".venv" not in path.parts
        for m in FROM_PYPI.finditer(path.read_text())
    ]
    assert found == []


def test_the_docs_give_the_gpu_sampling_and_storage_rates_gpuprofd_uses():
    """gpuprofd samples each GPU at ``--sample-hz`` (every sample feeds the
    per-second rollups) and stores raw rows at most STORED_GPU_HZ a second."""
    from gpuprofd.sampling.gpu_sampler import DEFAULT_SAMPLE_HZ
    from gpuprofd.services.sinks import STORED_GPU_HZ

    text = " ".join(" ".join(p.read_text().split()) for p in PAGES)
    stored = re.findall(r"at most (\d+) a second", text)
    sampled = re.findall(r"(\d+) (?:times a second|a second gpuprofd takes|Hz by default)", text)
    assert len(stored) >= 4 and {float(n) for n in stored} == {STORED_GPU_HZ}
    assert len(sampled) >= 4 and {float(n) for n in sampled} == {DEFAULT_SAMPLE_HZ}
    assert re.findall(r"raw GPU samples \(\d+", text) == []  # the old "(10 a second)"
    done = subprocess.run(
        [sys.executable, "-m", "gpuprofd", "--help"], capture_output=True, text=True, timeout=60
    )
    help_text = " ".join(done.stdout.split())
    assert f"raw rows are stored at most {STORED_GPU_HZ:g} a second" in help_text
    assert f"[default: {DEFAULT_SAMPLE_HZ}; 0.1<=x<=1000]" in help_text


#: How gpuprof is built, which a page for users never names: its parts'
#: internal names, the package's source files, test fixtures.
BUILT_FROM = re.compile(
    r"\bthe shim\b|\bshim's\b|\bfixtures?\b|gpuprof_shim|\bgpuprofd\.(?!log\b|service\b)[a-z_]+\b"
    r"|`?\b(?:gpuprof|daemon|shim)/[\w/]+\.py\b",
    re.I,
)
#: Edited on another branch for now; drop it from here once it reads for users.
NOT_YET: set[str] = set()


def test_no_page_speaks_of_how_gpuprof_is_built():
    found = [
        f"{page.relative_to(ROOT)}: {m.group(0)}"
        for page in PAGES
        if str(page.relative_to(ROOT)) not in NOT_YET
        for m in BUILT_FROM.finditer(page.read_text())
    ]
    assert found == []
