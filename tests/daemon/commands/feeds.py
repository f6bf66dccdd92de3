"""Controlled live feeds for the terminal views' frame tests: messages as
the daemon's ``/api/v1/live`` sends them (docs/dashboard.md), with known
figures, and a frame rendered as the plain text a pipe gets."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.text import Text

T0 = 1_796_163_600.0
GPU0 = "GPU-7f2c0a4e-5b1d-4c3e-9a8f-0d1e2f3a4b5c"
GPU1 = "GPU-11111111-2222-3333-4444-555555555555"
#: A run name no shim sends (a team server stores names as sent): ESC [2J clears a screen.
HOSTILE = "sft-\x1b[2J\x1b]0;pwned\x07"


def plain(text: Text, width: int = 80) -> str:
    """*text* as printed to a pipe: no colour, no escape code, lines as drawn."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False).print(text, crop=True)
    return out.getvalue()


def window(mean: float, median: float, pct: dict[str, float | None]) -> dict[str, Any]:
    return {
        "steps": 100,
        "mean_ms": mean,
        "median_ms": median,
        "steps_per_s": round(1000 / mean, 3),
        "pct": pct,
        "eval": 0,
        "skipped": 0,
        "traced": 0,
    }


STALL = {
    "rule": "dataloader_stall",
    "severity": "HIGH",
    "title": "62% of step time waiting on the loader; the workers are CPU-bound",
    "detail": "...",
    "fix": "...",
    "evidence": {"wait_share": 0.62},
    "gain_ms_per_iteration": 51.2,
    "gain_speedup_max": 2.6,
}
LOW_MFU = {
    "rule": "low_mfu",
    "severity": "MED",
    "title": "MFU 18%: the GPU does a small share of the math it could",
    "detail": "...",
    "fix": "...",
    "evidence": {},
}


def node_message() -> dict[str, Any]:
    """Two runs on one node (one with a hostile name), two GPUs, the host."""
    mlp = {
        "id": 7,
        "name": "digits-mlp",
        "user": "alice",
        "host": "node-a",
        "group": None,
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "status": "running",
        "start_s": T0 - 120,
        "steps": 1520,
        "last_step_s": T0,
        "window": window(
            82.4,
            52.1,
            {
                "loader_wait": 62.0,
                "forward": 10.0,
                "backward": 18.0,
                "comm": None,
                "optimizer": 7.0,
                "other": 3.0,
            },
        ),
        "mfu": None,
        "dropped_events": 0,
        "cpu_cores": 1.21,
        "gpu_uuid": GPU0,
        "insights": 2,
        "top_insight": STALL,
    }
    sft = {
        **mlp,
        "id": 8,
        "name": HOSTILE,
        "user": "bob",
        "group": "sft-7f3a",
        "rank": 1,
        "local_rank": 1,
        "world_size": 8,
        "steps": 40,
        "window": window(
            812.0,
            805.5,
            {
                "loader_wait": 1.0,
                "forward": 30.0,
                "backward": 50.0,
                "comm": 10.0,
                "optimizer": 8.0,
                "other": 1.0,
            },
        ),
        "mfu": 0.18,
        "dropped_events": 3,
        "cpu_cores": 0.9,
        "gpu_uuid": GPU1,
        "top_insight": LOW_MFU,
    }
    gpu = {
        "index": 0,
        "uuid": GPU0,
        "name": "NVIDIA H200",
        "power_limit_w": 700.0,
        "host": "node-a",
        "t": T0,
        "util_pct": 41.0,
        "mem_used_bytes": 1_500_000_000,
        "power_w": 212.5,
        "temp_c": 38.0,
        "sm_clock_mhz": 1980.0,
        "mem_total_bytes": 150_754_820_096,
        "runs": [{"id": 7, "rank": 0}],
    }
    return {
        "type": "node",
        "t": T0 + 1,
        "window_steps": 100,
        "runs": [sft, mlp],
        "gpus": [
            gpu,
            {**gpu, "index": 1, "uuid": GPU1, "util_pct": 97.0, "runs": [{"id": 8, "rank": 1}]},
        ],
        "hosts": [
            {
                "host": "node-a",
                "t": T0 + 1,
                "cpu_count": 16,
                "busy_cores": 2.5,
                "run_cores": 2.11,
                "other_cores": 0.39,
            }
        ],
    }


def step_row(i: int, wait: float, compute: float, **flags: bool) -> dict[str, Any]:
    """A live ``steps`` row (one every 0.5 s): *wait* ms of loader wait,
    *compute* ms of step split forward 1/3, backward 1/2, optimizer 1/6."""
    phases = {
        "loader_wait": wait,
        "forward": compute / 3,
        "backward": compute / 2,
        "comm": 0.0,
        "optimizer": compute / 6,
        "other": 0.0,
    }
    return {
        "step": i,
        "t": T0 + i * 0.5,
        "step_ms": wait + compute,
        "phases_ms": phases,
        "eval": flags.get("eval", False),
        "skipped": flags.get("skipped", False),
        "traced": flags.get("traced", False),
        "mem_allocated_bytes": None,
        "mem_reserved_bytes": None,
    }


