"""A distributed job whose ranks reached the server from two nodes is one
group: its findings are computed on the server once every rank has ended,
and the straggler on the second node is named."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.daemon.batches import batch, end_event, new_uuid, run_event
from tests.daemon.server.conftest import TeamServer, login

GROUP = "torchrun-job-42"
STEPS = 60


def _rank_steps(seq: int, run: str, straggler: bool) -> dict[str, Any]:
    """100 ms steps; the straggler's backward is 30 ms longer, so it waits
    30 ms less in the all-reduce than the others (whose comm is 32 ms)."""
    ms = 1_000_000
    backward, comm = (80 * ms, 2 * ms) if straggler else (50 * ms, 32 * ms)
    rows = []
    for i in range(STEPS):
        t0 = 2_000_000_000 + i * 100 * ms
        phases = {"forward": 10 * ms, "backward": backward, "comm": comm}
        rows.append({"step": i, "t0_ns": t0, "t1_ns": t0 + 100 * ms, "micro": 1, "phases": phases})
    return {"seq": seq, "kind": "steps", "run": run, "rows": rows}


def _node_batch(node: str, ranks: list[int], slow: int) -> tuple[dict[str, Any], list[str]]:
    events: list[dict[str, Any]] = []
    runs = []
    seq = 0
    for rank in ranks:
        run = new_uuid()
        runs.append(run)
        fields = {
            "rank": rank,
            "local_rank": rank % 2,
            "world_size": 4,
            "group_id": GROUP,
            "host": node,
            "boot_id": f"boot-{node}",
            "cuda_uuid": None,
            "clock_offset_ns": 0 if rank == 0 else 1_000_000 * rank,
            "clock_uncertainty_ns": 50_000,
            "clock_reference_rank": 0,
        }
        events.append(run_event(seq := seq + 1, run, name="ddp", **fields))
        events.append(_rank_steps(seq := seq + 1, run, rank == slow))
        events.append(end_event(seq := seq + 1, run))
    return batch(node, events, host=node), runs


def test_ranks_from_two_nodes_are_one_group_and_the_straggler_is_named(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, pg_url).start()
    team_servers.append(server)
    a, _ = _node_batch("node-a", [0, 1], slow=3)
    b, _ = _node_batch("node-b", [2, 3], slow=3)
    assert server.ingest(a).status_code == 200
    assert server.ingest(b).status_code == 200
    with server.client() as c:
        assert login(c).status_code == 200
        deadline = time.monotonic() + 60
        while True:
            found = c.get(f"/api/v1/groups/{GROUP}").json()
            rules = [i["rule"] for i in found.get("insights", [])]
            if "straggler_rank" in rules or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        hosts = sorted({r["host"] for r in found["ranks"]})
    assert [r["rank"] for r in found["ranks"]] == [0, 1, 2, 3] and hosts == ["node-a", "node-b"]
    straggler = next(i for i in found["insights"] if i["rule"] == "straggler_rank")
    assert straggler["title"].startswith("Rank 3 is a straggler")
    assert "comm_dominant" not in rules  # the straggler explains the others' wait
