"""DataLoader workers end to end: a real torch training loop with a real
multi-process DataLoader, an auto-started gpuprofd sampling its workers'
CPU (real psutil), the worker_cpu rows, and the worker_imbalance verdict."""

from __future__ import annotations

import asyncio
import json

from gpuprof.insights import RunContext, run_rules
from gpuprofd.storage import reads
from gpuprofd.storage.reader import open_reader

from .conftest import Node

# argv: run name, "skew" (only worker 0 decodes) or "even", epochs,
# "persistent" or "respawn" (new worker processes each epoch)
WORKERS = r'''
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info
import gpuprof

NAME, SKEW, EPOCHS = sys.argv[1], sys.argv[2] == "skew", int(sys.argv[3])
PERSISTENT = sys.argv[4] == "persistent"
# CPU seconds per costly sample: 40 × 0.05 = 2 s for worker 0 / 120 × 0.007 = 0.84 s in
# all, each epoch (CPU time, not wall time: 3 workers share 2 cores here)
SPIN_S = 0.05 if SKEW else 0.007

class Decode(Dataset):
    """A CPU-heavy decode: for every sample, or (skew) only in worker 0."""
    def __len__(self): return 120
    def __getitem__(self, i):
        if not SKEW or get_worker_info().id == 0:
            t = time.process_time()
            while time.process_time() - t < SPIN_S:
                pass
        return torch.full((16,), float(i % 5)), i % 3

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Decode(), batch_size=4, num_workers=3, multiprocessing_context="fork",
                    persistent_workers=PERSISTENT)
with gpuprof.profile(NAME):
    for epoch in range(EPOCHS):
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
print("TRAINED", EPOCHS)
'''


def _worker_rows(node: Node) -> list[dict]:
    rows = node.query("SELECT * FROM worker_cpu ORDER BY loader_seq, worker_id")
    return [dict(r) for r in rows]


def _offline_rules(node: Node) -> dict[str, dict]:
    """The rules on the context gpuprofctl rebuilds from the database."""

    async def read() -> RunContext:
        async with open_reader(node.db) as reader:
            return await reads.run_context(reader, await reads.get_run(reader, None))

    ctx = asyncio.run(read())
    return {i.rule: i.to_dict() for i in run_rules(ctx)}


def test_one_busy_worker_is_imbalance_and_each_epochs_workers_are_a_pool(node: Node):
    out = node.run_script(WORKERS, "skewed", "skew", "2", "respawn")
    assert out.returncode == 0, out.stderr
    assert "TRAINED 2" in out.stdout
    assert "DataLoader worker 0 did" in out.stdout, out.stdout  # in the summary at exit

    rows = _worker_rows(node)
    (run,) = node.query("SELECT id, start_mono_ns, end_mono_ns FROM runs")
    assert [(r["loader_seq"], r["worker_id"]) for r in rows] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert len({r["pid"] for r in rows}) == 6  # epoch 2 ran new worker processes
    for seq in (0, 1):
        hot, *cold = (r["cpu_s"] for r in rows if r["loader_seq"] == seq)
        assert hot > 1.0  # ~2 s of decoding; its last host tick (0.5 s) may be unseen
        assert all(c < hot / 10 for c in cold)
    for r in rows:
        assert r["run_id"] == run["id"]
        assert run["start_mono_ns"] < r["first_mono_ns"] <= r["last_mono_ns"] < run["end_mono_ns"]
    assert rows[0]["last_mono_ns"] < rows[3]["first_mono_ns"]  # epoch 1's pool was gone

    (stored,) = node.query("SELECT * FROM insights WHERE rule = 'worker_imbalance'")
    evidence = json.loads(stored["evidence"])
    assert evidence["worker_id"] == 0 and evidence["workers"] == 3
    assert (evidence["pools_imbalanced"], evidence["pools_judged"]) == (2, 2)
    assert evidence["fair_share_ratio"] > 2.5
    assert _offline_rules(node)["worker_imbalance"]["evidence"]["pools_judged"] == 2


def test_evenly_loaded_persistent_workers_are_one_pool_and_not_imbalanced(node: Node):
    out = node.run_script(WORKERS, "even", "even", "2", "persistent")
    assert out.returncode == 0, out.stderr
    assert "DataLoader worker" not in out.stdout

    rows = _worker_rows(node)
    assert [(r["loader_seq"], r["worker_id"]) for r in rows] == [(0, 0), (0, 1), (0, 2)]
    total = sum(r["cpu_s"] for r in rows)
    assert total > 1.2  # ~1.7 s: enough work to judge, so the rule looked and found it even
    assert all(r["cpu_s"] < 0.6 * total for r in rows)
    assert node.query("SELECT * FROM insights WHERE rule = 'worker_imbalance'") == []
    assert "worker_imbalance" not in _offline_rules(node)
