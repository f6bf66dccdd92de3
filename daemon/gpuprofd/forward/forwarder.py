"""The forwarder: sends the outbox (:mod:`gpuprofd.storage.writes.outbox`) to the
team server, in sequence order, a batch about once a second (at once while
a backlog lasts), and forgets what the server acknowledged.

Failures (:mod:`gpuprofd.forward.client`): no answer, 5xx and 429 are
retried with capped, jittered exponential backoff (``Retry-After`` honoured);
a refused key, a wrong URL or an unknown batch format pause forwarding (one
log line, ``gpuprofctl status``, a retry every 30 s, the outbox kept); any
other refusal moves the named event (or the whole batch when none is named)
to the dead-letter table, logged once, never sent again. A 413 halves the
batch first. The same code serves the daemon (:meth:`Forwarder.run`) and
``gpuprofctl drain`` (:meth:`Forwarder.drain`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_never,
)
from tenacity.stop import StopBaseT, stop_after_delay
from tenacity.wait import wait_random_exponential

from gpuprofd.core.counters import DropCounter
from gpuprofd.core.errors import BadInputError
from gpuprofd.forward.client import Acked, Paused, Refused, Retry, compress, post
from gpuprofd.forward.config import ForwardConfig
from gpuprofd.storage.writes import RUN_KINDS, Store, outbox

log = logging.getLogger(__name__)

#: About how often a batch goes while the node keeps up, seconds.
BATCH_INTERVAL_S = 1.0
#: Backoff between retries: random in [0, min(cap, base * 2^attempt)] seconds
#: ("full jitter": nodes that lost the server together do not return together).
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 60.0
#: The longest ``Retry-After`` obeyed, seconds.
MAX_RETRY_AFTER_S = 600.0
#: Events that announce a run to the server. A batch refused as a whole
#: keeps them in the outbox, once (they hold no data of their own: their
#: fields are read from ``runs`` when sent), since without its ``run`` event
#: the server refuses every later event of that run; refused again, they go.
_ANNOUNCING = ("run", "end")
#: A refusal naming an event's run (``events[3].run``: a run the server does
#: not know, or knows as another node's): it refuses every event of that run.
_RUN_FIELD_RE = re.compile(r"^events\[\d+\]\.run$")


def _wait(base: Callable[[RetryCallState], float]) -> Callable[[RetryCallState], float]:
    """*base*, or the server's ``Retry-After`` (capped) when it gave one."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        after = getattr(exc, "retry_after_s", None)
        if after is not None:
            return min(float(after), MAX_RETRY_AFTER_S)
        return base(state)

    return wait


