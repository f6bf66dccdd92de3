"""Hugging Face transformers: :class:`HFTrainerCallback` profiles each
``trainer.train()``.

The Trainer says when a step ends: a step is one ``on_step_end`` (an
optimizer update, or its skip under fp16 loss scaling), and its
micro-batches are the ``on_substep_end`` calls before it plus the boundary
micro-batch. Phases (forward, backward, optimizer) are still timed by auto
mode's patches (``step_source="external"``). Evaluation during training
(``eval_strategy``) runs under ``no_grad`` after a step ends and becomes the
next step's ``eval`` time (or the run's trailing eval); ``on_evaluate`` tells
auto mode the loop ended, so even a 1-2 batch evaluation counts as eval.

Callbacks are never assumed to come in begin/end pairs: a step end with no
profile running is ignored, a second ``train()`` starts a new run, and a
``train()`` that raised (the Trainer has no exception callback) is stopped,
marked failed, when the next one begins, or at once if the callback is used
as a context manager around ``train()``.

Without transformers this module still imports (so ``help(gpuprof)`` works);
making a callback then raises ImportError naming the ``hf`` extra.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuprof_shim.adapters._missing import framework_missing
from gpuprof_shim.adapters._run import AdapterRun, EndsRunOnExit
from gpuprof_shim.session import Profiler

log = logging.getLogger("gpuprof.shim")

try:
    from transformers import TrainerCallback
except ImportError as exc:  # the callback still exists; making one raises
    TrainerCallback = framework_missing("HFTrainerCallback", "Hugging Face transformers", "hf", exc)


class HFTrainerCallback(EndsRunOnExit, TrainerCallback):
    """Profile ``trainer.train()``: ``Trainer(..., callbacks=[gpuprof.HFTrainerCallback("run")])``.

    So that a ``train()`` that raises is marked failed right away, also
    enter the callback around it::

        cb = gpuprof.HFTrainerCallback("run")
        trainer = Trainer(..., callbacks=[cb])
        with cb:
            trainer.train()

    Nothing here raises into training: if profiling cannot start (another
    profile is active in this process), a warning is logged and training
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
        self._run = AdapterRun(
            "HFTrainerCallback", run_name, profile_options, {"step_source": "external"}
        )
        self._substeps = 0

    @property
    def profiler(self) -> Profiler | None:
        """The profile of the ``train()`` in progress, or of the last one."""
        return self._run.profiler

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer event: ``train()`` starts; a new profile begins."""
        self._substeps = 0
        self._run.start()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer event: a micro-batch before the accumulation boundary ended."""
        self._substeps += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer event: an optimizer step ended; so does gpuprof's step."""
        micro, self._substeps = self._substeps + 1, 0
        self._run.mark_step_end(skipped=_step_was_skipped(kwargs.get("optimizer")), micro=micro)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer event: an evaluation loop ended."""
        self._run.seal_eval()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer event: ``train()`` finished; the profile stops."""
        self._run.stop()


def _step_was_skipped(optimizer: Any) -> bool:
    """accelerate's wrapped optimizer knows whether its last step was
    skipped (fp16 loss scaling found inf/NaN gradients)."""
    try:
        return bool(getattr(optimizer, "step_was_skipped", False))
    except Exception:
        log.debug("gpuprof: could not read step_was_skipped", exc_info=True)
        return False
