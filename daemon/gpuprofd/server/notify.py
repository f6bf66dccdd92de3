"""Live fan-out across replicas: each replica holds one dedicated Postgres
connection that ``LISTEN``s on :data:`gpuprofd.storage.writes.ingest.NOTIFY_CHANNEL`
(a committed batch notifies the ids of the runs it touched, whichever
replica applied it) and passes the ids to :class:`RunChanges`. Notifications
sent while the connection was down are lost, so after a reconnect every
watcher is told "anything may have changed" (``None``) and re-queries from
its cursors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from gpuprofd.storage import postgres
from gpuprofd.storage.url import StorageUrl
from gpuprofd.storage.writes import NOTIFY_CHANNEL

log = logging.getLogger(__name__)

#: A lost listener connection: first retry after this, doubling up to the cap (s).
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
#: How often the listener checks that its connection is alive, seconds.
CHECK_EVERY_S = 5.0

#: The listener connection's name in ``pg_stat_activity``.
APPLICATION_NAME = "gpuprof-serve-listener"
#: What a watcher is told: the ids of runs that changed, or None (anything may have).
Watcher = Callable[[set[int] | None], None]


class RunChanges:
    """The runs that changed, told to whoever watches (live sockets)."""

    def __init__(self) -> None:
        self._watchers: list[Watcher] = []
        self.seen = 0
        """Notifications received (tests and logs read it)."""

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call *watcher* on each change; returns the function that stops it."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher)

    def tell(self, ids: set[int] | None) -> None:
        self.seen += 1
        for w in list(self._watchers):
            try:
                w(ids)
            except Exception:  # noqa: BLE001 - one watcher must not stop the others
                log.exception("a run-change watcher failed")


def parse_payload(payload: str) -> set[int]:
    """A notification's run ids (anything not an id is ignored)."""
    return {int(p) for p in payload.split(",") if p.strip().isdigit()}


class Listener:
    """The replica's one listening connection (see the module doc)."""

    def __init__(self, url: StorageUrl, changes: RunChanges) -> None:
        assert url.dsn is not None
        self.url = url
        self.changes = changes
        self.connects = 0
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="notify-listener")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._drop()

    def _heard(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        ids = parse_payload(payload)
        log.debug("notify: runs %s changed", sorted(ids))
        self.changes.tell(ids)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)

    async def _connect(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(
            self.url.dsn,
            timeout=postgres.CONNECT_TIMEOUT_S,
            server_settings={"application_name": APPLICATION_NAME},
        )
        await conn.add_listener(NOTIFY_CHANNEL, self._heard)
        self._conn = conn
        self.connects += 1

    async def _run(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            try:
                await self._connect()
                if self.connects > 1:  # what was notified meanwhile is lost: re-query all
                    log.info("notify: listening again on %s", self.url.display)
                    self.changes.tell(None)
                delay = RETRY_FIRST_S
                while not self._conn.is_closed():
                    await asyncio.sleep(CHECK_EVERY_S)
                    await self._conn.execute("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a lost server: retry, said once per loss
                log.warning("notify: listener connection lost (%s); retrying in %.1f s", exc, delay)
            await self._drop()
            await asyncio.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)
