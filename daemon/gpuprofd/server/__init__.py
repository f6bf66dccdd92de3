"""The team-server role (``gpuprofd serve``): HTTP ingest from node daemons,
storage, insights per run, the dashboard behind a login. No ZeroMQ, no samplers.
May import web, storage, sampling and gpuprof; nothing imports server."""
