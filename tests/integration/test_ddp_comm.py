"""torchrun (2 ranks, gloo, CPU) under ``gpuprof.profile``: the shim times
each DDP gradient bucket's all-reduce and each synced step's breakdown, as
the daemon stores it, gains a ``comm`` phase (exposed comm, out of
``backward``); micro-batches under ``no_sync()`` add none."""

from __future__ import annotations

import json

from tests.integration.conftest import Node

#: A tiny DDP model, 8 steps of 2 micro-batches (the first under no_sync),
#: then 4 plain steps; each rank writes its final parameters' checksum.
DDP = r"""
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
import gpuprof

torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)), bucket_cap_mb=0.005)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
with gpuprof.profile("ddp-comm", print_summary=False) as prof:
    for step in range(12):
        if step < 8:
            with model.no_sync():
                model(torch.randn(16, 32, generator=g)).square().mean().backward()
        model(torch.randn(16, 32, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()
with torch.no_grad():
    total = float(sum(p.double().sum() for p in model.parameters()))
Path(f"checksum-{rank}").write_text(repr(total))
dist.destroy_process_group()
"""


def test_synced_steps_carry_exposed_comm(node: Node):
    out = node.torchrun(DDP, 2, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    sums = {(node.workdir / f"checksum-{r}").read_text() for r in (0, 1)}
    assert len(sums) == 1  # the ranks' parameters agree: gradients were all-reduced
    runs = node.query("SELECT id, rank FROM runs ORDER BY rank")
    assert [r["rank"] for r in runs] == [0, 1]
    for run in runs:
        rows = node.query(
            "SELECT step, micro, phases FROM steps WHERE run_id = ? ORDER BY step", run["id"]
        )
        assert [r["micro"] for r in rows] == [2] * 8 + [1] * 4
        for r in rows:
            phases = json.loads(r["phases"])
            assert phases.get("comm", 0) > 0, (run["rank"], r["step"], phases)
            assert "backward" in phases
