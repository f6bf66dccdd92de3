"""Runs the insight rules on stored runs: live (periodically) and at run end.

Reads the run's context with :func:`gpuprofd.storage.reads.run_context` (the
one ``gpuprofctl`` reads, over the store as a Reader) and runs
:func:`gpuprof.insights.run_rules` in a worker thread (a long run has many
steps), then stores the findings.

At a run's end, a run of a group (``runs.group_id``: torchrun's ranks) also
gets the group rules (:func:`gpuprof.insights.distributed.group_rules`) over
the group's rows stored so far: read by :func:`gpuprofd.storage.reads.group_findings`
(the code ``gpuprofctl insights --group`` runs) over the store, the rules in a
worker thread, bounded to the group's last ``GROUP_STEPS_MAX`` common steps.
They go into the rank's summary (``group``: the shim prints them at exit) and,
once every rank of the group has ended, into ``group_insights``. A failure
there is logged and counted (``group_insights_failed``); the run still ends.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from gpuprof import evidence
from gpuprof.insights import Insight, RunContext, run_rules
from gpuprof.summary import make_summary
from gpuprofd.core.counters import DropCounter
from gpuprofd.services.evidence import EvidencePlanner
from gpuprofd.storage import reads
from gpuprofd.storage.writes import Store, costs, outbox, runsdb
from gpuprofd.views.runs import LIVE_NOTE

log = logging.getLogger(__name__)

#: Longest a rank's end waits for its group's findings (s): the shim waits
#: 5 s for the whole bye (gpuprof_shim.control.BYE_TIMEOUT_MS). Reading 8
#: ranks of 280 buckets takes ~1 s on a 2-core box; ranks ending together
#: share one read (one at a time per group).
GROUP_WAIT_S = 2.0


class InsightsRunner:
    """Computes and stores a run's insights and, at the end, its summary."""

    def __init__(
        self,
        store: Store,
        db_path: str,
        gpu_rate_usd_per_hour: float | None,
        base_notes: Sequence[str] = (),
        clock: Callable[[], int] = time.monotonic_ns,
        drops: DropCounter | None = None,
        team_url: Callable[[str], str] | None = None,
        evidence: EvidencePlanner | None = None,
    ) -> None:
        self.store = store
        self.evidence = evidence
        """Asks running runs for evidence windows after live passes (None: never)."""
        self.team_url = team_url
        """A forwarding node: the URL of a run's page on the team server, by run UUID."""
        self.db_path = db_path
        self.gpu_rate = gpu_rate_usd_per_hour
        self.base_notes = list(base_notes)
        """Notes every summary carries (no GPU, bad GPUPROF_GPU_RATE)."""
        self._clock = clock
        self.drops = drops if drops is not None else DropCounter()
        """Counts ``group_insights_failed``."""
        self._group_locks: dict[str, asyncio.Lock] = {}
        self._group_last: dict[str, tuple[int, dict[str, Any]]] = {}
        """Group -> (when its last read began, monotonic ns; its findings)."""
        self._group_tasks: set[asyncio.Task[Any]] = set()
        self.latest: dict[int, tuple[Insight, ...]] = {}
        """Run id -> the findings of its latest live pass, while it runs (``/metrics``)."""
        self.live_summaries: dict[int, dict[str, Any]] = {}
        """Run id -> the summary of its latest live pass, while it runs (the
        dashboard's ``/runs/{id}``: a day-long run's context takes seconds to build)."""

    async def _compute(self, run: dict[str, Any]) -> tuple[list[Insight], RunContext]:
        """The run's context (a running run's host samples up to now) and its
        findings, each with its evidence window's top rows (:func:`gpuprof.evidence.attach`)."""
        ctx = await reads.run_context(
            self.store, run, gpu_rate_usd_per_hour=self.gpu_rate, now_mono_ns=self._clock()
        )
        found = await asyncio.to_thread(run_rules, ctx)
        windows = await reads.evidence_windows(self.store, run["id"])
        return evidence.attach(found, windows), ctx

    async def _group(self, group: str) -> tuple[dict[str, Any] | None, str | None]:
        """The group's findings so far for a rank's summary (``group``,
        ``ranks``, ``insights``) and a note: (None, None) when they could not
        be had (logged and counted); (None, a note) when they took longer than
        :data:`GROUP_WAIT_S` (they are still stored once ready)."""
        asked = time.monotonic_ns()
        task = asyncio.create_task(self._group_findings(group, asked))
        self._group_tasks.add(task)
        task.add_done_callback(self._group_tasks.discard)
        try:
            found = await asyncio.wait_for(asyncio.shield(task), GROUP_WAIT_S)
        except TimeoutError:
            log.warning("group insights of %r not ready within %.0f s", group, GROUP_WAIT_S)
            return None, (
                f"the group's findings were not ready in time: gpuprofctl insights "
                f"--group {shlex.quote(group)}"
            )
        if found is None:
            return None, None
        keys = ("group", "ranks", "insights", "gains", "lost_ranks", "missing_ranks", "runs_note")
        return {k: found.get(k) for k in keys}, None

    async def _group_findings(self, group: str, asked: int) -> dict[str, Any] | None:
        """:func:`gpuprofd.storage.reads.group_findings` of *group* read after
        *asked* (monotonic ns) over the store, stored when the group has
        ended; None on any failure (logged, counted ``group_insights_failed``).
        One at a time per group: ranks ending together share a read that
        began after they asked."""
        lock = self._group_locks.setdefault(group, asyncio.Lock())
        try:
            async with lock:
                last = self._group_last.get(group)
                if last is not None and last[0] >= asked:
                    return last[1]
                started = time.monotonic_ns()
                found = await reads.group_findings(self.store, group)
                self._group_last[group] = (started, found)
                if found["ended"]:
                    await runsdb.replace_group_insights(
                        self.store, group, found["ranks"], found["insights"]
                    )
            if found["ended"] and not lock.locked():  # an ended group's state goes (a
                self._group_last.pop(group, None)  # rank still waiting reads again)
                self._group_locks.pop(group, None)
            return found
        except Exception:  # noqa: BLE001 - a group rule must never break a run's end
            log.exception("group insights of %r failed; the run ends without them", group)
            self.drops.add("group_insights_failed")
            return None

    async def live(self, run_id: int) -> list[Insight]:
        """Recompute a running run's insights and replace the stored ones."""
        run = await reads.find_run(self.store, run_id=run_id)
        if run is None:
            return []
        insights, ctx = await self._compute(run)
        if self.evidence is not None:
            self.evidence.after_pass(run, insights, ctx)
        self.latest[run_id] = tuple(insights)
        await runsdb.replace_insights(self.store, run_id, insights)
        self.live_summaries[run_id] = make_summary(
            run_id,
            ctx,
            [i.to_dict() for i in insights],
            self.db_path,
            [LIVE_NOTE, *self.base_notes],
            error=run.get("error"),
        )
        if run.get("group_id"):
            self.live_summaries[run_id]["group_id"] = run["group_id"]
        return insights

    def live_summary(self, run_id: int) -> dict[str, Any] | None:
        """The summary of run *run_id*'s latest live pass (a copy); None when it
        has had none or has ended."""
        got = self.live_summaries.get(run_id)
        return None if got is None else orjson.loads(orjson.dumps(got, default=str))

    async def finalize(
        self, run_id: int, notes: Sequence[str] = (), *, keep_sent: bool = False
    ) -> dict[str, Any]:
        """Compute the final insights of an ended run, store them with its
        median step time (steady-state iteration: what the regression rule
        compares by once this run's steps are gone),
        MFU and achieved TFLOP/s (NULL when unknown) and summary; return the
        summary dict.

        *keep_sent* (a team server): a run whose node sent its own summary
        (and so its insights) keeps them; only its group's findings are
        made here, over every node's ranks."""
        run = await reads.find_run(self.store, run_id=run_id)
        if run is None:
            raise KeyError(run_id)
        self.latest.pop(run_id, None)
        self.live_summaries.pop(run_id, None)
        if self.evidence is not None:
            self.evidence.forget(run_id)
        if keep_sent and run.get("summary"):
            sent = run["summary"]
            sent = orjson.loads(sent) if isinstance(sent, str | bytes) else sent
            if run.get("group_id"):
                await self._group(run["group_id"])
            return sent if isinstance(sent, dict) else {}
        insights, ctx = await self._compute(run)
        summary = make_summary(
            run_id,
            ctx,
            [i.to_dict() for i in insights],
            self.db_path,
            [*notes, *self.base_notes],
            error=run.get("error"),
        )
        summary["notes"].extend(
            evidence.summary_lines(await reads.evidence_windows(self.store, run_id))
        )
        if self.team_url is not None and run.get("run_uuid"):
            summary["team_url"] = self.team_url(run["run_uuid"])
            given_up = await outbox.given_up_for_run(self.store, run_id)
            if given_up:
                summary["notes"].append(
                    f"{given_up} events of this run were not forwarded to the team server "
                    "(the outbox was full during an outage; raw samples go first)"
                )
        if run.get("group_id"):
            summary["group_id"] = run["group_id"]  # the summary's "Group report:" line
            group, note = await self._group(run["group_id"])
            if group is not None:  # the other ranks lost or failed (its own status is above)
                lost = [m for m in group["lost_ranks"] or [] if m["run_id"] != run_id]
                summary["group"] = {**group, "lost_ranks": lost}
            if note is not None:
                summary["notes"].append(note)
        await runsdb.replace_insights(self.store, run_id, insights)
        await runsdb.update_run(
            self.store,
            run_id,
            ended=True,
            median_step_ms=summary["median_step_ms"],
            mfu=summary["mfu"],
            achieved_tflops=summary["achieved_tflops"],
            summary=orjson.dumps(summary, default=str).decode(),
        )
        try:  # the rollups' row of the run; the summary stands without it
            await costs.refresh_runs(self.store, [run_id])
        except Exception:  # noqa: BLE001 - a database refusal is logged, the run still ends
            log.exception("run %s: its GPU-hours row was not written", run_id)
        return summary
