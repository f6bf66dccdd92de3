"""The link to gpuprofd: the data socket (a :class:`~gpuprof_shim.sender.Sender`)
and the control requests, ``hello`` at the start (auto-starting a daemon if
none answers) and ``bye`` at the end. Never raises for the daemon's
problems: it records them in :attr:`DaemonLink.problem` for the summary."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprof import config
from gpuprof.protocol import PROTOCOL_VERSION
from gpuprof_shim import autostart, control
from gpuprof_shim.resend import ResendBuffer
from gpuprof_shim.sender import Sender

log = logging.getLogger("gpuprof.shim")

#: After ``hello`` succeeds, how long to wait for the data connection, ms.
DATA_CONNECT_TIMEOUT_MS = 1000
#: How often the resend thread asks gpuprofd what it has stored, seconds:
#: the buffer holds about this long of messages plus the writer's commit lag.
ACK_INTERVAL_S = 0.25
#: Unanswered ``ack`` requests in a row after which the daemon counts as gone
#: (each waits :data:`gpuprof_shim.control.ACK_TIMEOUT_MS`): ~1.5 s, longer
#: than a loaded daemon's pauses seen on the 2-core box (2026-12-04).
GONE_AFTER_MISSES = 3
#: At exit, how long to wait for gpuprofd to acknowledge everything before
#: ``bye``, seconds: room for an auto-start of a new daemon
#: (:data:`gpuprof_shim.autostart.WAIT_S`) and its catching up.
SETTLE_WAIT_S = autostart.WAIT_S + 10.0
#: The same when another (systemd) started the daemon: its restart
#: (``Restart=always``, 100 ms) and start take a few seconds, seconds.
SETTLE_WAIT_EXTERNAL_S = 10.0
#: At exit, how long the control socket file may stay absent before the
#: wait ends, seconds: a daemon that exits cleanly (``gpuprofctl stop``,
#: SIGTERM) removes it, a killed one leaves it; a restart binds anew in well
#: under a second once started.
SETTLE_ABSENT_S = 3.0


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
        #: This process started the daemon.
        self.started_daemon = False
        #: This process starts the next daemon if this one is killed: it
        #: started it, or may auto-start one and the daemon is the auto-started
        #: kind (it exits when idle; a later run joined it): not a node-wide
        #: (systemd's) daemon, whose restart is its manager's.
        self.replaces_daemon = False
        #: Times a new daemon took the run over (hello again, resent).
        self.reconnects = 0
        #: Where the daemon's evidence requests go (they ride the ``ack``
        #: replies); None: not asked for (set by the session).
        self.evidence: Any = None
        self._hello: Callable[[], dict[str, Any]] | None = None
        self._run_key: str | None = None
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()
        # at exit (settle): ask for the acknowledgement at once, not on the 4 Hz beat
        self._settling = threading.Event()

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
            self.started_daemon = reply is not None
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
            self.replaces_daemon = self.started_daemon or (
                self.autostart and reply.get("exits_idle") is True
            )
            if not self.sender.wait_connected(DATA_CONNECT_TIMEOUT_MS):
                log.warning("gpuprof: the data socket is not connected yet; early steps may drop")
            for note in reply["notes"]:
                log.info("gpuprof: %s", note)
            if type(reply.get("acked")) is int:  # the daemon stores messages once, by seq
                self._hello = hello
                self._run_key = hello().get("run_key")
                self.sender.keep_unacked(ResendBuffer())
                self._keeper = threading.Thread(
                    target=self._keep, name="gpuprof-resend", daemon=True
                )
                self._keeper.start()

    @property
    def keeps(self) -> bool:
        """The resend thread runs (the daemon acknowledges messages): only then
        can the daemon's requests reach this process."""
        return self._keeper is not None

    def _request_hello(self) -> dict[str, Any] | None:
        assert self._hello is not None and self.sender is not None
        raw = control.request(
            self.sender.context, self.control or "", self._hello(), control.HELLO_TIMEOUT_MS
        )
        return control.parse_hello_reply(raw)

    def _keep(self) -> None:
        """The resend thread: sends the backlog in order, frees what gpuprofd
        acknowledges, and when gpuprofd is gone says hello to the next one
        (starting it if this process started the first) and sends again
        everything not acknowledged. Never touches the training thread."""
        sender = self.sender
        assert sender is not None
        misses = 0
        next_ack = 0.0
        while not self._stop.is_set():
            sender.wakeup.wait(ACK_INTERVAL_S)
            sender.wakeup.clear()
            try:
                buf = sender.buffer
                if buf is not None and buf.backlog and not sender.drain():
                    sender.poll_out(50)
                now = time.monotonic()
                if now < next_ack and not self._settling.is_set():
                    continue
                next_ack = now + ACK_INTERVAL_S
                ask: dict[str, Any] = {
                    "v": PROTOCOL_VERSION,
                    "type": "ack",
                    "run_key": self._run_key,
                }
                evidence = self.evidence
                report = evidence.report() if evidence is not None else None
                if report is not None:
                    ask["evidence"] = report
                raw = control.request(
                    sender.context, self.control or "", ask, control.ACK_TIMEOUT_MS
                )
                acked = control.parse_ack_reply(raw)
                if evidence is not None and type(acked) is int and raw is not None:
                    evidence.offer(raw.get("evidence"))
                if type(acked) is int:  # not a bool: False is "say hello again"
                    sender.ack(acked)
                    misses = 0
                    continue
                misses += 1
                if acked is False or misses >= GONE_AFTER_MISSES:
                    # a new daemon that does not know us yet, or none at all
                    sender.resend_all()
                    if self._rehello():
                        misses = 0
            except Exception:  # the resend thread must never die
                log.debug("gpuprof: resend thread", exc_info=True)

    def _rehello(self) -> bool:
        """Hello again for the same run; start a daemon if this process
        replaces it (:attr:`replaces_daemon`). True once a daemon took the run over."""
        assert self.sender is not None
        reply = self._request_hello()
        # a daemon that was stopped (not killed) removed its socket files:
        # that was meant, so none is started in its place (systemd's may come)
        stopped = not (self.socket_dir / config.CONTROL_SOCKET_NAME).exists()
        if reply is None and self.replaces_daemon and not stopped and not self._stop.is_set():
            argv = autostart.daemon_argv(self.socket_dir, Path(self.db), self.server)
            log.warning("gpuprof: gpuprofd is gone; starting a new one")
            reply = autostart.start_and_hello(self._request_hello, self.socket_dir, argv)
        if reply is None or not reply.get("ok") or type(reply.get("acked")) is not int:
            log.debug("gpuprof: hello again: %r", reply)
            return False
        self.sender.ack(reply["acked"])
        self.sender.resend_all()
        self.sender.wakeup.set()
        self.reconnects += 1
        log.warning(
            "gpuprof: a new gpuprofd took the run over; sending again from message %d",
            reply["acked"] + 1,
        )
        return True

    def settle(self, wait_s: float | None = None) -> bool:
        """At exit, before ``bye``: wait until gpuprofd acknowledged every
        message (the resend thread restarts a daemon if need be), at most
        *wait_s* seconds (default :data:`SETTLE_WAIT_S`, or
        :data:`SETTLE_WAIT_EXTERNAL_S` for a daemon this process does not
        replace). True if nothing is left unacknowledged."""
        sender = self.sender
        if sender is None or sender.buffer is None or self._keeper is None:
            return True
        if wait_s is None:
            wait_s = SETTLE_WAIT_S if self.replaces_daemon else SETTLE_WAIT_EXTERNAL_S
        now = time.monotonic()
        deadline, absent_until = now + wait_s, now + SETTLE_ABSENT_S
        control_path = self.socket_dir / config.CONTROL_SOCKET_NAME
        self._settling.set()
        while len(sender.buffer) and now < min(deadline, absent_until):
            sender.wakeup.set()
            time.sleep(0.02)
            now = time.monotonic()
            if control_path.exists():
                absent_until = now + SETTLE_ABSENT_S
        return not len(sender.buffer)

    def overflow_note(self) -> str | None:
        """The summary's line when the resend buffer overflowed, else None."""
        buf = self.sender.buffer if self.sender is not None else None
        if buf is None or not buf.overflowed:
            return None
        return (
            f"{buf.overflowed} events given up: gpuprofd did not acknowledge them while "
            f"{buf.max_bytes >> 20} MiB waited in the training process (the resend buffer's bound)"
        )

    def stop_keeper(self) -> None:
        """Stop the resend thread (idempotent)."""
        self._stop.set()
        if self.sender is not None:
            self.sender.wakeup.set()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.join(timeout=SETTLE_WAIT_S)

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
        self.stop_keeper()
        if self.sender is not None:
            self.sender.close()
