"""Framework adapters: one module per framework, each importing its framework
only when the adapter itself is imported (``import gpuprof`` imports none).

- :mod:`.lightning`: :class:`~.lightning.LightningCallback` (PyTorch Lightning)
- :mod:`.hf`: :class:`~.hf.HFTrainerCallback` (transformers ``Trainer``)
- :mod:`.deepspeed`: :func:`~.deepspeed.wrap_deepspeed_engine`

HF ``accelerate`` loops need no adapter: its wrapped optimizer calls the real
``optimizer.step()`` only when gradients sync, so auto mode counts real updates.
"""
