"""PyTorch Lightning: :class:`LightningCallback` profiles each ``trainer.fit()``.

Steps are found by auto mode, which already matches Lightning's loops:
automatic optimization runs ``training_step`` and ``backward`` inside
``optimizer.step(closure)`` (one micro-batch), and under
``accumulate_grad_batches`` the batches before the boundary run the closure
outside any step (one micro-batch each); manual optimization with several
optimizers makes one step per cycle of the first optimizer that steps.
Validation and the sanity check run under ``torch.inference_mode``/``no_grad``
and become the next step's ``eval`` time, not loader wait; the callback
tells auto mode when each validation loop ends, so that a short one (the
sanity check's 2 batches) right before training is not taken for a
teacher's forward.

Imports ``lightning.pytorch`` (or ``pytorch_lightning`` if only that is
installed). The callback subclasses the ``Callback`` of every one of the two
that is installed, so either package's ``Trainer`` accepts it. With neither,
this module still imports (so ``help(gpuprof)`` works); making a callback
then raises ImportError naming the ``lightning`` extra.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpuprof_shim.adapters._missing import framework_missing
from gpuprof_shim.adapters._run import AdapterRun
from gpuprof_shim.session import Profiler


def _callback_bases() -> tuple[type, ...]:
    bases = []
    missing: ImportError | None = None
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError as exc:
            missing = missing or exc
    if not bases:  # the callback still exists; making one raises
        return (framework_missing("LightningCallback", "PyTorch Lightning", "lightning", missing),)
    return tuple(dict.fromkeys(bases))  # one class if both names are the same package


class LightningCallback(*_callback_bases()):  # type: ignore[misc]
    """Profile ``trainer.fit()``: ``Trainer(callbacks=[gpuprof.LightningCallback("run")])``.

    A new profile starts when fitting starts (``on_fit_start``) and stops
    when fitting ends, or on an exception (the run is then marked failed).
    Nothing here raises into training: if profiling cannot start (another
    profile is active in this process), a warning is logged and the fit
    runs unprofiled.

    Args:
        run_name: the run's name, as for :func:`gpuprof.profile`.
        **profile_options: other :func:`gpuprof.profile`
            options (``flops_per_step``, ``dtype``, ``socket_dir``, ...);
            not ``auto`` or ``step_source``, which the callback sets.

    Raises:
        TypeError: ``auto`` or ``step_source`` was passed.
        ValueError: an invalid profile option.
    """

    def __init__(self, run_name: str, **profile_options: Any) -> None:
        super().__init__()
        self._run = AdapterRun(
            "LightningCallback", run_name, profile_options, {"step_source": "optimizer"}
        )

    @property
    def profiler(self) -> Profiler | None:
        """The profile of the fit in progress, or of the last one."""
        return self._run.profiler

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Lightning hook: fitting starts (before the sanity check)."""
        self._run.start()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Lightning hook: fitting finished normally."""
        self._run.stop()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Lightning hook: a validation loop (the sanity check's too) ended."""
        self._run.seal_eval()

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        """Lightning hook: the sanity check's validation ended."""
        self._run.seal_eval()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Lightning hook: fitting raised (``KeyboardInterrupt`` included)."""
        self._run.stop(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Lightning hook: a stage ends; stops a profile still running."""
        if stage == "fit":
            self._run.stop()
