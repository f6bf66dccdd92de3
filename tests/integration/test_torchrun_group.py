"""torchrun (gloo, CPU) under ``gpuprof.profile``: every rank detected from
torchrun's environment, one group on the node, ``gpuprofctl --group``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.conftest import Node, ping, wait_for

#: A tiny DDP model, 20 steps; no gpuprof code beyond ``profile("ddp")``.
#: With KILL_RANK set, that rank keeps training alone after the DDP steps and
#: kills itself (SIGKILL) mid-run once every other rank has ended its run.
DDP = r"""
import os, signal, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
import gpuprof

torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kill_rank = int(os.environ.get("KILL_RANK", "-1"))
flags = Path(os.environ.get("FLAG_DIR", "."))
with gpuprof.profile("ddp", print_summary=False):
    for step in range(20):
        loss = model(torch.randn(16, 32)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == kill_rank:  # alone now: no collective waits on it
        local = nn.Linear(32, 4)
        lopt = torch.optim.SGD(local.parameters(), lr=0.01)
        for step in range(1000):
            local(torch.randn(16, 32)).sum().backward()
            lopt.step()
            lopt.zero_grad()
            if step == 5:  # mid-run: once the other ranks have ended theirs
                deadline = time.monotonic() + 60
                while len(list(flags.glob("done-*"))) < world - 1 and time.monotonic() < deadline:
                    time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGKILL)
if kill_rank >= 0:
    (flags / f"done-{rank}").touch()
    time.sleep(30)  # torchrun stops us once the killed rank is seen gone
else:
    dist.destroy_process_group()
print("RANK DONE", rank)
"""


def _torchrun(node: Node, nproc: int, env: dict[str, str] | None = None):
    return node.torchrun(DDP, nproc, env, timeout=90)


@pytest.mark.parametrize("nproc", [2, 4])
def test_torchrun_ranks_form_one_group(node: Node, nproc: int):
    out = _torchrun(node, nproc)
    assert out.returncode == 0, out.stderr[-3000:]
    group = node.only_group()
    runs = node.query("SELECT rank, local_rank, world_size, local_world_size, status FROM runs")
    expected = [(r, r, nproc, nproc, "finished") for r in range(nproc)]
    assert sorted(tuple(r) for r in runs) == expected

    listed = node.ctl("runs", str(node.db), "--group", group, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["rank"] for r in rows] == list(range(nproc))
    assert {r["group"] for r in rows} == {group}
    assert all(r["steps"] == 20 for r in rows)

    text = node.ctl("runs", str(node.db), "--group", group)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"group {group}: finished ({nproc} ranks: {nproc} finished)"
    assert lines[1].split()[:2] == ["ID", "RANK"]
    assert [line.split()[1] for line in lines[2:]] == [str(r) for r in range(nproc)]

    data = wait_for(lambda: node.group_json(group), 20, "the group to end")
    assert data["status"] == "finished" and data["counts"] == {"finished": nproc}
    assert [r["rank"] for r in data["ranks"]] == list(range(nproc))
    assert all(
        r["median_step_ms"] is not None and r["summary"]["steps"] == 20 for r in data["ranks"]
    )
    text = node.ctl("insights", str(node.db), "--group", group)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"group {group}: finished")
    assert all(f"rank {r}  run " in text.stdout for r in range(nproc))

    # per-rank runs stay queryable on their own; an unknown group is an error
    one = node.ctl("insights", str(node.db), str(rows[1]["id"]), "--format", "json")
    assert one.returncode == 0 and json.loads(one.stdout)["run_id"] == rows[1]["id"]
    missing = node.ctl("runs", str(node.db), "--group", "nope")
    assert missing.returncode != 0 and "no runs in group 'nope'" in missing.stderr


def test_a_killed_rank_is_lost_and_the_others_finish(node: Node, tmp_path: Path):
    flags = tmp_path / "flags"
    flags.mkdir()
    out = _torchrun(node, 2, {"KILL_RANK": "1", "FLAG_DIR": str(flags)})
    assert out.returncode != 0  # torchrun reports the killed worker
    group = node.only_group()
    data = wait_for(lambda: node.group_json(group), 20, "the group to end")
    assert data["status"] == "lost"
    assert data["counts"] == {"lost": 1, "finished": 1}
    assert {r["rank"]: r["status"] for r in data["ranks"]} == {0: "finished", 1: "lost"}
    assert ping(node.socket_dir) is not None  # the daemon stays up
    assert os.path.exists(node.db)


def test_group_option_overrides_torchrun_and_a_plain_run_has_no_group(node: Node):
    code = (
        "import gpuprof\n"
        "with gpuprof.profile('solo', print_summary=False, group='team-a'):\n    pass\n"
    )
    assert node.run_script(code).returncode == 0
    plain = "import gpuprof\nwith gpuprof.profile('plain', print_summary=False):\n    pass\n"
    env_free = node.run_script(plain)
    assert env_free.returncode == 0, env_free.stderr
    rows = node.query("SELECT run_name, group_id FROM runs ORDER BY id")
    assert [tuple(r) for r in rows] == [("solo", "team-a"), ("plain", None)]
