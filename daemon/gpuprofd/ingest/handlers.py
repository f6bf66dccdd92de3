"""The control requests: ``hello``, ``bye``, ``ping`` and ``stop``.

``gpuprofctl stop`` sends ``stop``: with no open run the daemon exits at
once; else it refuses new runs (their hello is answered with why: they run
unprofiled) and exits when its open runs have ended
(:meth:`ControlHandlers.exit_when_drained`, run once a second). ``now`` exits
at once: open runs stay ``running`` in the database and the next daemon
re-adopts them while their processes live (their events meanwhile are dropped).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.control import Handler
from gpuprofd.ingest.data import Ingest
from gpuprofd.ingest.dbswitch import DbSwitch
from gpuprofd.ingest.runservice import RunService
from gpuprofd.services.evidence import EvidencePlanner
from gpuprofd.storage import reads

log = logging.getLogger(__name__)

#: How often a stopping daemon checks whether its open runs have ended, seconds.
STOP_CHECK_S = 1.0
#: How long the reply to an immediate ``stop`` has to go out before the exit, seconds.
STOP_REPLY_S = 0.05


class ControlHandlers:
    """The handler of each control request type (:meth:`table`).

    Args:
        db: the database as said to people: a path, or a URL without its password.
        socket_dir: the socket directory (for ``ping``).
        runs: the run service (hello, bye; its registry lists the live runs).
        ingest: the data socket's reader (its received count, for ``ping``).
        db_switch: checked at each hello; its file state and events go to ``ping``.
        drops: this daemon's drop counts (for ``ping``).
        notes: told to each run at hello (e.g. why GPU metrics are off).
        flush_rollups: queues the open per-second GPU rows (before a summary).
        gpu_status: the GPU loops' rates, or why they are off (for ``ping``).
        request_stop: asks the daemon to shut down.
        evidence: the evidence requests, sent on ``ack`` replies (None: none).
        started_wall_ns: when the daemon started, wall-clock nanoseconds.
        dashboard_url: the dashboard's URL (told at hello and ping); None: none served ...
        dashboard_why_not: ... and why (told at hello).
        forward_status: the forwarder's state and outbox (for ``ping``); None: no ``--server``.
        forward_server: the team server runs are forwarded to (told at hello); None: none.
    """

    def __init__(
        self,
        *,
        db: str,
        socket_dir: Path,
        runs: RunService,
        ingest: Ingest,
        db_switch: DbSwitch,
        drops: DropCounter,
        notes: Sequence[str],
        flush_rollups: Callable[[], None],
        gpu_status: Callable[[], dict[str, Any]],
        request_stop: Callable[[], None],
        started_wall_ns: int | None = None,
        dashboard_url: str | None = None,
        dashboard_why_not: str | None = None,
        forward_status: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        forward_server: str | None = None,
        evidence: EvidencePlanner | None = None,
        exits_idle: bool = False,
    ) -> None:
        self.evidence = evidence
        self.exits_idle = exits_idle
        """This daemon exits when idle (``--idle-exit`` > 0), as the one a
        run auto-starts: told in ``hello`` so that every run it serves, not
        only the one that started it, starts the next if it is killed."""
        self.db = db
        self.socket_dir = socket_dir
        self.runs = runs
        self.ingest = ingest
        self.db_switch = db_switch
        self.drops = drops
        self.notes = list(notes)
        self.flush_rollups = flush_rollups
        self.gpu_status = gpu_status
        self.request_stop = request_stop
        self.started_wall_ns = time.time_ns() if started_wall_ns is None else started_wall_ns
        self.stopping = False
        """``gpuprofctl stop``: no new runs; exit once the open ones end."""
        self.dashboard_url = dashboard_url
        self.dashboard_why_not = dashboard_why_not
        self.forward_status = forward_status
        self.forward_server = forward_server

    def table(self) -> dict[str, Handler]:
        """Request type → handler, for :class:`gpuprofd.ingest.control.ControlServer`."""
        return {
            "hello": self.hello,
            "bye": self.bye,
            "ping": self.ping,
            "stop": self.stop,
            "ack": self.ack,
        }

    async def hello(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Register (or re-adopt) a run; refused while stopping, unless it is already open."""
        if self.stopping and self.runs.registry.get(msg["run_key"]) is None:
            return {
                "ok": False,
                "stopping": True,
                "error": "gpuprofd is stopping (gpuprofctl "
                "stop) and takes no new runs: it exits once its open runs end; "
                "`gpuprofctl stop --now` ends it at once",
            }
        await self.db_switch.check(for_hello=True)
        live = await self.runs.hello(msg)
        note = self._forward_note(msg.get("server"))
        if note is not None and note not in live.notes:
            live.notes.append(note)  # in the run's summary
        return {
            "ok": True,
            "run_id": live.run_id,
            "acked": await reads.stored_seq(self.runs.store, live.run_id),
            "db": str(self.db),
            "daemon_pid": os.getpid(),
            "notes": [*self.notes, *([note] if note else [])],
            "dashboard_url": self.dashboard_url,
            "dashboard_why_not": self.dashboard_why_not,
            "forward_server": self.forward_server,
            "exits_idle": self.exits_idle,
        }

    def _forward_note(self, wanted: Any) -> str | None:
        """Why a run that asks for team server *wanted* (``GPUPROF_SERVER``,
        ``profile(server=)``) is not forwarded there; None when it is, or asks none."""
        if not isinstance(wanted, str) or not wanted:
            return None
        wanted = wanted.rstrip("/")
        if wanted == self.forward_server:
            return None
        now = (
            f"forwards to {self.forward_server}"
            if self.forward_server
            else "forwards to no team server"
        )
        return (
            f"not forwarded to {wanted}: the running gpuprofd of this database "
            f"(pid {os.getpid()}) {now}; start it with --server {wanted}, or gpuprofctl stop "
            "and the next run starts one that does"
        )

    async def ack(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The highest shim sequence number of the run that is committed
        (the shim frees its resend buffer up to it); refused for a run that
        has not said hello to this daemon (the shim then says hello again).
        Carries the run's pending evidence request, if any (``evidence``;
        the shim's report on the last one comes in the request's ``evidence``)."""
        live = self.runs.registry.get(msg["run_key"])
        if live is None or not live.helloed:
            return {"ok": False, "error": "unknown run: say hello"}
        reply = {"ok": True, "acked": await reads.stored_seq(self.runs.store, live.run_id)}
        if self.evidence is not None:
            request = self.evidence.reply(live.run_id, msg.get("evidence"))
            if request is not None:
                reply["evidence"] = request
        return reply

    async def bye(self, msg: dict[str, Any]) -> dict[str, Any]:
        """End a run; the reply carries its summary."""
        # the open second holds the run's last GPU samples: store it before the
        # summary reads (a second split in two rows merges exactly)
        self.flush_rollups()
        return {"ok": True, "summary": await self.runs.bye(msg)}

    async def ping(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The daemon's state, for ``gpuprofctl status`` and the shim's "is one there?"."""
        return {
            "ok": True,
            "pid": os.getpid(),
            "db": str(self.db),
            "socket_dir": str(self.socket_dir),
            "started_wall_ns": self.started_wall_ns,
            "live_runs": [r.as_ping() for r in self.runs.registry.live.values()],
            "dropped": self.drops.snapshot(),
            "received": self.ingest.received,
            "gpu_sampling": self.gpu_status(),
            "db_file": self.db_switch.file_state(),
            "db_reopened": list(self.db_switch.events),
            "stopping": self.stopping,
            "dashboard_url": self.dashboard_url,
            "forward": await self.forward_status() if self.forward_status is not None else None,
        }

    async def stop(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``gpuprofctl stop``: exit once the open runs end, or now (see module doc)."""
        open_runs = len(self.runs.registry.live)
        if msg.get("now") or not open_runs:
            log.info("stop requested (%s): exiting", "now" if msg.get("now") else "no open run")
            asyncio.get_running_loop().call_later(STOP_REPLY_S, self.request_stop)
            return {"ok": True, "pid": os.getpid(), "exiting": True, "open_runs": open_runs}
        self.stopping = True
        log.info("stop requested: no new runs; exiting once %d open run(s) end", open_runs)
        return {"ok": True, "pid": os.getpid(), "exiting": False, "open_runs": open_runs}

    async def exit_when_drained(self) -> None:
        """After a ``stop`` that had to wait: exit once no run is open."""
        if self.stopping and not self.runs.registry.live:
            log.info("stop requested and no run is open: exiting")
            self.request_stop()
