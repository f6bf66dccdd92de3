"""The repository's shape: it stands alone (nothing reads or names a folder
beside it), and its packages import one way (no circles at any level; the
shim and the daemon never import each other), as pyproject.toml's
``[tool.importlinter]`` contracts say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Folders that are not the project's own files.
SKIP_DIRS = {
    ".git",
    ".venv",
    ".whl",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".import_linter_cache",
    "node_modules",
    "build",
}
#: The folder the project was once developed beside, spelled in parts so this
#: file does not name it itself.
SIBLING = "sha" + "red"
#: A path out of the repository to that folder.
OUTSIDE = re.compile(
    rf"\.\./{SIBLING}\b|\bparents?\b[^\n]{{0,20}}/\s*[\"']{SIBLING}[\"']|\b{SIBLING}/fixtures\b"
)


def project_files() -> list[Path]:
    """Every text file of the project (vendored and binary files included in
    the walk; those that do not decode as UTF-8 are skipped)."""
    out = []
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for p in folder.iterdir():
            if p.is_dir():
                if p.name not in SKIP_DIRS and not p.name.endswith(".egg-info"):
                    stack.append(p)
            elif p.is_file() and p.suffix not in {".gz", ".png", ".db", ".pyc"}:
                out.append(p)
    return out


def test_the_pattern_finds_what_it_is_for() -> None:
    # the forms the project once used to reach outside itself
    assert OUTSIDE.search(f"python x.py --replay ../{SIBLING}/fixtures/h200/t.jsonl")
    assert OUTSIDE.search(f'TRACE = ROOT.parent / "{SIBLING}" / "fixtures"')
    assert OUTSIDE.search(f"(``{SIBLING}/fixtures/h200/probe.json``)")
    assert not OUTSIDE.search("a shared, busy host; shared_memory; tests/fixtures/h200")


def test_nothing_reads_or_names_a_folder_outside_the_repository() -> None:
    offenders = []
    for path in project_files():
        if path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


def test_recordings_are_in_the_repository() -> None:
    fixtures = ROOT / "tests" / "fixtures"
    for name in (
        "h200/nvml_trace.jsonl",
        "h200/steps.json",
        "h200/trace_sdpa.json.gz",
        "kineto-a100/dlrm8_baseline_rank3.json.gz",
        "kineto-a100/LICENSE-HTA",
    ):
        assert (fixtures / name).stat().st_size > 1000 or name.endswith("LICENSE-HTA"), name


def test_imports_run_one_way() -> None:
    """lint-imports over the contracts in pyproject.toml; its report is the message."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(no_cache=True, no_logo=True))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 kept, 0 broken" in proc.stdout, proc.stdout
