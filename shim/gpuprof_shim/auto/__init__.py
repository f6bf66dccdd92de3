"""Auto mode: training steps found in torch's own calls, with no change to
the training loop.

- :mod:`~gpuprof_shim.auto.machine`: the step state machine (what a step,
  its phases, its micro-batches, evaluation and loader wait are).
- :mod:`~gpuprof_shim.auto.segment`: one step's accumulators.
- :mod:`~gpuprof_shim.auto.gap`: between steps: evaluation or a step's prelude.

The torch patches that feed the machine are :mod:`gpuprof_shim.patches`.
"""
