"""gpuprofd: the per-node gpuprof daemon (ingest, sampling, storage, insights)
and ``gpuprofctl``, its command-line companion.

Start it with ``python -m gpuprofd`` (or the ``gpuprofd`` script); the shim
starts one itself when none answers.
"""

from __future__ import annotations

from gpuprof import __version__

__all__ = ["__version__"]
