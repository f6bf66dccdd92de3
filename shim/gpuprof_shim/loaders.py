"""Tell gpuprofd how each DataLoader is set up (the ``loaders`` event).

gpuprofd's stall findings fit their fix to what the run already does: a
loader with persistent workers is not told to make them persistent, one
with ``num_workers=0`` is told to use workers. Only the training process
knows the settings; they are read from each loader iterator torch hands
out (``_num_workers``, ``_persistent_workers``, ``_pin_memory``,
``_prefetch_factor``: a few attribute reads per epoch). A new combination
of settings sends the whole list again (at most ``MAX_LOADERS``); the send
never blocks (see :mod:`gpuprof_shim.sender`), and nothing here raises.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from gpuprof.protocol import MAX_LOADERS, MAX_PREFETCH_FACTOR, MAX_WORKERS
from gpuprof_shim import messages

log = logging.getLogger("gpuprof.shim")


def loader_settings(it: object) -> dict[str, Any] | None:
    """The settings of *it*, a torch DataLoader iterator (``num_workers``,
    ``persistent_workers``, ``pin_memory``, ``prefetch_factor``: None with no
    workers), or None for any other iterator or out-of-range values. Never
    imports torch."""
    mod = sys.modules.get("torch.utils.data.dataloader")
    cls = getattr(mod, "_BaseDataLoaderIter", None)
    if cls is None or not isinstance(it, cls):
        return None
    workers = getattr(it, "_num_workers", None)
    persistent = getattr(it, "_persistent_workers", False)
    pin = getattr(it, "_pin_memory", False)
    if type(workers) is not int or not 0 <= workers <= MAX_WORKERS:
        return None
    prefetch = getattr(it, "_prefetch_factor", None) if workers else None
    if workers and (type(prefetch) is not int or not 1 <= prefetch <= MAX_PREFETCH_FACTOR):
        return None
    return {
        "num_workers": workers,
        "persistent_workers": bool(persistent),
        "pin_memory": bool(pin),
        "prefetch_factor": prefetch,
    }


class LoaderReporter:
    """Sends the run's DataLoader settings when a new combination appears.

    Args:
        run_key: the run the events belong to.
        send: the sender's non-blocking ``send`` (True if queued).
    """

    def __init__(self, run_key: str, send: Callable[[dict[str, Any]], bool]) -> None:
        self.run_key = run_key
        self._send = send
        self.configs: list[dict[str, Any]] = []
        """The distinct settings seen, in first-use order."""
        self.errors = 0
        """Iterators whose settings could not be read or sent (internal errors)."""

    def on_iterator(self, it: object) -> None:
        """Report *it*'s settings if they are new; never raises."""
        try:
            cfg = loader_settings(it)
            if cfg is None or cfg in self.configs or len(self.configs) >= MAX_LOADERS:
                return
            self.configs.append(cfg)
            self._send(messages.loaders(self.run_key, self.configs))
        except Exception:
            self.errors += 1
            log.debug("gpuprof: could not report DataLoader settings", exc_info=True)
