"""The team server's digest: every period (a week by default) the period's
GPU-hours, the three costliest findings with their fix and the runs behind
them, posted to a webhook in Slack's incoming-webhook format (as a run's
webhook) or as JSON.

Sent once per period however many replicas run: the replica whose insert
of the period's ``digests`` row succeeds sends it (the row's key is the
period); the others see the row and do nothing. A post that fails gives
the row back, so the next look (any replica's) tries again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import aiohttp

from gpuprofd.storage.reads.rollups import rollup
from gpuprofd.storage.writes import Store

log = logging.getLogger(__name__)

FORMATS = ("slack", "json")
NS_PER_S = 10**9
#: How long a post may take, seconds (Slack answers in well under a second).
POST_TIMEOUT_S = 10.0
#: The costliest findings a digest names.
TOP = 3
#: The runs named behind each finding.
RUNS_PER_FINDING = 3


def period_end_ns(now_ns: int, every_s: int) -> int:
    """The end of the last whole period before *now_ns*: periods are
    *every_s* long, aligned on the Unix epoch (a week: Thursday 00:00 UTC)."""
    every = every_s * NS_PER_S
    return now_ns // every * every


def _hours(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _mrkdwn(text: str) -> str:
    """*text* escaped for Slack's mrkdwn (``&``, ``<``, ``>``): a run or project
    name is shown, never a link or a mention."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def digest_text(out: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The digest's lines: the totals, then each of the :data:`TOP` costliest
    findings with its fix and its runs (*runs*: rule -> worst runs)."""
    t = out["totals"]
    usd = "" if t["usd"] is None else f" (${t['usd']:,.0f})"
    share = "" if t["lost_share"] is None else f", {t['lost_share'] * 100:.0f}%"
    lines = [
        f"{t['runs']} runs, {_hours(t['gpu_hours'])} GPU-hours{usd}; "
        f"{_hours(t['lost_gpu_hours'])} GPU-hours lost to what gpuprof found{share}."
    ]
    for f in out["findings"][:TOP]:
        names = ", ".join(r["run_name"] or f"run {r['id']}" for r in runs.get(f["rule"], []))
        lines.append(
            f"{f['rule']}: {_hours(f['lost_gpu_hours'])} GPU-hours in {f['runs']} runs"
            + (f" ({names})" if names else "")
            + (f". Fix: {f['fix']}" if f.get("fix") else "")
        )
    return lines


def body(out: dict[str, Any], runs: dict[str, list[dict[str, Any]]], fmt: str) -> dict[str, Any]:
    """The webhook's JSON body: Slack blocks (a header, a section a line) or
    ``{"event": "gpuprof.digest", "rollup": ..., "runs": ..., "text": ...}``."""
    lines = digest_text(out, runs)
    head = "gpuprof: the team's GPU-hours"
    if fmt == "json":
        return {"event": "gpuprof.digest", "rollup": out, "runs": runs, "text": "\n".join(lines)}
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": head, "emoji": False}}
    ]
    for line in lines:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(line)}})
    return {"text": f"{head}: {lines[0]}", "blocks": blocks}


async def _runs_behind(store: Store, rules: list[str], start: int, end: int) -> dict[str, Any]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rule in rules:
        rows = await store.fetchall(
            "SELECT f.run_id, c.run_name, f.lost_gpu_hours FROM run_cost_findings f "
            "JOIN run_costs c ON c.run_id = f.run_id WHERE f.rule = ? AND f.at_wall_ns >= ? "
            "AND f.at_wall_ns < ? ORDER BY f.lost_gpu_hours DESC LIMIT ?",
            (rule, start, end, RUNS_PER_FINDING),
        )
        out[rule] = [
            {"id": int(r[0]), "run_name": r[1], "lost_gpu_hours": float(r[2])} for r in rows
        ]
    return out


class Digest:
    """Posts the digest of each period to *url* once, across replicas."""

    def __init__(self, store: Store, url: str, every_s: int, fmt: str = "slack") -> None:
        if fmt not in FORMATS:
            raise ValueError(f"digest format must be slack or json, got {fmt!r}")
        self.store, self.url, self.every_s, self.fmt = store, url, every_s, fmt
        #: Digests this replica sent (for its log and tests).
        self.sent = 0

    async def _claim(self, end: int) -> bool:
        rows = await self.store.transaction(
            lambda txn: txn.fetch(
                "INSERT INTO digests (period_end_ns, every_s, claimed_wall_ns) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING RETURNING period_end_ns",
                (end, self.every_s, time.time_ns()),
            ),
            "digest claim",
        )
        return bool(rows)

    async def _release(self, end: int) -> None:
        await self.store.transaction(
            lambda txn: txn.execute(
                "DELETE FROM digests WHERE period_end_ns = ? AND every_s = ?", (end, self.every_s)
            ),
            "digest release",
        )

    async def tick(self, now_ns: int | None = None) -> bool:
        """Send the last whole period's digest unless a replica has; True
        when this call sent it. A failed post is logged and retried later."""
        end = period_end_ns(time.time_ns() if now_ns is None else now_ns, self.every_s)
        if not await self._claim(end):
            return False
        start = end - self.every_s * NS_PER_S
        try:
            out = await rollup(self.store, "finding", start, end)
            runs = await _runs_behind(
                self.store, [f["rule"] for f in out["findings"][:TOP]], start, end
            )
            payload = body(out, runs, self.fmt)
            payload_period = {"period_start_s": start / NS_PER_S, "period_end_s": end / NS_PER_S}
            if self.fmt == "json":
                payload.update(payload_period)
            timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.post(self.url, json=payload) as resp:
                    if resp.status >= 300:
                        raise RuntimeError(f"the webhook answered HTTP {resp.status}")
        except Exception as exc:  # noqa: BLE001 - given back: the next look tries again
            log.warning("digest for the period ending %d not sent: %s", end // NS_PER_S, exc)
            await self._release(end)
            return False
        self.sent += 1
        log.info("digest for the period ending %d sent", end // NS_PER_S)
        return True
