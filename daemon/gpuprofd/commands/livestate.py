"""What ``gpuprofctl top`` and ``watch`` hold of the daemon's live feed
(``/api/v1/live``, docs/dashboard.md): each message applied in order, the
cursors a reconnect resends. Pure: no I/O, so a frame can be rendered from
a controlled sequence of messages."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpuprof.window import PHASES

#: Steps a watch keeps (the chart's columns and the window's figures read them).
HISTORY_STEPS = 20_000


@dataclass
class NodeState:
    """``top``'s state: the latest ``node`` message, and the feed's last error."""

    node: dict[str, Any] | None = None
    error: str | None = None

    def apply(self, msg: dict[str, Any]) -> None:
        """One message of the feed (others than ``node`` and ``error`` are ignored)."""
        kind = msg.get("type")
        if kind == "node":
            self.node, self.error = msg, None
        elif kind == "error":
            self.error = str(msg.get("error"))


@dataclass(frozen=True)
class StepPoint:
    """One step of a watched run: iteration and phases in ms, its flags."""

    step: int
    t: float
    iter: float
    phases: tuple[float, ...]
    """Each of :data:`gpuprof.window.PHASES`, ms."""
    eval: bool = False
    skipped: bool = False
    traced: bool = False

    def row(self) -> dict[str, Any]:
        """As a :func:`gpuprof.window.window_figures` row (ms)."""
        return {
            "iter": self.iter,
            **dict(zip(PHASES, self.phases, strict=True)),
            "eval": self.eval,
            "skipped": self.skipped,
            "traced": self.traced,
        }


def step_point(row: dict[str, Any]) -> StepPoint | None:
    """A live ``steps`` row as a :class:`StepPoint`; None when it lacks its
    index or iteration time (a bad row is skipped, never a crash)."""
    step, ms = row.get("step"), row.get("step_ms")
    if not isinstance(step, int) or not isinstance(ms, (int, float)):
        return None
    phases = row.get("phases_ms") if isinstance(row.get("phases_ms"), dict) else {}
    return StepPoint(
        step=step,
        t=float(row.get("t") or 0),
        iter=float(ms),
        phases=tuple(float(phases.get(p) or 0) for p in PHASES),
        eval=bool(row.get("eval")),
        skipped=bool(row.get("skipped")),
        traced=bool(row.get("traced")),
    )


@dataclass
class RunState:
    """``watch``'s state of one run: its headline (``/runs/{id}``'s
    ``run``), its state (the ``run`` messages), its last
    :data:`HISTORY_STEPS` steps, each GPU's and the host's latest sample,
    the current findings, and its summary once it ended."""

    run_id: int
    headline: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    steps: deque[StepPoint] = field(default_factory=lambda: deque(maxlen=HISTORY_STEPS))
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)
    host: dict[str, Any] | None = None
    insights: list[dict[str, Any]] = field(default_factory=list)
    insights_s: float | None = None
    """When the findings were computed (unix s; None: not yet)."""
    summary: dict[str, Any] | None = None
    error: str | None = None
    reset: bool = False
    """The feed said ``reset``: the client fell behind; resubscribe with new cursors."""
    _step_cursor: int = -1
    _stream_t: dict[str, float] = field(default_factory=dict)
    _t_cursor: float = 0.0

    @property
    def ended(self) -> bool:
        """The run is no longer running (its state says so)."""
        status = self.state.get("status")
        return status is not None and status != "running"

    def cursors(self) -> dict[str, Any]:
        """What a (re)subscribe sends: the last step held and the oldest of
        the latest sample times held per stream (none lost on a reconnect;
        repeats are dropped by :meth:`apply`)."""
        t = min(self._stream_t.values()) if self._stream_t else self._t_cursor
        return {"step": self._step_cursor, "t": t}

    def start_at(self, step: int, t: float) -> None:
        """Hold nothing before step index *step* and time *t* (unix s): a
        run's last minutes, not its whole history (and after a ``reset``)."""
        self._step_cursor = max(self._step_cursor, step)
        self._t_cursor = max(self._t_cursor, t)
        self._stream_t = {k: max(v, t) for k, v in self._stream_t.items()}
        self.reset = False

    def apply(self, msg: dict[str, Any]) -> None:
        """One message of the feed, in order; repeats (a reconnect's) dropped."""
        kind = msg.get("type")
        if kind == "steps":
            for row in msg.get("rows") or []:
                point = step_point(row) if isinstance(row, dict) else None
                if point is not None and point.step > self._step_cursor:
                    self.steps.append(point)
                    self._step_cursor = point.step
        elif kind in ("gpus", "host"):
            for s in msg.get("samples") or []:
                if not isinstance(s, dict) or not isinstance(s.get("t"), (int, float)):
                    continue
                key = f"gpu:{s.get('uuid')}" if kind == "gpus" else "host"
                if s["t"] <= self._stream_t.get(key, self._t_cursor):
                    continue
                self._stream_t[key] = s["t"]
                if kind == "gpus":
                    self.gpus[str(s.get("uuid"))] = s
                else:
                    self.host = s
        elif kind == "insights":
            found = msg.get("insights")
            self.insights = [i for i in found if isinstance(i, dict)] if found else []
            self.insights_s = msg.get("computed_s")
        elif kind == "run" and isinstance(msg.get("run"), dict):
            self.state = msg["run"]
        elif kind == "reset":
            self.reset = True
        elif kind == "error":
            self.error = str(msg.get("error"))

    def step_count(self) -> int | None:
        """The run's steps: the ``run`` state's count (the headline's before
        one came) and the steps that arrived after it with higher indices
        (the state is sent every few seconds, steps every second); None when
        neither said a count."""
        count = self.state.get("steps", self.headline.get("steps"))
        if not isinstance(count, int) or "last_step" not in self.state:
            return count if isinstance(count, int) else None
        last = self.state["last_step"]
        beyond = 0
        for p in reversed(self.steps):  # held in index order: the newest first
            if isinstance(last, int) and p.step <= last:
                break
            beyond += 1
        return count + beyond

    def window(self, n: int) -> list[dict[str, Any]]:
        """The last *n* steps as :func:`gpuprof.window.window_figures` rows."""
        last = list(self.steps)[-n:] if n < len(self.steps) else list(self.steps)
        return [p.row() for p in last]
