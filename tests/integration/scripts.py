"""Training scripts the integration tests run in subprocesses (real torch, CPU)."""

TRAIN = r"""
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
import gpuprof

STEPS = int(sys.argv[1]); ACCUM = int(sys.argv[2]); LOADER_SLEEP_S = float(sys.argv[3])
NAME = sys.argv[4] if len(sys.argv) > 4 else "it-run"
HIDDEN = int(sys.argv[5]) if len(sys.argv) > 5 else 64

class Slow(Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i):
        return torch.full((32,), float(i % 7)), i % 4

def collate(items):
    time.sleep(LOADER_SLEEP_S)  # a slow input pipeline
    xs, ys = zip(*items)
    return torch.stack(xs), torch.tensor(ys)

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                      nn.Linear(HIDDEN, 4))
loss_fn = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Slow(), batch_size=16, collate_fn=collate)
with gpuprof.profile(NAME):
    it = iter(loader)
    for step in range(STEPS):
        for micro in range(ACCUM):
            x, y = next(it)
            loss = loss_fn(model(x), y) / ACCUM
            loss.backward()
        opt.step()
        opt.zero_grad()
print("TRAINED", STEPS)
"""

RAISES = r"""
import torch
from torch import nn
import gpuprof

orig_call = nn.Module.__call__
orig_backward = torch.Tensor.backward
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
boom = RuntimeError("boom at step 3")
try:
    with gpuprof.profile("raises"):
        for step in range(10):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            if step == 3:
                raise boom
except RuntimeError as exc:
    assert exc is boom, "exception was replaced"
    assert nn.Module.__call__ is orig_call, "Module.__call__ still patched"
    assert torch.Tensor.backward is orig_backward, "Tensor.backward still patched"
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks
    print("PROPAGATED", exc)
"""

# Pauses at step PAUSE_AT until the file GO exists, so the test can kill the daemon.
KILL_MID_RUN = r"""
import os, sys, time
import torch
from torch import nn
import gpuprof

STEPS, PAUSE_AT, READY, GO = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
times = []
with gpuprof.profile("killed"):
    for step in range(STEPS):
        if step == PAUSE_AT:
            open(READY, "w").close()
            while not os.path.exists(GO):
                time.sleep(0.01)
        t = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
before = sorted(times[5:PAUSE_AT])[len(times[5:PAUSE_AT]) // 2]
after = sorted(times[PAUSE_AT + 5:])[len(times[PAUSE_AT + 5:]) // 2]
print(f"MEDIAN_BEFORE_MS {before * 1e3:.4f}")
print(f"MEDIAN_AFTER_MS {after * 1e3:.4f}")
"""

#: argv: steps, the step to pause at (the test kills gpuprofd there), the
#: ready and go files, and a file made when the loop is done (the profile
#: exits next); the loop's steps are numbered 0..STEPS-1.
SURVIVE = r"""
import os, sys, time
import torch
from torch import nn
import gpuprof

STEPS, PAUSE_AT, READY, GO, DONE = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6]
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 32)
with gpuprof.profile("survive"):
    for step in range(STEPS):
        if step == PAUSE_AT:
            open(READY, "w").close()
            while not os.path.exists(GO):
                time.sleep(0.01)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    open(DONE, "w").close()
print("TRAINED", STEPS)
"""

GAN_AMP_EVAL = r"""
import torch
from torch import nn
import gpuprof

torch.manual_seed(0)
torch.set_num_threads(1)
gen = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
disc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt_d = torch.optim.SGD(disc.parameters(), lr=1e-2)
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
bce = nn.BCEWithLogitsLoss()
with gpuprof.profile("gan-amp"):
    for epoch in range(2):
        for it in range(5):
            real, z = torch.randn(32, 16), torch.randn(32, 8)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                fake = gen(z)
                d_loss = bce(disc(real).float(), torch.ones(32, 1)) + bce(
                    disc(fake.detach()).float(), torch.zeros(32, 1))
            if epoch == 0 and it == 2:
                d_loss = d_loss * float("inf")  # inf grads: the scaler skips this update
            opt_d.zero_grad()
            scaler.scale(d_loss).backward()
            scaler.step(opt_d)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                g_loss = bce(disc(fake).float(), torch.ones(32, 1))
            opt_g.zero_grad()
            scaler.scale(g_loss).backward()
            scaler.step(opt_g)
            scaler.update()
        with torch.no_grad():  # validation after each epoch
            for _ in range(30):
                disc(gen(torch.randn(256, 8)))
print("TRAINED")
"""

#: A DataLoader-fed loop that sleeps SLEEP_S every EVERY steps after its
#: update (the line marked ``# BETWEEN``): host work between the steps.
BETWEEN_STEPS = r"""
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
import gpuprof

STEPS, EVERY, SLEEP_S = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

class Data(Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i):
        return torch.full((32,), float(i % 7)), i % 4

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
loss_fn = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Data(), batch_size=16, num_workers=0)
with gpuprof.profile("between-steps"):
    for step, (x, y) in enumerate(loader):
        if step == STEPS:
            break
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if step % EVERY == EVERY - 1:
            time.sleep(SLEEP_S)  # BETWEEN
print("TRAINED", STEPS)
"""
