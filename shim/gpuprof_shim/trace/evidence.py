"""The shim's side of evidence windows (:mod:`gpuprof.evidence`): the slot
between the resend thread, which hands over the daemon's request from an
``ack`` reply, and the training thread, which opens the window at a step
boundary (the profiler starts and stops only there).

Rules kept here, whatever the daemon asks: with ``auto_evidence=False`` no
request is honoured; one window per rule per run; a request id seen once is
never taken again (the daemon re-sends a request until it hears back); and
all windows together stay within :data:`gpuprof.evidence.BUDGET_SHARE` of the
time since the profile started (a window that would go past it is refused).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpuprof.evidence import (
    BUDGET_SHARE,
    WINDOW_OVERHEAD_MS,
    EvidenceRequest,
    parse_request,
)

#: Request ids remembered (seen once: never taken again); far more than a
#: run's rules, bounded against a daemon that sends new ids forever.
MAX_SEEN = 256


class EvidenceSlot:
    """One pending evidence request, handed from the resend thread to the
    training thread.

    Args:
        enabled: ``profile(auto_evidence=...)``; False refuses every request.
        started_ns: the profile's start, monotonic ns (the budget's base).
        clock: monotonic ns.
        share: the budget, a share of the time since *started_ns* (None:
            :data:`gpuprof.evidence.BUDGET_SHARE`).
    """

    def __init__(
        self,
        enabled: bool,
        started_ns: int,
        clock: Callable[[], int],
        share: float | None = None,
    ) -> None:
        self.enabled = enabled
        self.started_ns = started_ns
        self.clock = clock
        self.share = BUDGET_SHARE if share is None else share
        self._lock = threading.Lock()
        self._pending: EvidenceRequest | None = None
        self._seen: set[str] = set()
        self._rules: set[str] = set()
        self._report: dict[str, Any] | None = None
        #: ns spent in evidence windows so far (their whole span).
        self.used_ns = 0
        #: Windows taken, and requests refused (with why), for the summary.
        self.taken: list[EvidenceRequest] = []
        self.refused: list[tuple[EvidenceRequest, str]] = []
        #: Requests that were not valid (ignored).
        self.malformed = 0

    # --- the resend thread ----------------------------------------------------

    def offer(self, raw: Any) -> None:
        """The ``evidence`` of an ``ack`` reply (any value; never raises).
        A malformed one is counted and ignored; one seen before is ignored; a
        new one is pending, or refused at once when evidence is off or its
        rule already had a window."""
        if raw is None:
            return
        req = parse_request(raw)
        if req is None:
            self.malformed += 1
            return
        with self._lock:
            if req.id in self._seen or self._pending is not None:
                return
            if len(self._seen) < MAX_SEEN:
                self._seen.add(req.id)
            if not self.enabled:
                self._refuse_locked(req, "auto_evidence=False")
            elif req.rule in self._rules:
                self._refuse_locked(req, "this rule already had its window")
            else:
                self._pending = req

    def report(self) -> dict[str, Any] | None:
        """What became of the last request handled, for every ``ack``
        request until the next one (the daemon then stops re-sending it)."""
        with self._lock:
            return None if self._report is None else dict(self._report)

    # --- the training thread ----------------------------------------------------

    def due(self, step: int, step_ns: int) -> EvidenceRequest | None:
        """At the boundary before step *step*: the request whose window opens
        now, or None. *step_ns*: the recent step time (the cost estimate). A
        window that would go past the budget is refused (reported with the
        time it needs)."""
        req = self._pending  # read without the lock: the common case is None
        if req is None or not req.due(step):
            return None
        need = req.steps * max(step_ns, 0) + int(WINDOW_OVERHEAD_MS * 1e6)
        with self._lock:
            if self._pending is not req:
                return None
            self._pending = None
            elapsed = self.clock() - self.started_ns
            if self.used_ns + need > self.share * elapsed:
                self._refuse_locked(req, f"over the {self.share:.0%} budget", need_ns=need)
                return None
            self._rules.add(req.rule)
        return req

    def done(self, req: EvidenceRequest, cost_ns: int) -> None:
        """The window of *req* was sent; it took *cost_ns* in all."""
        with self._lock:
            self.used_ns += max(0, cost_ns)
            self.taken.append(req)
            self._report = {"id": req.id, "state": "taken", "cost_ns": max(0, cost_ns)}

    def failed(self, req: EvidenceRequest, why: str, cost_ns: int = 0) -> None:
        """The window of *req* could not be taken (the user's profiler, a
        profiler error); what it ran counts against the budget."""
        with self._lock:
            self.used_ns += max(0, cost_ns)
            self._refuse_locked(req, why)

    def _refuse_locked(self, req: EvidenceRequest, why: str, need_ns: int | None = None) -> None:
        self.refused.append((req, why))
        report: dict[str, Any] = {"id": req.id, "state": "refused", "why": why[:200]}
        if need_ns is not None:
            report["need_ns"] = need_ns
        self._report = report

    def notes(self) -> list[str]:
        """The summary's lines: rules whose window was refused for the budget
        and never taken later (one line per rule)."""
        out: dict[str, str] = {}
        for req, why in self.refused:
            if why.startswith("over the") and req.rule not in self._rules:
                out[req.rule] = f"evidence window for {req.rule} not taken: {why} of the run's time"
        return list(out.values())
