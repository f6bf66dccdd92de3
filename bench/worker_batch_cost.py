"""What one batch costs to come through a DataLoader worker process.

gpuprof's loader findings advise worker processes (``num_workers > 0``) for a
loop that waits on ``num_workers=0`` loading; that only pays when the wait per
batch is above what handing a batch over from a worker costs (pickling it,
a queue, the main process unpickling it, shared-memory tensors). This times
``next()`` on a loader over an in-memory ``TensorDataset`` (nothing to load:
the per-batch time is the indexing, collate and hand-off) with
``num_workers=0`` and with 2 workers, at a few batch shapes, and prints the
mean ms per batch of each and the difference: the hand-off's cost
(:data:`gpuprof.insights.loading.WORKER_BATCH_COST_MS` is taken from it);
and, for the fix gpuprof gives such loops instead, ``num_workers=0``
fetching a batch with one indexing call (a ``BatchSampler`` as the sampler,
``batch_size=None``).

    python bench/worker_batch_cost.py [--batches 2000]

A benchmark, not a test: numbers depend on this machine's load.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

#: (rows, features, batch size): the new user's loop (32 floats a sample,
#: 32 a batch) and larger batches of the same kind.
SHAPES = ((2048, 32, 32), (8192, 32, 256), (4096, 784, 64))


def per_batch_ms(loader: DataLoader, batches: int) -> float:
    """Mean ms of one ``next()`` on *loader* over *batches* batches (the
    iterator's start-up and its first 10 batches left out)."""
    done = 0
    total = 0.0
    while done < batches:
        it = iter(loader)
        for _ in range(10):  # workers starting, queue filling
            next(it)
        while done < batches:
            t = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            total += time.perf_counter() - t
            done += 1
    return total / done * 1000.0


def main() -> None:
    """Print ms per batch in-process and through 2 workers, per shape."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    print(
        "rows x features, batch | in-process ms | 2 workers ms | hand-off ms | batch-at-a-time ms"
    )
    for rows, feats, bs in SHAPES:
        ds = TensorDataset(torch.randn(rows, feats))
        inproc = per_batch_ms(DataLoader(ds, batch_size=bs), args.batches)
        workers = per_batch_ms(
            DataLoader(ds, batch_size=bs, num_workers=2, persistent_workers=True), args.batches
        )
        whole = per_batch_ms(
            DataLoader(ds, batch_size=None, sampler=BatchSampler(SequentialSampler(ds), bs, False)),
            args.batches,
        )
        print(
            f"{rows} x {feats}, {bs} | {inproc:.3f} | {workers:.3f} | {workers - inproc:.3f}"
            f" | {whole:.3f}"
        )


if __name__ == "__main__":
    main()
