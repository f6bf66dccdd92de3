"""Two node daemons (two "nodes": two databases, two socket directories)
forwarding one distributed job's ranks (torchrun, gloo, 2 ranks, each rank
pointed at its own node's daemon): each node knows only its rank; the
team server's group view has both, and compares them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.forward.conftest import db_rows, ended_on_server, node_ledger, serve, wait_until
from tests.daemon.server.conftest import TeamServer, login

pytestmark = pytest.mark.timeout(420)  # torchrun and two gpuprofd on a busy box

STEPS = 30

#: A tiny DDP job; rank R reports to the daemon on SOCK_R (its node).
DDP = r"""
import os, time
os.environ["GPUPROF_SOCKET"] = os.environ["SOCK_" + os.environ["LOCAL_RANK"]]
os.environ["GPUPROF_DB"] = os.environ["DB_" + os.environ["LOCAL_RANK"]]
import torch
import torch.distributed as dist
from torch import nn
import gpuprof

torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with gpuprof.profile("two-nodes", print_summary=False):
    for step in range(STEPS):
        loss = model(torch.randn(16, 32)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.01)
dist.destroy_process_group()
print("RANK DONE", dist.is_initialized())
""".replace("STEPS", str(STEPS))


def test_two_nodes_forward_one_jobs_ranks_and_the_server_compares_them(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], nodes: Any
) -> None:
    server = serve(tmp_path, pg_url)
    team_servers.append(server)
    a, b = nodes("node-a"), nodes("node-b")
    a.start(server.url)
    b.start(server.url)
    env = {"SOCK_0": str(a.socket_dir), "DB_0": str(a.db)}
    env.update(SOCK_1=str(b.socket_dir), DB_1=str(b.db))
    out = a.torchrun(DDP, 2, env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]

    # each node has its own rank only, in the same group
    (rank_a,) = a.rows("SELECT rank, group_id, run_uuid, median_step_ms FROM runs")
    (rank_b,) = b.rows("SELECT rank, group_id, run_uuid, median_step_ms FROM runs")
    assert (rank_a[0], rank_b[0]) == (0, 1) and rank_a[1] == rank_b[1]
    group = str(rank_a[1])
    assert a.count("SELECT COUNT(*) FROM steps") == b.count("SELECT COUNT(*) FROM steps") == STEPS
    alone = a.group_json(group)
    assert alone is not None and [m["rank"] for m in alone["missing_ranks"]] == [1]  # half the job

    for run_uuid in (rank_a[2], rank_b[2]):
        wait_until(lambda u=run_uuid: ended_on_server(pg_url, u), 120, "both ends on the server")
    # two nodes, each its own sequence, each rank's run from its own node
    assert len(node_ledger(pg_url)) == 2
    owners = db_rows(pg_url, "SELECT rank, node_id FROM runs ORDER BY rank")
    assert [r[0] for r in owners] == [0, 1] and owners[0][1] != owners[1][1]

    with server.client() as viewer:
        assert login(viewer).status_code == 200
        view = wait_until(
            lambda: (
                (g := viewer.get(f"/api/v1/groups/{group}").json()).get("status") == "finished"
                and g
            ),
            60,
            "the group's view",
        )
    assert view["group"] == group and view["counts"] == {"finished": 2}
    assert view["missing"] == [] and not view["comm_missing"]  # both ranks, both timed
    ranks = {r["rank"]: r for r in view["ranks"]}
    assert sorted(ranks) == [0, 1]
    # what the server compares is what each node measured of its rank
    for rank, mine in ((0, rank_a), (1, rank_b)):
        assert ranks[rank]["median_step_ms"] == pytest.approx(mine[3], rel=1e-9)
        assert ranks[rank]["status"] == "finished"
        assert ranks[rank]["comm_ms"] is not None and ranks[rank]["grad_bytes"]
        assert ranks[rank]["worst_step_ms"] is not None
    assert ranks[0]["grad_bytes"] == ranks[1]["grad_bytes"]  # one model, all-reduced
    # rank 1's clock measured against rank 0's, across the two nodes' daemons
    assert ranks[0]["clock_offset_ms"] == 0 and ranks[1]["clock_offset_ms"] is not None
    stored = db_rows(pg_url, "SELECT ranks FROM group_insights WHERE group_id = ?", (group,))
    assert all(r[0] == 2 for r in stored)  # the group's findings compared both ranks
    assert json.dumps(view["insights"])  # a list of findings (possibly none on this box)
