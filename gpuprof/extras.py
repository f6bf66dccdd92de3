"""How a message tells the user to install one of gpuprof's optional extras
(``[project.optional-dependencies]`` in pyproject.toml), worded the same by
every adapter, sink and storage backend that needs one."""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """How to install *extra*: for ``"hf"``, ``pip install 'gpuprof[hf]' (from a
    checkout: pip install -e '.[hf]')``, the command for a package index and
    for a clone (as the README installs)."""
    return f"pip install 'gpuprof[{extra}]' (from a checkout: pip install -e '.[{extra}]')"
