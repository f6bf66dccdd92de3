"""A DDP job on the CPU (gloo) where one rank's backward is slower: gpuprof
names that rank.

    torchrun --standalone --nproc-per-node=2 examples/ddp_straggler.py --slow-rank 1
    gpuprofctl insights --group "$(gpuprofctl runs --format json | python -c \
        'import json,sys; print(json.load(sys.stdin)[0]["group"])')"

Rank 0 prints its summary at exit, with the group's findings so far; the
group report (every rank's figures and findings) is ``gpuprofctl insights
--group NAME``. Without ``--slow-rank`` the ranks are balanced and no group
rule fires. The "device time" of each step is a sleep (the CPU idles, as it
does while a GPU computes), so the example behaves alike on 2 or 16 cores.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

import gpuprof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow-rank", type=int, default=-1, help="this rank's backward is slower")
    ap.add_argument("--delay-ms", type=float, default=30.0, help="how much slower, ms per step")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    layers = [nn.Linear(128, 128) for _ in range(8)]
    net = nn.Sequential(*[m for layer in layers for m in (layer, nn.ReLU())])
    # device time, as sleeps: 10 ms of forward, 20 ms of backward
    net[0].register_forward_pre_hook(lambda module, inputs: time.sleep(0.010))
    net[8].register_full_backward_pre_hook(lambda module, grad: time.sleep(0.020))
    if rank == args.slow_rank:  # e.g. a throttled GPU: this rank's backward is slower
        net[-1].register_full_backward_pre_hook(
            lambda module, grad: time.sleep(args.delay_ms / 1e3)
        )
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with gpuprof.profile("ddp-straggler"):
        for _ in range(args.steps):
            loss = model(torch.randn(32, 128)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
