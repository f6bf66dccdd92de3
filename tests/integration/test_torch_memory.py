"""torch's CUDA allocator figures end to end: a real training script (CPU
torch, with only the missing GPU mocked inside it) → the shim → an
auto-started gpuprofd → stored steps, the printed summary, ``gpuprofctl runs``."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import Node

GIB = 2**30

#: Mocks torch.cuda as a device whose allocator grows by 1 GiB per read (read
#: k: allocated k+1, reserved k+3, peak k+2 GiB); every step is its own burst,
#: so step k carries read k.
MOCKED_CUDA = r"""
import torch
from torch import nn
import gpuprof
from gpuprof_shim import batcher

GIB = 2**30
reads = []

def nested(device=None):
    k = len(reads)
    reads.append(device)
    return {"allocated_bytes": {"all": {"current": (k + 1) * GIB, "peak": (k + 2) * GIB}},
            "reserved_bytes": {"all": {"current": (k + 3) * GIB}}}

torch.cuda.is_initialized = lambda: True
torch.cuda.current_device = lambda: 0
torch.cuda.memory_stats_as_nested_dict = nested
batcher.SEND_EVERY_STEPS = 1

torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with gpuprof.profile("torch-mem"):
    for _ in range(6):
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
print("READS", len(reads), set(reads))
"""

PLAIN_CPU = r"""
import torch
from torch import nn
import gpuprof

model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with gpuprof.profile("cpu-only"):
    for _ in range(4):
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
"""


def test_allocator_figures_land_in_stored_steps_summary_and_runs(node: Node):
    out = node.run_script(MOCKED_CUDA)
    assert out.returncode == 0, out.stderr
    assert "READS 6 {0}" in out.stdout
    rows = node.query(
        "SELECT step, mem_allocated_bytes, mem_reserved_bytes, mem_peak_bytes FROM steps "
        "ORDER BY step"
    )
    assert [tuple(r) for r in rows] == [
        (k, (k + 1) * GIB, (k + 3) * GIB, (k + 2) * GIB) for k in range(6)
    ]
    # peak allocated: read 5's 7 GiB = 7.52 GB; reserved 8 GiB = 8.59 GB; no NVML here
    line = "  GPU memory at peak: torch allocated 7.52 GB, reserved 8.59 GB"
    assert line in out.stdout.splitlines(), out.stdout
    (run,) = node.query("SELECT summary FROM runs")
    assert json.loads(run["summary"])["memory"] == {
        "torch_peak_allocated_bytes": 7 * GIB,
        "torch_peak_reserved_bytes": 8 * GIB,
    }
    ctl = subprocess.run(
        [sys.executable, "-m", "gpuprofd.ctl", "runs", str(node.db), "--format", "json"],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ctl.returncode == 0, ctl.stderr
    (listed,) = json.loads(ctl.stdout)
    assert (listed["torch_peak_allocated_bytes"], listed["torch_peak_reserved_bytes"]) == (
        7 * GIB,
        8 * GIB,
    )


def test_plain_cpu_run_stores_no_memory_figures(node: Node):
    out = node.run_script(PLAIN_CPU)
    assert out.returncode == 0, out.stderr
    rows = node.query("SELECT mem_allocated_bytes, mem_reserved_bytes, mem_peak_bytes FROM steps")
    assert len(rows) == 4 and all(tuple(r) == (None, None, None) for r in rows)
    assert "GPU memory at peak" not in out.stdout
