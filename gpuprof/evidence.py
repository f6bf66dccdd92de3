"""Evidence windows: one bounded ``torch.profiler`` window the daemon asks a
run's shim for when a live finding is one an op/kernel view would explain,
and the window's top ops attached to that finding. Pure: no torch, no I/O.

The flow (users: ``docs/kernels-mfu.md``, "Evidence windows"):

1. A live insights pass finds a rule of :data:`EVIDENCE_RULES`; the daemon's
   :func:`plan` picks at most one request per pass: one per rule per run,
   within :data:`BUDGET_SHARE` of the run's elapsed time.
2. The request rides the reply to the shim's ``ack`` (every 0.25 s):
   ``{"evidence": {"id", "rule", "steps", "at_step", "every"}}``
   (:meth:`EvidenceRequest.to_wire`, checked by :func:`parse_request`).
3. The shim opens the window at a step boundary on the training thread (the
   next step ``k`` with ``k % every == at_step % every`` when the slow steps
   recur every ``every`` steps, else the next step), keeps it for ``steps``
   steps, sends it as a ``kernels`` event of source ``evidence`` with
   ``{"evidence": {"id", "rule"}}``, and reports what it did on its next
   ``ack`` (``{"evidence": {"id", "state": "taken" | "refused", ...}}``,
   :func:`report_problem`). A re-sent request (same id) is never taken twice.
4. Each later pass attaches the window's top rows to the finding of that rule
   (:func:`attach`): its evidence gains ``profile``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from gpuprof.kernels import KernelAgg
from gpuprof.text import is_printable

#: Rules whose finding an op/kernel view explains, and so may get a window:
#: slow bursts (the slow steps' ops), launch overhead and kernel drift (which
#: kernels), low MFU (where the FLOPs go), a straggler (its slow ops).
EVIDENCE_RULES = (
    "high_step_variance",
    "kernel_launch_overhead",
    "low_mfu",
    "kernel_drift",
    "straggler_rank",
)
#: Steps one window covers when no period is known: enough to see a burst's
#: op mix, few enough to stay cheap (four 5 ms steps and the profiler's
#: start/stop fit the budget after ~10 s of a run).
DEFAULT_STEPS = 4
#: Steps one window covers at a periodic slow step: that step alone.
PERIODIC_STEPS = 1
#: Most steps a request may ask for (the protocol's bound).
MAX_STEPS = 64
#: Share of the run's elapsed time evidence windows may take, all together
#: (the issue's "default <= 1 %"): a window's cost is its whole span, steps
#: and the profiler's start, stop and fold.
BUDGET_SHARE = 0.01
#: The profiler's own cost per window beside its steps, ms: a window cost
#: ~25-45 ms on a 17 ms CPU step (``bench/trace_overhead.py``, 2 vCPUs,
#: 2026-11-30); the upper end, so a window is not asked for too early.
WINDOW_OVERHEAD_MS = 45.0
#: Rows attached to a finding: the top ops and the top kernels by time.
TOP_ROWS = 5
#: Longest ``why`` of a refusal kept (characters).
MAX_WHY_CHARS = 200

_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_RULE_RE = re.compile(r"^[a-z0-9_]{1,64}$")
REPORT_STATES = ("taken", "refused")
#: What a window's times are: device time (a GPU run), or the operators' CPU
#: time (a CPU-only run, where there is no device time to show).
TIME_KINDS = ("device", "cpu")


class Finding(Protocol):
    """What :func:`plan` and :func:`attach` read of a finding
    (:class:`gpuprof.insights.Insight`; not imported: the protocol imports
    this module, and the rules import the protocol)."""

    @property
    def rule(self) -> str: ...

    @property
    def evidence(self) -> Mapping[str, Any]: ...


F = TypeVar("F", bound=Finding)


@dataclass(frozen=True)
class EvidenceRequest:
    """One request for a window.

    Attributes:
        id: the request's id (``[A-Za-z0-9_-]``, 1-64 characters): a re-sent
            request with the same id takes no second window.
        rule: the rule whose finding asked for it.
        steps: steps the window covers, 1..:data:`MAX_STEPS`.
        at_step: the step to start at (the next slow one of a periodic
            pattern); None: the next step.
        every: the pattern's period in steps (the window starts at the next
            step ``k`` with ``k % every == at_step % every``); None: no period.
    """

    id: str
    rule: str
    steps: int = DEFAULT_STEPS
    at_step: int | None = None
    every: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "steps": self.steps,
            "at_step": self.at_step,
            "every": self.every,
        }

    def due(self, step: int) -> bool:
        """True if a window for this request opens before step *step*."""
        if self.at_step is None:
            return True
        if self.every:
            return step % self.every == self.at_step % self.every
        return step >= self.at_step


def _step_index(x: Any) -> bool:
    return type(x) is int and 0 <= x <= 1 << 40


def parse_request(obj: Any) -> EvidenceRequest | None:
    """A request from an ``ack`` reply's ``evidence`` (see
    :meth:`EvidenceRequest.to_wire`); None for anything malformed (an id or
    rule of the wrong shape, steps outside 1..:data:`MAX_STEPS`, a negative
    or non-integer step, ``every`` without ``at_step``)."""
    if type(obj) is not dict:
        return None
    rid, rule, steps = obj.get("id"), obj.get("rule"), obj.get("steps")
    at_step, every = obj.get("at_step"), obj.get("every")
    if type(rid) is not str or not _ID_RE.match(rid):
        return None
    if type(rule) is not str or not _RULE_RE.match(rule):
        return None
    if type(steps) is not int or not 1 <= steps <= MAX_STEPS:
        return None
    if at_step is not None and not _step_index(at_step):
        return None
    if every is not None and (type(every) is not int or not 1 <= every <= 1 << 20):
        return None
    if every is not None and at_step is None:
        return None
    return EvidenceRequest(rid, rule, steps, at_step, every)


def tag_problem(obj: Any) -> str | None:
    """What is wrong with a ``kernels`` event's ``evidence`` tag
    (``{"id", "rule", "time"?: "device" | "cpu"}``), or None when it is valid."""
    if type(obj) is not dict or not {"id", "rule"} <= set(obj) <= {"id", "rule", "time"}:
        return "not {id, rule, time?}"
    if obj.get("time", "device") not in TIME_KINDS:
        return "bad time"
    if type(obj["id"]) is not str or not _ID_RE.match(obj["id"]):
        return "bad id"
    if type(obj["rule"]) is not str or not _RULE_RE.match(obj["rule"]):
        return "bad rule"
    return None


def report_problem(obj: Any) -> str | None:
    """What is wrong with an ``ack`` request's ``evidence`` report, or None
    when it is valid: ``{"id", "state": "taken" | "refused", "cost_ns"?: int,
    "need_ns"?: int, "why"?: printable text}``."""
    if type(obj) is not dict or not set(obj) <= {"id", "state", "cost_ns", "need_ns", "why"}:
        return "not {id, state, ...}"
    if type(obj.get("id")) is not str or not _ID_RE.match(obj["id"]):
        return "bad id"
    if obj.get("state") not in REPORT_STATES:
        return "bad state"
    for key in ("cost_ns", "need_ns"):
        v = obj.get(key)
        if v is not None and (type(v) is not int or not 0 <= v <= 1 << 60):
            return f"bad {key}"
    why = obj.get("why")
    if why is not None and (
        type(why) is not str or len(why) > MAX_WHY_CHARS or not is_printable(why)
    ):
        return "bad why"
    return None


def window_cost_ms(steps: int, step_ms: float) -> float:
    """What a window of *steps* steps of *step_ms* each costs, ms (its steps
    and :data:`WINDOW_OVERHEAD_MS`)."""
    return steps * max(step_ms, 0.0) + WINDOW_OVERHEAD_MS


def within_budget(
    cost_ms: float, used_ms: float, elapsed_s: float, share: float = BUDGET_SHARE
) -> bool:
    """True if a window costing *cost_ms* fits: all windows (*used_ms* so far
    and this one) within *share* of the run's *elapsed_s*."""
    return used_ms + cost_ms <= share * elapsed_s * 1e3


