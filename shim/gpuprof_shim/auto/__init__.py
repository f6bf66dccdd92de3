"""Auto mode: training steps found in torch's own calls, with no change to
the training loop.

- :mod:`~gpuprof_shim.auto.machine`: the step state machine (what a step,
  its phases, its micro-batches, evaluation and loader wait are).
- :mod:`~gpuprof_shim.auto.segment`: one step's accumulators.
- :mod:`~gpuprof_shim.auto.gap`: between steps: evaluation or a step's prelude.
- :mod:`~gpuprof_shim.auto.forwards`: finding the model (the root modules)
  and each micro-batch's forward.
- :mod:`~gpuprof_shim.auto.wrappers`: the stand-ins for torch's backward,
  optimizer step, ``GradScaler.step`` and DataLoader fetches that feed the
  machine.

They are installed and restored by :class:`gpuprof_shim.patches.TorchPatches`.
"""
