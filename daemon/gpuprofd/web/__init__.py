"""The HTTP side: aiohttp app, /api/v1 JSON, live WebSocket, /metrics, static/ (the page).
May import storage, sampling and gpuprof; nothing below imports web."""
