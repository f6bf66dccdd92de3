"""The base an adapter takes when its framework is not installed, so that
``gpuprof.HFTrainerCallback`` (and ``help(gpuprof)``, ``from gpuprof import
*``) still resolves to the adapter with its docstring: only making one
raises :class:`ImportError`, naming the extra to install."""

from __future__ import annotations

from typing import Any, NoReturn

from gpuprof.extras import install_hint


def framework_missing(adapter: str, framework: str, extra: str, cause: ImportError | None) -> type:
    """A base class whose construction raises ``ImportError("gpuprof.ADAPTER
    needs FRAMEWORK: <install hint for EXTRA>")`` from *cause* (the failed
    import of the framework)."""
    message = f"gpuprof.{adapter} needs {framework}: {install_hint(extra)}"

    def __new__(cls: type, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImportError(message) from cause

    return type(f"{adapter}Base", (), {"__new__": __new__, "__module__": __name__})
