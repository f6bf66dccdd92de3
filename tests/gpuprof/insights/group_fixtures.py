"""Synthetic DDP groups: per-rank ``step`` events (wire shape, with ``comm``
bucket rows and the ``comm`` phase) as the shim sends them, for the group
context builder and the daemon's group report.

One step of the model, per rank ``r``: forward, then backward; gradient
bucket ``b`` (of :data:`N_BUCKETS`) is ready, and its all-reduce launched, at
``t0 + FWD + (b + 1) / N * backward_r`` (plus any injected hook delay on that
rank and bucket); the all-reduce completes on every rank :data:`ALLREDUCE_NS`
after the last rank launched it. The exposed comm (the ``comm`` phase) is
``last completion - own last launch`` and is taken out of backward, as the
shim does; the optimizer follows. Every time gets a little seeded jitter.
"""

from __future__ import annotations

import random
from typing import Any

from gpuprof.comm import BucketTiming, exposed_comm_ns
from gpuprof.insights.group_context import RankRows

MS = 1_000_000
FWD_NS = 20 * MS
BWD_NS = 40 * MS
OPT_NS = 5 * MS
WAIT_NS = 1 * MS
ALLREDUCE_NS = 2 * MS
N_BUCKETS = 4
BUCKET_BYTES = 6_250_000
JITTER_NS = 200_000
BASE_NS = 10**12


def group_steps(
    n_ranks: int,
    n_steps: int = 30,
    slow_backward: dict[int, int] | None = None,
    late_bucket: tuple[int, int, int] | None = None,
    clock_shift: dict[int, int] | None = None,
    seed: int = 7,
) -> dict[int, list[dict[str, Any]]]:
    """Per rank, its ``step`` events (``run_key`` left out).

    Args:
        slow_backward: rank -> extra backward ns (a straggler).
        late_bucket: (rank, bucket, delay ns): that rank launches that
            bucket's all-reduce late (a slow comm hook on that rank only).
        clock_shift: rank -> ns added to every time it reports (its clock
            runs ahead of the reference rank's by that much).
    """
    rng = random.Random(seed)
    slow_backward = slow_backward or {}
    clock_shift = clock_shift or {}
    out: dict[int, list[dict[str, Any]]] = {r: [] for r in range(n_ranks)}
    t0 = BASE_NS
    for i in range(n_steps):
        ready: dict[int, list[int]] = {}
        for r in range(n_ranks):
            bwd = BWD_NS + slow_backward.get(r, 0)
            starts = []
            for b in range(N_BUCKETS):
                t = t0 + FWD_NS + (b + 1) * bwd // N_BUCKETS + rng.randrange(JITTER_NS)
                if late_bucket and late_bucket[:2] == (r, b):
                    t += late_bucket[2]
                starts.append(t)
            ready[r] = starts
        done = [max(ready[r][b] for r in range(n_ranks)) + ALLREDUCE_NS for b in range(N_BUCKETS)]
        t1_common = max(done) + OPT_NS
        for r in range(n_ranks):
            shift = clock_shift.get(r, 0)
            ends = [d + rng.randrange(JITTER_NS // 4) for d in done]
            rows = [
                BucketTiming(b, ready[r][b], max(ends[b], ready[r][b]), BUCKET_BYTES)
                for b in range(N_BUCKETS)
            ]
            comm = exposed_comm_ns(rows)
            own_t1 = max(max(ends) + OPT_NS, t1_common)
            backward = max(b.start_ns for b in rows) - (t0 + FWD_NS)
            out[r].append(
                {
                    "i": i,
                    "t0": t0 + shift,
                    "t1": own_t1 + shift,
                    "wait": WAIT_NS,
                    "explicit": False,
                    "micro": 1,
                    "phases": {
                        "forward": FWD_NS,
                        "backward": backward,
                        "comm": comm,
                        "optimizer": OPT_NS,
                    },
                    "comm": [
                        [b.bucket, b.start_ns + shift, b.end_ns + shift, b.nbytes] for b in rows
                    ],
                }
            )
        t0 = t1_common + WAIT_NS
    return out


def rank_rows(
    steps: dict[int, list[dict[str, Any]]],
    hosts: dict[int, str] | None = None,
    offsets: dict[int, int] | None = None,
) -> list[RankRows]:
    """The builder's input for :func:`group_steps`' events (as stored)."""
    hosts = hosts or {}
    offsets = offsets or {}
    return [
        RankRows(
            rank=r,
            steps=[
                {
                    "step": s["i"],
                    "t0": s["t0"],
                    "t1": s["t1"],
                    "phases": s["phases"],
                    "traced": bool(s.get("traced")),
                }
                for s in events
            ],
            buckets=[(s["i"], *row) for s in events for row in s.get("comm", [])],
            host=hosts.get(r, "node-a"),
            clock_offset_ns=offsets.get(r),
        )
        for r, events in steps.items()
    ]
