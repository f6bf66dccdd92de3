"""The daemon's jobs over its store: the sampler sinks (GPU and host samples
into the store and the live view) and the insights runner (the rules, live
and at a run's end). They sit above both :mod:`gpuprofd.sampling` and
:mod:`gpuprofd.storage`, which is why the sinks are not in ``sampling/``:
sampling is a leaf that storage itself reads (the rollups' SQL)."""
