"""gpuprof: why your PyTorch training run is slow, in one sentence per finding.

    import gpuprof
    with gpuprof.profile("my-run"):
        ...  # your training loop

This package is what the shim and the daemon share (protocol, rules, math)
plus this facade. It stays light: the shim is imported only when
:func:`profile` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpuprof_shim.session import Profiler  # noqa: TID251 - the one lazy import


def profile(run_name: str, **options: Any) -> Profiler:
    """Profile the training loop inside ``with gpuprof.profile(run_name):``.

    See :class:`gpuprof_shim.session.Profiler` for the options.
    """
    from gpuprof_shim.session import Profiler  # noqa: TID251 - the one lazy import

    return Profiler(run_name, **options)


__all__ = ["__version__", "profile"]
