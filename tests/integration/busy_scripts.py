"""Training scripts for the busy-host tests (real torch loops on CPU)."""

# Busy processes started through a launcher that exits at once: orphaned,
# they are not the training process's descendants, so gpuprof counts them as
# other processes (as a neighbour's job would be), not as the run's own CPU.
# Each spins for 5 minutes at most: a script killed before it stops them
# leaves nothing running for long.
HOGS = r"""
import os, signal, subprocess, sys

_LAUNCH = (
    "import subprocess, sys\n"
    "spin = 'import time\\nend = time.monotonic() + 300\\nwhile time.monotonic() < end: pass'\n"
    "ps = [subprocess.Popen([sys.executable, '-c', spin], "
    "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
    "stderr=subprocess.DEVNULL) for _ in range(int(sys.argv[1]))]\n"
    "print(' '.join(str(p.pid) for p in ps))\n"
)


def start_hogs(per_core):
    n = per_core * (os.cpu_count() or 1)
    if not n:
        return []
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCH, str(n)], capture_output=True, text=True, timeout=60
    )
    return [int(p) for p in out.stdout.split()]


def stop_hogs(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
"""

# argv: run name, "cpu" (each sample costs 4 ms of CPU time) or "sleep" (4 ms
# asleep: I/O-like), seconds of steps per run (from the first batch), runs
# (one profile() after another, named NAME-0, NAME-1, ... when more than one),
# and busy processes per core
# to start as a competing load once torch is imported (killed at the end)
LOADER = (
    HOGS
    + r"""
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
import gpuprof

NAME, MODE, SECONDS, RUNS = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
PER_CORE = int(sys.argv[5]) if len(sys.argv) > 5 else 0

class Source(Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i):
        if MODE == "cpu":  # CPU time, not wall time: a starved worker takes longer
            t = time.process_time()
            while time.process_time() - t < 0.004:
                pass
        else:
            time.sleep(0.004)
        return torch.full((16,), float(i % 5)), i % 3

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
hogs = start_hogs(PER_CORE)
try:
    for run in range(RUNS):
        loader = DataLoader(Source(), batch_size=8, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork")
        with gpuprof.profile(f"{NAME}-{run}" if RUNS > 1 else NAME):
            t_end = None  # SECONDS of steps from the first batch (workers start slowly)
            for x, y in loader:
                t_end = t_end or time.monotonic() + SECONDS
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if time.monotonic() >= t_end:
                    break
        del loader
finally:
    stop_hogs(hogs)
print("TRAINED", RUNS)
"""
)

# A CPU-bound loop (in-memory batches) that starts a competing load itself,
# 3 busy processes per core, for 3 bursts of BURST_S seconds, and prints the
# steps each burst spanned and when: "BURST first last t0_ns t1_ns" (monotonic
# ns, the clock gpuprof's samples use). argv: run name.
BURSTS = (
    HOGS
    + r"""
import sys, time
import torch
from torch import nn
import gpuprof

NAME = sys.argv[1]
QUIET_S, BURST_S = 1.5, 1.2
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
hogs, bursts, step = [], [], 0
plan = [("quiet", QUIET_S), ("burst", BURST_S)] * 3 + [("quiet", QUIET_S)]
try:
    with gpuprof.profile(NAME):
        for kind, seconds in plan:
            if kind == "burst":
                hogs = start_hogs(3)
            first, t0_ns, t_end = step, time.monotonic_ns(), time.monotonic() + seconds
            while time.monotonic() < t_end:
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                step += 1
            if kind == "burst":
                stop_hogs(hogs)
                hogs = []
                bursts.append((first, step - 1, t0_ns, time.monotonic_ns()))
finally:
    stop_hogs(hogs)
for first, last, t0_ns, t1_ns in bursts:
    print("BURST", first, last, t0_ns, t1_ns)
print("TRAINED", step)
"""
)

# Steps that sleep 30 ms (+ a small model), and 80 ms every 20th step:
# periodic work of 50 ms that no CPU load can move (a busy host's wake-up
# delays are short beside 30 ms). argv: run name, steps.
EVERY_20 = r"""
import sys, time
import torch
from torch import nn
import gpuprof

NAME, STEPS = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
with gpuprof.profile(NAME):
    for step in range(STEPS):
        loss = model(x).sum()
        time.sleep(0.08 if step % 20 == 0 and step else 0.03)  # checkpointing every 20th
        loss.backward()
        opt.step()
        opt.zero_grad()
print("TRAINED", STEPS)
"""
