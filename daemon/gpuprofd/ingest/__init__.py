"""Ingest: the ZeroMQ data and control sockets, decoding, the control handlers,
the run lifecycle, and the switch to a fresh database file.

May import storage, sampling and the daemon's lower modules (errors, counters,
lock, maintenance); only the daemon's wiring (``gpuprofd.daemon``) imports it.
"""
