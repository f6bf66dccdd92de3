"""How a message tells the user to install one of gpuprof's optional extras
(``[project.optional-dependencies]`` in pyproject.toml), worded the same by
every adapter, sink and storage backend that needs one.

gpuprof is installed from its checkout (the README's Install section): the
name ``gpuprof`` on PyPI is another project, so a hint never installs
from a package index."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

#: A pyproject.toml's ``[project]`` table (up to the next table).
_PROJECT = re.compile(r"^\[project\][ \t]*$(.*?)(?=^\[|\Z)", re.M | re.S)
#: ``name = "gpuprof"`` in that table.
_OUR_NAME = re.compile(r"""^[ \t]*name[ \t]*=[ \t]*["']gpuprof["'][ \t]*(?:#.*)?$""", re.M)


def checkout_root(package_dir: Path | None = None) -> Path | None:
    """The gpuprof checkout the installed package runs from (the parent of
    the ``gpuprof`` package directory, if its pyproject.toml names the
    project ``gpuprof``), or None (installed from a wheel, or unreadable).
    *package_dir* defaults to this package's directory."""
    package_dir = package_dir or Path(__file__).resolve().parent
    pyproject = package_dir.parent / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    project = _PROJECT.search(text)
    return package_dir.parent if project and _OUR_NAME.search(project.group(1)) else None


def install_hint(extra: str, package_dir: Path | None = None) -> str:
    """How to install *extra*, a command that works as written: for ``"hf"``,
    ``pip install -e '/home/me/gpuprof[hf]'`` naming the checkout the
    installed gpuprof runs from (see :func:`checkout_root`), else
    ``pip install -e '.[hf]' in your gpuprof checkout``."""
    root = checkout_root(package_dir)
    if root is None:
        return f"pip install -e '.[{extra}]' in your gpuprof checkout"
    return f"pip install -e {shlex.quote(f'{root}[{extra}]')}"
