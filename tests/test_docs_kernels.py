"""docs/kernels-mfu.md speaks to users: what gpuprof does and costs, not how
it is built (no source paths, no "shim", no test fixtures)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "kernels-mfu.md"


def test_the_kernels_page_names_no_source_files_or_internals():
    text = PAGE.read_text()
    # the user's own train.py is fine; gpuprof's files are not
    assert not re.findall(r"\b(?:gpuprof|gpuprofd|bench|shim|daemon|tests)/[\w/]*\.py\b", text)
    for word in ("shim", "fixture", "bench/"):
        assert word not in text.lower(), word
    assert "benchmarks.md" in text  # what was measured links to how


def test_the_kernels_page_says_what_a_cpu_only_traced_run_gives():
    text = PAGE.read_text()
    section = text.split("### On a machine without a GPU", 1)[1].split("\n## ", 1)[0]
    assert "no GPU kernels" in section and "--kind op" in section
    assert "not their CPU time" in section
