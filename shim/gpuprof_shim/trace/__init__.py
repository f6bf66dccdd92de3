"""``torch.profiler`` trace windows: which kernels a step runs, and how long
each takes.

- :mod:`~gpuprof_shim.trace.options`: the user's trace options, checked.
- :mod:`~gpuprof_shim.trace.windows`: which steps are profiled, the profiler
  started and stopped between steps, each window's ``kernels`` event and
  chrome trace.
- :mod:`~gpuprof_shim.trace.fold`: torch's Kineto events folded into kernel
  aggregates.
- :mod:`~gpuprof_shim.trace.guard`: the wrappers on torch's profiler classes
  (the user's own profiler seen, ranges left open ended).
"""
