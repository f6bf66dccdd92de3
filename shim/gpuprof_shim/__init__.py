"""gpuprof's in-process shim: patches torch, times steps and phases, and
pushes small messages to gpuprofd (the daemon of the run's database, or a
node-wide one).

Nothing here runs at import: ``gpuprof.profile()`` builds a
:class:`gpuprof_shim.session.Profiler`, whose ``__enter__`` connects and
(in auto mode) patches torch, and whose ``__exit__`` restores everything.
The shim imports no torch outside auto mode and nothing heavy at all.
"""
