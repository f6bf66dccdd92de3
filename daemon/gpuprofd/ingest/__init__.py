"""Ingest: the ZeroMQ data and control sockets, decoding, and the run lifecycle.

May import storage, sampling and the daemon's leaf modules; only the daemon's wiring
(``gpuprofd.daemon``) imports it.
"""
