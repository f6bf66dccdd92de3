"""Sampling: NVML (real, mock, replay), the host sampler, per-second GPU rollups.

A leaf of the daemon: imports ``gpuprof`` and the daemon's leaf modules (errors, counters),
never storage, ingest, commands or the web app.
"""
