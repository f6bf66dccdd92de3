"""The database file deleted or replaced under the daemon (``rm gpuprof.db*``
between runs).

Checked at each hello and once a second (:meth:`DbSwitch.check`). A hello
then makes a fresh database at the path and its run is stored there; runs
open at that moment are copied across at once (:mod:`gpuprofd.storage.upkeep.dbrotate`)
and go on there, with a note in their summary. With no run open the daemon
only logs it (no empty file reappears after an ``rm``) and makes the new file
at the next hello. ``gpuprofctl status --format json`` shows it under
``db_file`` / ``db_reopened``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprofd.core.errors import GpuprofdError
from gpuprofd.core.lock import InstanceLock
from gpuprofd.ingest.registry import LiveRun
from gpuprofd.ingest.runservice import RunService
from gpuprofd.storage import schema
from gpuprofd.storage.upkeep import dbrotate
from gpuprofd.storage.writes import Store

log = logging.getLogger(__name__)

#: How often the database path is checked, seconds (a stat; each hello checks too).
DB_CHECK_S = 1.0
#: Database switches remembered for ``ping``.
DB_EVENTS_KEPT = 10


class DbSwitch:
    """Moves the daemon to a fresh database at *db* when its file went.

    Args:
        db: the database path.
        store: the daemon's store (switched between two commits).
        runs: the run service (its lock keeps runs from being created meanwhile).
        db_lock: the flock on the database file, moved to the new file; None: none held.
        request_stop: asks the daemon to exit (when switching fails).
    """

    def __init__(
        self,
        db: Path,
        store: Store,
        runs: RunService,
        db_lock: InstanceLock | None,
        request_stop: Callable[[], None],
    ) -> None:
        self.db = db
        self.store = store
        self.runs = runs
        self.db_lock = db_lock
        self.request_stop = request_stop
        self.events: deque[dict[str, Any]] = deque(maxlen=DB_EVENTS_KEPT)
        """The last switches (and failed ones), for ``ping``'s ``db_reopened``."""
        self._check = asyncio.Lock()
        self._noted: str | None = None
        """The last database problem logged (logged once, not every second)."""

    def file_state(self) -> str:
        """``ok``, what happened to the file (``deleted``, ``replaced``), or
        ``none`` when the database is no file (Postgres)."""
        if self.store.path is None:
            return "none"
        return self.store.file_state() or "ok"

    async def check_periodic(self) -> None:
        """The once-a-second check: only logs while no run is open."""
        await self.check(for_hello=False)

    async def check(self, *, for_hello: bool) -> None:
        """Has the database file been deleted or replaced under us? Then move
        to a fresh database at the path, copying the open runs (see module doc).
        Without open runs only a hello moves (the periodic check logs)."""
        if self.store.file_state() is None:
            return
        async with self._check, self.runs.lock:  # no run is half-created meanwhile
            state = self.store.file_state()
            if state is None:
                return
            live = list(self.runs.registry.live.values())
            if not live and not for_hello:
                self._note(
                    state,
                    logging.WARNING,
                    "no run is open; a fresh database is made there at the next run "
                    "(host samples meanwhile are not kept)",
                )
                return
            await self._reopen(state, live)

    def _note(self, state: str, level: int, what: str) -> None:
        key = f"{state}: {what}"
        if self._noted != key:
            self._noted = key
            log.log(
                level, "database %s was %s under gpuprofd %d: %s", self.db, state, os.getpid(), what
            )

    async def _reopen(self, state: str, live: list[LiveRun]) -> None:
        db = self.db
        if state == "deleted":  # nothing at the path: try it before letting go of the old file
            try:
                await asyncio.to_thread(schema.prepare, db)
            except GpuprofdError as exc:
                self._note(
                    state,
                    logging.ERROR,
                    f"no fresh database can be made there ({exc}); runs are written "
                    "into the deleted file, lost when gpuprofd exits: fix the path, "
                    "or run `gpuprofctl stop` and start again",
                )
                return
        if self.db_lock is not None and not await asyncio.to_thread(self.db_lock.reacquire):
            self._note(
                state,
                logging.ERROR,
                "the file now there is served by another gpuprofd; runs are written "
                "into the deleted file, lost when this daemon exits: run "
                "`gpuprofctl stop` for this one",
            )
            return
        run_ids = sorted({r.run_id for r in live})
        ids: dict[int, int] = {}

        async def write_new(new: Any, snap: dbrotate.Snapshot) -> None:
            ids.update(await dbrotate.write_live_runs(new, snap))

        try:
            await self.store.reopen(
                lambda old: dbrotate.read_live_runs(old, run_ids),
                lambda: schema.prepare(db),
                write_new,
            )
        except Exception as exc:
            log.error(
                "database %s was %s under gpuprofd %d and switching to it failed (%s): "
                "runs cannot be stored; gpuprofd exits (open runs are lost; the next run "
                "starts a fresh daemon)",
                db,
                state,
                os.getpid(),
                exc,
            )
            self.events.append(
                {"wall_ns": time.time_ns(), "was": state, "error": str(exc), "runs_lost": run_ids}
            )
            self.request_stop()
            return
        self._noted = None
        for r in live:
            old_id = r.run_id
            r.run_id = ids.get(old_id, old_id)
            renamed = f" (now run {r.run_id})" if r.run_id != old_id else ""
            r.notes.append(
                f"the database file was {state} during this run: gpuprofd made a fresh one at "
                f"{db} and copied this run's rows into it{renamed}"
            )
        carried = ", ".join(f"{r.run_id} {r.run_name!r}" for r in live) or "none"
        log.warning(
            "database %s was %s under gpuprofd %d: made a fresh database there; open "
            "runs copied into it: %s",
            db,
            state,
            os.getpid(),
            carried,
        )
        self.events.append(
            {"wall_ns": time.time_ns(), "was": state, "runs_copied": [r.run_id for r in live]}
        )
