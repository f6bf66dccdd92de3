"""gpuprof: why your PyTorch training run is slow, in one sentence per finding.

    import gpuprof
    with gpuprof.profile("my-run"):
        ...  # your training loop

This package is what the shim and the daemon share (protocol, rules, math)
plus this facade. It stays light: the shim is imported only when
:func:`profile` is called, and a framework adapter (``LightningCallback``,
``HFTrainerCallback``, ``wrap_deepspeed_engine``) and its framework only
when that name is first looked up. :class:`TransformerArch` (analytic
FLOPs for MFU) is pure Python and imported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuprof.flops import TransformerArch

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpuprof_shim.adapters.deepspeed import wrap_deepspeed_engine  # noqa: TID251
    from gpuprof_shim.adapters.hf import HFTrainerCallback  # noqa: TID251
    from gpuprof_shim.adapters.lightning import LightningCallback  # noqa: TID251
    from gpuprof_shim.session import Profiler  # noqa: TID251 - the one lazy import

#: Adapter name -> the shim module defining it, imported on first lookup.
_ADAPTERS = {
    "LightningCallback": "gpuprof_shim.adapters.lightning",
    "HFTrainerCallback": "gpuprof_shim.adapters.hf",
    "wrap_deepspeed_engine": "gpuprof_shim.adapters.deepspeed",
}


def profile(run_name: str, **options: Any) -> Profiler:
    """Profile the training loop inside ``with gpuprof.profile(run_name):``.

    See :class:`gpuprof_shim.session.Profiler` for the options.
    """
    from gpuprof_shim.session import Profiler  # noqa: TID251 - the one lazy import

    return Profiler(run_name, **options)


def __getattr__(name: str) -> Any:
    """Framework adapters, imported lazily (with their framework) on first use."""
    module = _ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_ADAPTERS])


__all__ = [
    "HFTrainerCallback",
    "LightningCallback",
    "TransformerArch",
    "__version__",
    "profile",
    "wrap_deepspeed_engine",
]