def plan(
    findings: Sequence[Finding],
    asked: Iterable[str],
    *,
    request_id: str,
    step_ms: float,
    slow_step_ms: float | None,
    latest_step: int | None,
    elapsed_s: float,
    used_ms: float,
    share: float = BUDGET_SHARE,
) -> EvidenceRequest | None:
    """The request to make after a live pass, or None.

    Args:
        findings: the pass's findings.
        asked: rules already given a window (or refused for good) in this run.
        request_id: the id the new request gets.
        step_ms: the run's median step, ms.
        slow_step_ms: its slow steps' typical time, ms (a periodic window
            covers one), None when unknown.
        latest_step: the highest step index stored (a periodic window starts
            at the next slow step after it), None when unknown.
        elapsed_s: the run's elapsed time, s.
        used_ms: what its windows cost so far, ms.
        share: the budget (:data:`BUDGET_SHARE`).

    Returns:
        A request for the first finding of :data:`EVIDENCE_RULES` (in that
        order) not yet asked whose window fits the budget: at the next slow
        step (one step) when ``high_step_variance`` says the slow steps recur
        every N steps (``period_steps``; the phase: the residue most of its
        ``slow_step_numbers`` share), else the next :data:`DEFAULT_STEPS` steps.
    """
    done = set(asked)
    by_rule = {f.rule: f for f in findings}
    for rule in EVIDENCE_RULES:
        found = by_rule.get(rule)
        if found is None or rule in done:
            continue
        every = found.evidence.get("period_steps")
        slow_at = found.evidence.get("slow_step_numbers") or []
        if type(every) is int and every > 0 and slow_at and latest_step is not None:
            phase = _phase(slow_at, every)
            nxt = latest_step + 1 + ((phase - latest_step - 1) % every)
            req = EvidenceRequest(request_id, rule, PERIODIC_STEPS, nxt, every)
            cost = window_cost_ms(PERIODIC_STEPS, slow_step_ms or step_ms)
        else:
            req = EvidenceRequest(request_id, rule, DEFAULT_STEPS)
            cost = window_cost_ms(DEFAULT_STEPS, step_ms)
        if within_budget(cost, used_ms, elapsed_s, share):
            return req
    return None


