"""What is shown of runs: the runs table's rows, a run's summary and its
group, the kernel table. One room that ``gpuprofctl`` (:mod:`gpuprofd.commands`)
and the dashboard's API (:mod:`gpuprofd.web`) both read, so no figure is
computed twice; it reads storage and never imports either of them."""
