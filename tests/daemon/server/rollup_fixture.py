"""A team server fed by two nodes' forwarded runs: two users, two projects
(one of them a hostile name), each run's summary with its findings' gains.

By hand (the week before now):
- alice's "pretrain" (project llm, node-a): 10 h x 8 GPUs = 80 GPU-hours at
  $4 = $320; fix-all 1 h of run time = 8 GPU-hours lost, claimed by a loader
  stall (1 h) and the GPU idle it causes (0.75 h): 8 x 8/14 and 8 x 6/14;
- bob's "sft" (project HOSTILE, node-b): 2 h x 4 GPUs = 8 GPU-hours ($32);
  900 s x 4 GPUs = 1 GPU-hour lost to the stall.
"""

from __future__ import annotations

import time
from typing import Any

from tests.daemon.batches import batch, new_uuid, run_event

NS = 10**9
H = 3600 * NS
#: A project name that would run script if it reached a page as HTML.
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'
STALL = 8 * 8 / 14 + 1.0
IDLE = 8 * 6 / 14
FIX = "Raise DataLoader num_workers"
IDLE_RULE = "gpu_idle_between_steps"


def summary(fix_all_s: float, gains: dict[str, float]) -> dict[str, Any]:
    found = [
        {"rule": "estimated_cost", "severity": "LOW", "title": "cost", "detail": "",
         "fix": "", "evidence": {"usd_per_hour": 4.0}},
        *({"rule": r, "severity": "HIGH", "title": r, "detail": "", "fix": FIX,
           "evidence": {}, "gain_run_s": s} for r, s in gains.items()),
    ]  # fmt: skip
    return {"insights": found, "gains": {"fix_all_run_s": fix_all_s}}


def end(seq: int, run: str, end_ns: int, summ: dict[str, Any]) -> dict[str, Any]:
    fields = {"status": "finished", "end_wall_ns": end_ns, "summary": summ}
    return {"seq": seq, "kind": "end", "run": run, "fields": fields}


def feed(server: Any) -> None:
    """Forward the two nodes' runs to *server* (a ``TeamServer``)."""
    now = time.time_ns()
    pre, sft = new_uuid(), new_uuid()
    a_end, b_end = now - 86400 * NS, now - 7200 * NS
    a = [
        run_event(1, pre, name="pretrain", start_wall_ns=a_end - 10 * H, user_name="alice",
                  project="llm", gpu_count=8),
        end(2, pre, a_end, summary(3600, {"dataloader_stall": 3600, IDLE_RULE: 2700})),
    ]  # fmt: skip
    assert server.ingest(batch("n1", a)).status_code == 200
    b = [
        run_event(1, sft, name="sft", host="node-b", start_wall_ns=b_end - 2 * H,
                  user_name="bob", project=HOSTILE, gpu_count=4),
        end(2, sft, b_end, summary(900, {"dataloader_stall": 900})),
    ]  # fmt: skip
    assert server.ingest(batch("n2", b, host="node-b")).status_code == 200
