"""Evidence requests: after each live insights pass, the profiler window to
ask a run's shim for (:func:`gpuprof.evidence.plan`), held until the shim
answers; the request rides the replies to the shim's ``ack`` requests.

In memory, per run: the rules already asked for (one window per rule per
run; the shim keeps that rule too, so a daemon restart that forgets it takes
no second window), the request pending, and what the run's windows cost. A
request the shim refused for the budget may be asked again once the run's
elapsed time covers what the shim said it needs; one refused otherwise
(``auto_evidence=False``, the user's own profiler) is not asked again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuprof import evidence
from gpuprof.insights import Insight, RunContext
from gpuprof.insights.base import steady
from gpuprof.stats import median, percentile

log = logging.getLogger(__name__)


@dataclass
class RunEvidence:
    """One run's evidence state."""

    asked: set[str] = field(default_factory=set)
    """Rules given a window, or refused for good."""
    pending: evidence.EvidenceRequest | None = None
    used_ms: float = 0.0
    """What the run's windows cost so far (the shim's figures), ms."""
    not_before_s: dict[str, float] = field(default_factory=dict)
    """Rule -> the elapsed time (s) before which it is not asked again (refused for the budget)."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(rule, why) of each refusal, newest last."""


class EvidencePlanner:
    """Which window to ask each running run for (see the module doc).

    Args:
        share: the budget, a share of the run's elapsed time
            (:data:`gpuprof.evidence.BUDGET_SHARE`).
        clock: monotonic ns (the run's elapsed time is measured on it from
            its ``start_mono_ns``).
    """

    def __init__(
        self,
        share: float = evidence.BUDGET_SHARE,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.share = share
        self._clock = clock
        self.runs: dict[int, RunEvidence] = {}

    def after_pass(
        self, run: dict[str, Any], findings: Sequence[Insight], ctx: RunContext
    ) -> evidence.EvidenceRequest | None:
        """After a live pass over *run* (its row): make a request if one
        fits (none while one is pending). Returns the new request, if any."""
        state = self.runs.setdefault(int(run["id"]), RunEvidence())
        if state.pending is not None:
            return None
        start = run.get("start_mono_ns")
        if not isinstance(start, int):
            return None
        elapsed_s = (self._clock() - start) / 1e9
        waiting = {r for r, at in state.not_before_s.items() if elapsed_s < at}
        times = steady(ctx.step_ms)
        if not times:
            return None
        p50 = median(times)
        numbers = (*ctx.numbers, *ctx.traced_step_numbers)
        req = evidence.plan(
            findings,
            state.asked | waiting,
            request_id=uuid.uuid4().hex[:16],
            step_ms=p50,
            slow_step_ms=percentile(times, 99),
            latest_step=max(numbers) if numbers else None,
            elapsed_s=elapsed_s,
            used_ms=state.used_ms,
            share=self.share,
        )
        if req is not None:
            state.pending = req
            log.info("run %s: asking for an evidence window for %s", run["id"], req.rule)
        return req

    def reply(self, run_id: int, report: dict[str, Any] | None) -> dict[str, Any] | None:
        """For an ``ack`` of run *run_id* carrying the shim's *report*
        (validated, or None): settle the pending request the report answers,
        and return the request to send (the pending one, again until
        answered), or None."""
        state = self.runs.get(run_id)
        if state is None:
            return None
        req = state.pending
        if report is not None and req is not None and report["id"] == req.id:
            state.pending = None
            if report["state"] == "taken":
                state.asked.add(req.rule)
                state.used_ms += report.get("cost_ns", 0) / 1e6
            else:
                why = str(report.get("why") or "refused")
                state.refused.append((req.rule, why))
                need = report.get("need_ns")
                if isinstance(need, int):
                    # asked again once the budget covers what the shim needs
                    state.not_before_s[req.rule] = (
                        (state.used_ms + need / 1e6) / 1e3 / self.share if self.share > 0 else 1e18
                    )
                else:
                    state.asked.add(req.rule)
            return None
        return None if req is None else req.to_wire()

    def forget(self, run_id: int) -> None:
        """The run ended."""
        self.runs.pop(run_id, None)
