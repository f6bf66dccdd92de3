"""The link to gpuprofd: the data socket (a :class:`~gpuprof_shim.sender.Sender`)
and the control requests, ``hello`` at the start (auto-starting a daemon if
none answers) and ``bye`` at the end. Never raises for the daemon's
problems: it records them in :attr:`DaemonLink.problem` for the summary."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprof import config
from gpuprof_shim import autostart, control
from gpuprof_shim.sender import Sender

log = logging.getLogger("gpuprof.shim")

#: After ``hello`` succeeds, how long to wait for the data connection, ms.
DATA_CONNECT_TIMEOUT_MS = 1000


class DaemonLink:
    """One profile's connection to gpuprofd.

    Args:
        socket_dir: gpuprofd's socket directory.
        db: the database a daemon started here would use.
        autostart: start a gpuprofd if none answers ``hello``.
        server: the team server such a gpuprofd forwards to (its key from
            this process's ``GPUPROF_API_KEY``/``GPUPROF_API_KEY_FILE``).
    """

    def __init__(
        self, socket_dir: Path, db: str, autostart: bool, server: str | None = None
    ) -> None:
        self.socket_dir = socket_dir
        self.db = db
        self.autostart = autostart
        #: The team server a daemon started here forwards to (``--server``).
        self.server = server
        self.sender: Sender | None = None
        #: The control endpoint (set by :meth:`connect`).
        self.control: str | None = None
        #: gpuprofd accepted the run.
        self.ok = False
        #: What went wrong with the daemon, for the summary; None if nothing.
        self.problem: str | None = None
        self.run_id: int | None = None
        #: The hello reply's dashboard fields (None: no reply).
        self.hello_reply: dict[str, Any] | None = None

    def connect(self, hello: Callable[[], dict[str, Any]]) -> None:
        """Open the data socket and send ``hello`` (the message *hello*
        builds, once per attempt); on success :attr:`ok`, :attr:`run_id` and
        :attr:`db` (the daemon's database) are set."""
        try:
            ingest = config.ingest_endpoint(self.socket_dir)
            self.control = config.control_endpoint(self.socket_dir)
        except ValueError as exc:
            self.problem = f"gpuprofd unreachable ({exc})"
            log.warning("gpuprof: %s", exc)
            return
        self.sender = Sender(ingest)
        self.sender.connect()

        def request() -> dict[str, Any] | None:
            ctx = self.sender.context if self.sender else None
            raw = control.request(ctx, self.control or "", hello(), control.HELLO_TIMEOUT_MS)
            return control.parse_hello_reply(raw)

        control_path = self.socket_dir / config.CONTROL_SOCKET_NAME
        reply = request() if control_path.exists() else None
        if reply is None and self.autostart:
            argv = autostart.daemon_argv(self.socket_dir, Path(self.db), self.server)
            reply = autostart.start_and_hello(request, self.socket_dir, argv)
        if reply is None:
            self.problem = f"gpuprofd unreachable at {self.socket_dir}"
            if self.autostart:
                why = autostart.log_tail(self.socket_dir)
                self.problem += (
                    f" (auto-start failed: {why})"
                    if why
                    else f" (auto-start failed, see {self.socket_dir / config.LOG_NAME})"
                )
            log.warning("gpuprof: %s; running without it", self.problem)
        elif not reply["ok"]:
            self.problem = f"gpuprofd refused the run: {reply['error']}"
            log.warning("gpuprof: %s", self.problem)
        else:
            self.ok = True
            self.hello_reply = reply
            self.run_id = reply["run_id"]
            self.db = reply["db"]
            if not self.sender.wait_connected(DATA_CONNECT_TIMEOUT_MS):
                log.warning("gpuprof: the data socket is not connected yet; early steps may drop")
            for note in reply["notes"]:
                log.info("gpuprof: %s", note)

    def dashboard_line(self, run_id: int | None) -> str:
        """``gpuprof dashboard: http://127.0.0.1:7311/#/run/3``, or
        ``gpuprof dashboard: none (why)``: from the hello reply."""
        reply = self.hello_reply
        if reply is None:
            return f"gpuprof dashboard: none ({self.problem or 'gpuprofd unreachable'})"
        url = reply.get("dashboard_url")
        if isinstance(url, str) and url.startswith("http"):
            return f"gpuprof dashboard: {url}/#/run/{run_id}"
        if "dashboard_url" not in reply:
            pid = reply.get("daemon_pid")
            return (
                f"gpuprof dashboard: none (the running gpuprofd, pid {pid}, predates the "
                "dashboard: gpuprofctl stop, and the next run starts a new one)"
            )
        why = reply.get("dashboard_why_not")
        return f"gpuprof dashboard: none ({why if isinstance(why, str) else 'not served'})"

    def bye(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Send the ``bye`` request *msg*; the daemon's summary, or None
        (then :attr:`problem` says why)."""
        assert self.sender is not None
        raw = control.request(
            self.sender.context,
            self.control or "",
            msg,
            recv_timeout_ms=control.BYE_TIMEOUT_MS,
            send_timeout_ms=control.BYE_SEND_TIMEOUT_MS,
        )
        summary = control.parse_bye_reply(raw)
        if summary is None:
            refused = raw.get("error") if isinstance(raw, dict) and raw.get("ok") is False else None
            if isinstance(refused, str):
                self.problem = (
                    f"gpuprofd could not finish the run ({refused[:300]}); "
                    "summary from local counts only"
                )
            else:
                self.problem = "gpuprofd did not answer at exit; summary from local counts only"
            log.warning("gpuprof: %s", self.problem)
        return summary

    def local_note(self, steps: int) -> str:
        """The summary's line when the daemon's summary is missing; *steps*:
        the steps counted here (all dropped when there was no sender)."""
        sent = self.sender.sent if self.sender else 0
        dropped = self.sender.dropped if self.sender else steps
        problem = self.problem or "gpuprofd unreachable"
        if self.ok:
            return f"{problem} ({sent} events sent, {dropped} dropped in this process)"
        return f"{problem}: {sent + dropped} events not recorded (dropped)"

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