def _phase(slow_at: Sequence[Any], every: int) -> int:
    """The residue mod *every* most of the slow steps *slow_at* share (the
    pattern's; a loaded host adds slow steps off it), the smallest on a tie."""
    counts: dict[int, int] = {}
    for n in slow_at:
        counts[int(n) % every] = counts.get(int(n) % every, 0) + 1
    return min(counts, key=lambda r: (-counts[r], r))


def top_rows(rows: Sequence[KernelAgg], n: int = TOP_ROWS) -> list[dict[str, Any]]:
    """A window's top rows for a finding: the *n* operators with the most
    self time and the *n* kernels with the most device time, each ``{name,
    kind, count, total_ms, self_ms, share}`` (``share``: of the window's
    total of that kind, 0-1). On a CPU-only run operators carry no device
    time; their CPU time (``total_ns`` of a CPU window) is used as it is."""
    out: list[dict[str, Any]] = []
    for kind in ("op", "kernel"):
        mine = [r for r in rows if r.kind == kind and r.name != "(other)"]
        key = (lambda r: r.self_ns) if kind == "op" else (lambda r: r.total_ns)
        total = sum(key(r) for r in mine)
        for r in sorted(mine, key=lambda r: (-key(r), r.name))[:n]:
            out.append(
                {
                    "name": r.name,
                    "kind": kind,
                    "count": r.count,
                    "total_ms": round(r.total_ns / 1e6, 3),
                    "self_ms": round(r.self_ns / 1e6, 3),
                    "share": round(key(r) / total, 3) if total else None,
                }
            )
    return out


def steps_text(steps: Sequence[int]) -> str:
    """``"steps 120-123"``, ``"step 40"``."""
    if not steps:
        return "its steps"
    lo, hi = min(steps), max(steps)
    return f"step {lo}" if lo == hi else f"steps {lo}-{hi}"


def attach(findings: Sequence[F], windows: Sequence[Mapping[str, Any]]) -> list[F]:
    """*findings* with each evidence window attached to the finding of its
    rule: ``evidence["profile"] = {"request_id", "window_id", "t0_ns",
    "steps", "time", "top"}`` (:func:`top_rows`; ``time``: :data:`TIME_KINDS`).
    Findings are dataclasses (:func:`dataclasses.replace` makes the copy).

    Args:
        findings: a pass's findings.
        windows: the run's evidence windows, each a mapping with ``rule``,
            ``request_id``, ``window_id``, ``t0_ns``, ``steps`` (step
            indices) and ``rows`` (:class:`KernelAgg`); the latest of a rule wins.
    """
    by_rule = {str(w["rule"]): w for w in windows}
    out: list[F] = []
    for f in findings:
        w = by_rule.get(f.rule)
        if w is None:
            out.append(f)
            continue
        profile = {
            "request_id": w.get("request_id"),
            "window_id": w.get("window_id"),
            "t0_ns": w.get("t0_ns"),
            "steps": list(w.get("steps") or []),
            "time": w.get("time") or "device",
            "top": top_rows(list(w.get("rows") or [])),
        }
        out.append(replace(f, evidence={**f.evidence, "profile": profile}))  # type: ignore[type-var]
    return out


def summary_lines(windows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary's line per evidence window: ``evidence: a profiler window
    of steps 120-123 taken for high_step_variance (top op aten::mm)``."""
    lines = []
    for w in windows:
        ops = [r for r in top_rows(list(w.get("rows") or []), 1) if r["kind"] == "op"]
        top = f" (top op {ops[0]['name']})" if ops else ""
        lines.append(
            f"evidence: a profiler window of {steps_text(list(w.get('steps') or []))} "
            f"taken for {w['rule']}{top}"
        )
    return lines


def profile_line(profile: Mapping[str, Any] | None) -> str | None:
    """A finding's attached window (:func:`attach`) in one line: ``Evidence:
    a profiler window of step 123 (CPU time): aten::mm 41.2 ms self (92 %),
    aten::mul 0.3 ms self (1 %)``; None when there is none."""
    if not isinstance(profile, Mapping):
        return None
    top = [r for r in profile.get("top") or [] if isinstance(r, Mapping)]
    kind = "CPU time" if profile.get("time") == "cpu" else "device time"
    parts = []
    for r in top[:3]:
        ms = r.get("self_ms") if r.get("kind") == "op" else r.get("total_ms")
        share = r.get("share")
        pct = f" ({share:.0%})" if isinstance(share, int | float) else ""
        self_word = " self" if r.get("kind") == "op" else ""
        parts.append(f"{r.get('name')} {ms} ms{self_word}{pct}")
    listed = ": " + ", ".join(parts) if parts else ": no operator time recorded"
    steps = steps_text([int(s) for s in profile.get("steps") or []])
    return f"Evidence: a profiler window of {steps} ({kind}){listed}"