@dataclass
class ForwardState:
    """What ``gpuprofctl status`` shows of the forwarder (wall ns; None: never)."""

    server: str
    node: str | None = None
    state: str = "starting"
    """``starting``, ``ok``, ``retrying`` (no answer, 5xx, 429) or ``paused``
    (the key, the URL or the format refused: someone must act)."""
    last_error: str | None = None
    last_error_wall_ns: int | None = None
    last_ack_wall_ns: int | None = None
    acked_seq: int = 0
    sent_events: int = 0
    sent_batches: int = 0
    dead_batches: int = 0
    retries: int = 0
    _logged: set[str] = field(default_factory=set, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class Forwarder:
    """Sends one database's outbox to one team server (see the module doc).

    Args:
        store: the database whose outbox is sent (open, its writer started).
        cfg: the server, key and outbox bound.
        drops: counts ``forward_dead`` and ``forward_given_up`` events.
        host: this node's host name, sent with each batch.
    """

    def __init__(
        self,
        store: Store,
        cfg: ForwardConfig,
        drops: DropCounter | None = None,
        host: str | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.drops = drops if drops is not None else DropCounter()
        self.host = host or socket.gethostname()
        self.clock = clock
        self.status = ForwardState(cfg.server)
        self.last_state: outbox.OutboxState | None = None
        self._in_flight_seq = 0
        """The last sequence of the batch being sent (kept by the bound: it is on its way)."""
        """The outbox as :meth:`enforce_limit` last counted it (``/metrics`` reads it)."""
        self._max_events = outbox.MAX_EVENTS
        self._kept: set[int] = set()
        """Sequence numbers of run and end events kept once from a refused batch."""
        self._refused_runs: dict[int, tuple[int, str]] = {}
        """Runs the server refuses (run id -> its status and reason): their
        events go to the dead-letter table without being sent."""

    # --- one batch ------------------------------------------------------------

    def _note(self, state: str, message: str, logged: bool = False) -> None:
        """Say *message* in status and, once per distinct message, in the log
        (unless the caller *logged* it already)."""
        self.status.state = state
        self.status.last_error = message
        self.status.last_error_wall_ns = self.clock()
        if not logged and message not in self.status._logged:  # once per distinct error
            self.status._logged.add(message)
            (log.error if state == "paused" else log.warning)("forwarding: %s", message)

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        self.status.retries += 1
        self._note("paused" if isinstance(exc, Paused) else "retrying", str(exc))

    def _retrying(self, stop: StopBaseT, retry_paused: bool) -> AsyncRetrying:
        retry = retry_if_exception_type(Retry)
        if not retry_paused:  # gpuprofctl drain: a refused key is said at once
            retry = retry & retry_if_not_exception_type(Paused)
        return AsyncRetrying(
            retry=retry,
            wait=_wait(wait_random_exponential(multiplier=BACKOFF_BASE_S, max=BACKOFF_CAP_S)),
            stop=stop,
            before_sleep=self._before_sleep,
            reraise=True,
        )

    async def _post(
        self, session: aiohttp.ClientSession, body: bytes, stop: StopBaseT, retry_paused: bool
    ) -> Acked:
        gz = await compress(body)
        async for attempt in self._retrying(stop, retry_paused):
            with attempt:
                try:
                    key = self.cfg.key.get()
                except BadInputError as exc:
                    raise Paused(str(exc)) from None
                return await post(session, self.cfg.ingest_url, key, gz)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def send_once(
        self,
        session: aiohttp.ClientSession,
        stop: StopBaseT = stop_never,
        retry_paused: bool = True,
    ) -> int:
        """Send the oldest batch of the outbox until it is acknowledged or
        refused; return how many outbox events it settled (0: the outbox is empty).

        Raises:
            Retry: *stop* ended the retries (``gpuprofctl drain``'s time limit).
            Paused: without *retry_paused*, at once.
        """
        # read each time: a database replaced under the daemon is a new node
        self.status.node = await outbox.node_id(self.store)
        rows = await outbox.waiting(self.store, max_events=self._max_events)
        if not rows:
            return 0
        refused = await self._of_refused_runs(rows)
        if refused:
            rows = [w for w in rows if w.seq not in refused]
            if not rows:
                return len(refused)
            return len(refused) + await self.send_once(session, stop, retry_paused)
        batch = await outbox.load_batch(self.store, self.status.node, self.host, rows)
        if batch.gone:  # events of runs deleted from this database meanwhile
            await outbox.give_up(self.store, batch.gone)
            self.drops.add("forward_run_gone", n=len(batch.gone))
        if batch.body is None:
            return len(rows)
        self._in_flight_seq = batch.last_seq
        try:
            acked = await self._post(session, batch.body, stop, retry_paused)
        except Refused as exc:
            self._in_flight_seq = 0
            if exc.status == 413 and len(batch.rows) > 1:  # too large: halve and send again
                self._max_events = max(1, len(batch.rows) // 2)
                log.warning("forwarding: %s; sending smaller batches", exc)
                return await self.send_once(session, stop, retry_paused)
            return await self._refused(batch, exc)
        finally:
            if self._in_flight_seq == batch.last_seq:
                self._in_flight_seq = 0
        await outbox.ack(self.store, acked.acked_seq)
        # a batch size halved after a 413 stays (a proxy's body limit in front of
        # the server does not change): a catch-up does not hit it with every batch
        s = self.status
        if s.state != "ok" and s.last_error is not None and s.state != "starting":
            log.info("forwarding to %s again (%d events waited)", self.cfg.server, len(rows))
            s._logged.clear()
        s.state = "ok"
        s.acked_seq = max(s.acked_seq, acked.acked_seq)
        s.last_ack_wall_ns = self.clock()
        s.sent_events += batch.events
        s.sent_batches += 1
        return len(rows)

    async def _of_refused_runs(self, rows: list[outbox.Waiting]) -> set[int]:
        """Dead-letter, unsent, the events of *rows* whose run the server refuses."""
        out: set[int] = set()
        for run_id, (status, reason) in self._refused_runs.items():
            seqs = [w.seq for w in rows if w.run_id == run_id and w.kind in RUN_KINDS]
            if seqs:
                await outbox.dead_letter(self.store, seqs, status, reason, self.clock())
                self.drops.add("forward_dead", reason[:200], n=len(seqs))
                out.update(seqs)
        return out

    async def _refused(self, batch: outbox.Batch, exc: Refused) -> int:
        """Dead-letter the event the server named (all of its run's, when it
        named the run), or the whole batch but its run and end events (see
        :data:`_ANNOUNCING`)."""
        sent = [w for w in batch.rows if w not in batch.gone]
        named = sent[exc.event] if exc.event is not None and 0 <= exc.event < len(sent) else None
        if named is not None and exc.status != 413 and _RUN_FIELD_RE.match(exc.field):
            if named.run_id is not None and named.kind in RUN_KINDS:
                return await self._refused_run(named.run_id, exc)
        if named is not None and exc.status != 413:
            dead = [named.seq]
        else:
            keep = [w for w in sent if w.kind in _ANNOUNCING and w.seq not in self._kept]
            if len(keep) == len(sent):  # nothing else to blame
                keep = []
            self._kept.update(w.seq for w in keep)
            dead = [w.seq for w in sent if w not in keep]
        await outbox.dead_letter(self.store, dead, exc.status, str(exc), self.clock())
        self.status.dead_batches += 1
        self.drops.add("forward_dead", str(exc)[:200], n=len(dead))
        log.error(
            "forwarding: the team server refused %d event(s) for good (%s); kept in the "
            "dead-letter table, not sent again (gpuprofctl status)",
            len(dead),
            exc,
        )
        self._note("ok", f"refused for good: {exc}", logged=True)
        self.status.state = "ok"
        return len(dead)

    async def _refused_run(self, run_id: int, exc: Refused) -> int:
        """The server refuses run *run_id* itself: every event of it waiting
        goes to the dead-letter table, and so will later ones, unsent (each
        would be refused alone: one post and one log line per event)."""
        self._refused_runs[run_id] = (exc.status, str(exc))
        dead = await outbox.run_seqs(self.store, run_id)
        await outbox.dead_letter(self.store, dead, exc.status, str(exc), self.clock())
        self.status.dead_batches += 1
        self.drops.add("forward_dead", str(exc)[:200], n=len(dead))
        log.error(
            "forwarding: the team server refuses run %d (%s); its %d waiting events and any "
            "later ones go to the dead-letter table, not sent (gpuprofctl status)",
            run_id,
            exc,
            len(dead),
        )
        self._note("ok", f"refused for good: {exc}", logged=True)
        self.status.state = "ok"
        return len(dead)

    # --- the daemon's loop ----------------------------------------------------

    async def run(self) -> None:
        """Forward until cancelled: a batch about once a second while the
        node keeps up, back to back while a backlog lasts."""
        loop = asyncio.get_running_loop()
        await outbox.remember_server(self.store, self.cfg.server)
        async with aiohttp.ClientSession() as session:
            while True:
                started = loop.time()
                self.store.outbox_event.clear()
                try:
                    settled = await self.send_once(session)
                except Exception as exc:  # noqa: BLE001 - a bad moment must not end forwarding
                    self._note("retrying", f"reading the outbox failed: {exc}")
                    await asyncio.sleep(BACKOFF_CAP_S / 4)
                    continue
                if settled >= self._max_events:
                    continue  # a backlog: the next batch at once
                await asyncio.sleep(max(0.0, BATCH_INTERVAL_S - (loop.time() - started)))
                if settled == 0:
                    await self.store.outbox_event.wait()

    async def enforce_limit(self) -> None:
        """Give up what is over the outbox bound, then count the outbox
        (:attr:`last_state`; the daemon runs this every few seconds)."""
        given = await outbox.enforce_limit(
            self.store, self.cfg.max_bytes, after_seq=self._in_flight_seq
        )
        self.last_state = await outbox.state(self.store)
        if given:
            self.drops.add("forward_given_up", n=given)
            log.warning(
                "forwarding: the outbox is over %d MiB; %d events given up (oldest raw "
                "samples first), counted in gpuprofctl status",
                self.cfg.max_bytes // (1024 * 1024),
                given,
            )

    def gauges(self) -> dict[str, Any] | None:
        """``/metrics``' forwarding figures (:class:`gpuprofd.web.metrics.ForwardGauges`
        fields), from :attr:`last_state`; None before the outbox was first counted."""
        box = self.last_state
        if box is None:
            return None
        age = None
        if box.oldest_wall_ns is not None:
            age = max(0.0, (self.clock() - box.oldest_wall_ns) / 1e9)
        return {
            "up": self.status.state == "ok",
            "backlog_events": box.events,
            "backlog_bytes": box.bytes,
            "oldest_age_s": age,
            "sent_events": self.status.sent_events,
            "dead_events": box.dead_events,
            "given_up_events": box.given_up_events,
        }

    async def describe(self) -> dict[str, Any]:
        """The forwarder and its outbox, for ``ping`` (``gpuprofctl status``)."""
        out = self.status.to_dict()
        try:
            out["outbox"] = (await outbox.state(self.store)).to_dict()
        except Exception as exc:  # noqa: BLE001 - status must answer whatever the database does
            out["outbox"] = None
            out["outbox_error"] = str(exc)
        out["max_bytes"] = self.cfg.max_bytes
        return out

    async def last_send(self, timeout_s: float) -> None:
        """At shutdown: store what is queued, then send the outbox for up to
        *timeout_s* (what is left waits for the next daemon or ``gpuprofctl drain``)."""
        try:
            await asyncio.wait_for(self._last_send(), timeout_s)
        except (TimeoutError, Retry):
            pass
        except Exception:  # noqa: BLE001 - shutdown goes on; the outbox keeps the rest
            log.exception("forwarding: the last send at shutdown failed")
        try:
            left = await outbox.state(self.store)
        except Exception:  # noqa: BLE001
            return
        if left.events:
            log.info(
                "forwarding: %d events (%d bytes) wait in the outbox for the next gpuprofd "
                "or gpuprofctl drain",
                left.events,
                left.bytes,
            )

    async def _last_send(self) -> None:
        await self.store.flush()
        async with aiohttp.ClientSession() as session:
            while await self.send_once(session, stop_after_delay(0)):
                pass

    # --- gpuprofctl drain -----------------------------------------------------

    async def drain(
        self,
        progress: Callable[[int], None] | None = None,
        give_up_after_s: float = 120.0,
    ) -> int:
        """Send the whole outbox; call *progress(events settled)* after each
        batch. Returns the events settled.

        Raises:
            Retry: the server could not be reached for *give_up_after_s*
                (what is left stays in the outbox; a later drain resumes).
            Paused: the key, the URL or the batch format was refused.
        """
        total = 0
        async with aiohttp.ClientSession() as session:
            while True:
                stop = stop_after_delay(give_up_after_s)
                settled = await self.send_once(session, stop, retry_paused=False)
                if settled == 0:
                    return total
                total += settled
                if progress is not None:
                    progress(settled)
