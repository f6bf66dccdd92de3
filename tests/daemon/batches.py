"""Ingest batches for the team server's tests (docs/team-server.md's format)."""

from __future__ import annotations

import uuid
from typing import Any

BOOT = "0b5e7c1e-boot"
GPU = "c0ffee00-0000-0000-0000-000000000001"


def new_uuid() -> str:
    return str(uuid.uuid4())


def run_event(seq: int, run: str, name: str = "exp", **fields: Any) -> dict[str, Any]:
    base = {
        "run_name": name,
        "status": "running",
        "start_wall_ns": 1_700_000_000_000_000_000,
        "start_mono_ns": 1_000_000_000,
        "host": "node-a",
        "pid": 4242,
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "auto": 1,
        "options": {"flops_per_step": 5e12},
        "cuda_uuid": GPU,
        "boot_id": BOOT,
        "cpu_count": 8,
    }
    return {"seq": seq, "kind": "run", "run": run, "fields": {**base, **fields}}


def step_rows(first: int, n: int, step_ms: float = 100.0) -> list[dict[str, Any]]:
    ns = int(step_ms * 1e6)
    rows = []
    for i in range(first, first + n):
        t0 = 1_000_000_000 + i * ns
        rows.append(
            {
                "step": i,
                "t0_ns": t0,
                "t1_ns": t0 + ns,
                "wait_ns": ns // 10,
                "explicit": 0,
                "micro": 1,
                "phases": {"forward": ns // 3, "backward": ns // 2},
            }
        )
    return rows


def steps_event(seq: int, run: str, first: int = 0, n: int = 5) -> dict[str, Any]:
    return {"seq": seq, "kind": "steps", "run": run, "rows": step_rows(first, n)}


def end_event(seq: int, run: str, status: str = "finished") -> dict[str, Any]:
    fields = {"status": status, "end_wall_ns": 1_700_000_060_000_000_000, "end_mono_ns": 61e9}
    fields["end_mono_ns"] = 61_000_000_000
    return {"seq": seq, "kind": "end", "run": run, "fields": fields}


def batch(node: str, events: list[dict[str, Any]], host: str = "node-a") -> dict[str, Any]:
    return {"v": 1, "node": node, "host": host, "events": events}
