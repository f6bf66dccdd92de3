"""Opening the NVML backend a ``GPUPROF_NVML`` setting names: the real
library, the mock GPU, or a recorded trace replayed through the real code.

Above both :mod:`gpuprofd.sampling.nvml` and :mod:`gpuprofd.sampling.nvml_replay`
(the replay imports the real backend's constants), so neither imports the
other for it. Messages keep the NVML module's logger name, which operators
filter on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from gpuprofd.sampling import nvml_replay
from gpuprofd.sampling.nvml import NO_GPU_NOTE, MockNvml, NvmlBackend, RealNvml, _checked

log = logging.getLogger("gpuprofd.sampling.nvml")


def _import_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def open_backend(
    kind: str, importer: Callable[[], ModuleType] = _import_pynvml
) -> tuple[NvmlBackend | None, str | None]:
    """Open the backend *kind* (``"real"``, ``"mock"`` or ``"replay:PATH"``, see
    :func:`gpuprof.config.nvml_backend`).

    Returns:
        ``(backend, None)``, or ``(None, note)`` when GPU sampling is off;
        the note is logged once here and shown to users in summaries.
    """
    if kind == "mock":
        log.warning("GPUPROF_NVML=mock: GPU metrics come from a fake 'Mock GPU'")
        return MockNvml(), None
    if kind.startswith("replay:"):
        return _open_replay(Path(kind.partition(":")[2]))
    try:
        nv = importer()
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, OSError: all mean "no GPU"
        log.info("%s (%s)", NO_GPU_NOTE, exc.__class__.__name__)
        return None, NO_GPU_NOTE
    return _checked(RealNvml(nv), nv)


def _open_replay(path: Path) -> tuple[NvmlBackend | None, str | None]:
    """The real backend over a replay of the trace at *path*."""
    try:
        fake = nvml_replay.ReplayPynvml.from_file(path)
    except (OSError, ValueError) as exc:
        note = f"GPUPROF_NVML=replay: cannot read the trace {path} ({exc}): GPU metrics skipped"
        log.warning(note)
        return None, note
    log.warning(
        "GPUPROF_NVML=replay: GPU metrics are replayed from %s (%s, %s)",
        path,
        fake.device_name,
        fake.device_uuid,
    )
    fake.nvmlInit()
    return _checked(RealNvml(fake, clock=fake.clock, name="replay"), fake)
