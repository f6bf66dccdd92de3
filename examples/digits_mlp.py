"""Train a small MLP on scikit-learn's bundled digits under gpuprof.

    python examples/digits_mlp.py               # CPU-heavy augmentation: the loader stalls
    python examples/digits_mlp.py --no-augment  # the fix: no stall finding

The augmentation is deliberately expensive Python work in ``Dataset.__getitem__``
(a random elastic warp, computed pixel by pixel), the classic way a loader
starves a model. The data set ships inside scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import math
import random

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gpuprof


class Digits(Dataset):
    """1,797 8×8 grey-scale digits (scikit-learn's copy of the UCI set), as
    (64-float tensor in [0, 1], class index)."""

    def __init__(self, augment: bool, warp_passes: int = 4) -> None:
        data = load_digits()
        self.images = (data.images / 16.0).astype(np.float32)
        self.labels = data.target.astype(np.int64)
        self.augment = augment
        self.warp_passes = warp_passes

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.images[i]
        if self.augment:
            img = elastic_warp(img, random.Random(i * 7919 + random.random()), self.warp_passes)
        return torch.from_numpy(img.reshape(-1).copy()), int(self.labels[i])


def elastic_warp(img: np.ndarray, rng: random.Random, passes: int) -> np.ndarray:
    """A small random displacement field applied *passes* times, bilinear,
    in pure Python: about 0.16 ms of CPU per pass per 8×8 image on this
    project's 2-core CI machine (measured 2026-11-29)."""
    h, w = img.shape
    out = img
    for _ in range(passes):
        src = out
        out = np.empty_like(src)
        ax, ay, phase = rng.uniform(-0.4, 0.4), rng.uniform(-0.4, 0.4), rng.uniform(0, 6.3)
        for y in range(h):
            for x in range(w):
                sx = min(max(x + ax * math.sin(y * 0.8 + phase), 0.0), w - 1.001)
                sy = min(max(y + ay * math.cos(x * 0.8 + phase), 0.0), h - 1.001)
                x0, y0 = int(sx), int(sy)
                fx, fy = sx - x0, sy - y0
                top = src[y0, x0] * (1 - fx) + src[y0, x0 + 1] * fx
                bottom = src[y0 + 1, x0] * (1 - fx) + src[y0 + 1, x0 + 1] * fx
                out[y, x] = top * (1 - fy) + bottom * fy
    return out


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 768),
        nn.ReLU(),
        nn.Linear(768, 768),
        nn.ReLU(),
        nn.Linear(768, 768),
        nn.ReLU(),
        nn.Linear(768, 10),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-augment",
        action="store_true",
        help="drop the CPU-heavy augmentation (the loader-stall fix); "
        "the loader then runs in-process (num_workers=0)",
    )
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    parser.add_argument("--run-name", default="digits-mlp")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)  # leave the other core to the loader, as on a busy node
    dataset = Digits(augment=not args.no_augment)
    workers = args.workers if not args.no_augment else 0
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    model = build_model()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    steps = 0
    with gpuprof.profile(args.run_name):
        while steps < args.steps:
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                steps += 1
                if steps >= args.steps:
                    break
    with torch.no_grad():
        x = torch.from_numpy(dataset.images.reshape(len(dataset), -1))
        acc = (model(x).argmax(1).numpy() == dataset.labels).mean()
    print(f"trained {steps} steps; train accuracy {acc:.1%}")


if __name__ == "__main__":
    main()