RUN_HEADLINE = {
    "id": 7,
    "name": "digits-mlp",
    "status": "running",
    "live": True,
    "host": "node-a",
    "user": "alice",
    "rank": 0,
    "local_rank": 0,
    "world_size": 1,
    "group": None,
    "steps": 0,
    "gpus": [
        {
            "index": 0,
            "uuid": GPU0,
            "name": "NVIDIA H200",
            "mem_total_bytes": 150_754_820_096,
            "power_limit_w": 700.0,
        }
    ],
}


def run_messages(steps: int = 60) -> list[dict[str, Any]]:
    """A watched run's first messages: its state, findings, *steps* steps
    (about 2 a second: 480 ms of compute, 20 ms of loader wait, every 10th
    waits 300 ms; step 20 had evaluation before it, step 40 was traced), a
    GPU and a host sample."""
    rows = [
        step_row(i, 320.0 if i % 10 == 0 else 20.0, 480.0, eval=i == 20, traced=i == 40)
        for i in range(steps)
    ]
    state = {
        "id": 7,
        "name": "digits-mlp",
        "status": "running",
        "live": True,
        "steps": steps,
        "last_step": steps - 1 if steps else None,
        "end_s": None,
        "dropped_events": 0,
        "error": None,
    }
    return [
        {"type": "run", "run": state},
        {"type": "insights", "insights": [STALL, LOW_MFU], "computed_s": T0 + 5},
        {"type": "steps", "rows": rows},
        {
            "type": "gpus",
            "samples": [
                {
                    "uuid": GPU0,
                    "t": T0 + 6,
                    "util_pct": 41.0,
                    "mem_used_bytes": 1_500_000_000,
                    "power_w": 212.5,
                    "temp_c": 38.0,
                    "sm_clock_mhz": 1980.0,
                }
            ],
        },
        {
            "type": "host",
            "samples": [
                {
                    "t": T0 + 6,
                    "cpu_count": 16,
                    "run_cores": 1.2,
                    "other_cores": 0.3,
                    "disk_read_bps": 0.0,
                    "page_cache_bytes": 4_100_000_000,
                }
            ],
        },
    ]


# --- a team server's batch (docs/team-server.md's format) with known figures ---------

NS = 1_000_000_000


def node_batch(run: str, name: str = "digits-mlp", cpu_run: str | None = None) -> dict[str, Any]:
    """One node's batch: run *run* (its GPU the test GPU) with 150 steps of
    110 ms (10 ms loader wait; forward 1/3, backward 1/2 of the step), its
    GPU's second at 15 s, a host sample at 15.5 s (8 cores, 25 % busy: 2
    cores) with the run's 1.25 cores, and two findings (LOW, then HIGH);
    with *cpu_run*, a second running run with no GPU and no step."""
    from tests.daemon.batches import BOOT, GPU, batch, run_event, steps_event

    insights = [
        {"rule": "estimated_cost", "severity": "LOW", "title": "Estimated cost: 0.01 GPU-hours"},
        {**STALL, "title": "Data loading is 9% of each step"},
    ]
    rollup = {
        "sec_ns": 15 * NS,
        "uuid": GPU,
        "boot_id": BOOT,
        "n": 10,
        "util_mean": 97.5,
        "mem_used_max": 40_000_000_000,
        "mem_total_bytes": 150_000_000_000,
        "power_mean_mw": 612_000.0,
        "temp_max_c": 51.0,
        "sm_mean_mhz": 1980.0,
    }
    events = [
        run_event(
            1,
            run,
            name=name,
            cuda_uuid=f"GPU-{GPU}",
            gpu_model="NVIDIA H200",
            user_name="alice",
            dropped_events=2,
        ),
        steps_event(2, run, n=100),
        steps_event(3, run, first=100, n=50),
        {"seq": 4, "kind": "gpu_rollups", "rows": [rollup]},
        {
            "seq": 5,
            "kind": "host_samples",
            "rows": [{"mono_ns": 15_500_000_000, "boot_id": BOOT, "cpu_pct": 25.0, "cpu_count": 8}],
        },
        {
            "seq": 6,
            "kind": "run_cpu",
            "run": run,
            "rows": [{"mono_ns": 15_500_000_000, "cores": 1.25}],
        },
        {"seq": 7, "kind": "insights", "run": run, "insights": insights},
    ]
    if cpu_run is not None:
        events.append(run_event(8, cpu_run, name="cpu-only", cuda_uuid=None, user_name="bob"))
    return batch("n1", events)
