"""The DataLoader workers' stacks end to end: a real torch loop with a real
multi-process DataLoader and a real gpuprofd. A CPU-bound dataset's finding
names its hot function; a sleeping one is not called CPU-bound and its
finding names the blocking call."""

from __future__ import annotations

import json

from .conftest import Node

# argv: run name, "cpu" (each sample computes) or "sleep" (each sample waits),
# then num_workers (2 unless given)
LOADER = r"""
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
import gpuprof

NAME, CPU = sys.argv[1], sys.argv[2] == "cpu"
WORKERS = int(sys.argv[3]) if len(sys.argv) > 3 else 2

def augment(i):
    t = time.process_time()
    x = 0
    while time.process_time() - t < 0.02:  # 20 ms of CPU per sample
        x += i
    return x

class Images(Dataset):
    def __len__(self): return 240
    def __getitem__(self, i):
        if CPU:
            augment(i)
        else:
            time.sleep(0.02)
        return torch.full((16,), float(i % 5)), i % 3

torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ctx = "fork" if WORKERS else None
loader = DataLoader(Images(), batch_size=4, num_workers=WORKERS, multiprocessing_context=ctx)
with gpuprof.profile(NAME):
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
print("TRAINED")
"""


def _line(text: str) -> int:
    return next(n for n, t in enumerate(LOADER.splitlines(), 1) if text in t)


def _findings(node: Node) -> dict[str, dict]:
    rows = node.query("SELECT rule, title, detail, fix, evidence FROM insights")
    return {r["rule"]: {**dict(r), "evidence": json.loads(r["evidence"])} for r in rows}


def test_a_cpu_bound_loader_names_its_hot_function(node: Node):
    out = node.run_script(LOADER, "cpu", "cpu")
    assert out.returncode == 0, out.stderr
    found = _findings(node)
    assert "cpu_bound_dataloader" in found, found
    ins = found["cpu_bound_dataloader"]
    # the spin is augment's own loop (its lines), called from __getitem__
    hot = ins["evidence"]["loader_frames"][0]
    loop = {_line("while time.process_time()"), _line("x += i")}
    assert hot["function"] == "augment" and hot["line"] in loop, ins
    assert hot["share"] > 0.5, ins
    assert "The workers spend" in ins["detail"] and "(augment)" in ins["detail"], ins


def test_a_sleeping_loader_is_not_cpu_bound_and_names_the_blocking_call(node: Node):
    out = node.run_script(LOADER, "sleep", "sleep")
    assert out.returncode == 0, out.stderr
    found = _findings(node)
    assert "cpu_bound_dataloader" not in found, found
    ins = found["dataloader_stall"]
    assert "sat idle" in ins["detail"], ins
    hot = ins["evidence"]["loader_frames"][0]
    assert (hot["function"], hot["line"], hot["call"]) == (
        "__getitem__",
        _line("time.sleep(0.02)"),
        "time.sleep",
    ), ins
    assert "of their time in time.sleep, called from train_" in ins["detail"], ins
    # waiting workers, the disk quiet: more of them keep more waits in flight
    assert "more workers, each waiting on its own batch" in ins["detail"], ins
    assert ins["fix"].startswith("Keep more batches in flight: raise num_workers from 2"), ins
    assert "Or make time.sleep from train_" in ins["fix"], ins


def test_a_sleeping_in_process_loader_waits_and_is_not_cpu_bound(node: Node):
    # num_workers=0: the training thread sleeps in __getitem__ (80 ms per batch)
    out = node.run_script(LOADER, "sleep0", "sleep", "0")
    assert out.returncode == 0, out.stderr
    found = _findings(node)
    assert "cpu_bound_dataloader" not in found, found
    ins = found["dataloader_stall"]
    assert ins["evidence"]["loader_busy"] is False, ins
    assert "burned no CPU" in ins["detail"], ins
    assert "time.sleep, called from train_" in ins["detail"], ins
    assert "load in worker processes (num_workers=" in ins["fix"], ins
