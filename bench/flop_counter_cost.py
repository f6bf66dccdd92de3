"""What counting one step with ``torch.utils.flop_counter.FlopCounterMode``
costs (the shim's automatic FLOPs, ``gpuprof_shim.flops``).

Trains a GPT (pre-norm blocks, hand-written causal attention, untied LM
head: ``tests/shim/tiny_gpt.py``) with AdamW on the CPU and times, per
model size, the median plain step and the median step run under
FlopCounterMode (a fresh mode per step, as the shim enters one); then the
same inside ``gpuprof.profile(count_flops=True)`` against a real
auto-started gpuprofd: the counted step (``traced``) against the others.
Also checks the counter against :class:`gpuprof.TransformerArch`.

    python bench/flop_counter_cost.py [--steps 9]

Prints the figures; not a test (these machines are noisy).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpuprof  # noqa: E402
from tests.shim.tiny_gpt import TinyGPT, train_step  # noqa: E402

#: (layers, d_model, heads, seq_len, vocab, batch): a toy, then a CPU-sized GPT.
SIZES = [(2, 64, 4, 32, 128, 4), (4, 256, 8, 128, 2048, 8)]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=9)
    args = ap.parse_args()
    torch.manual_seed(0)
    # one thread: on a loaded 2-vCPU box OpenMP's spinning threads make
    # every op wait for a core, and the ratios mean nothing
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread")
    for layers, d, heads, seq, vocab, batch in SIZES:
        model = TinyGPT(layers, d, heads, vocab, seq)
        opt = torch.optim.AdamW(model.parameters())

        def step(model=model, opt=opt, batch=batch, seq=seq, vocab=vocab) -> None:
            train_step(model, opt, batch, seq, vocab)

        for _ in range(3):
            step()
        plain, counted, total = [], [], 0
        for _ in range(args.steps):
            plain.append(timed(step))
            mode = FlopCounterMode(display=False)

            def under(mode=mode) -> None:
                with mode:
                    step()

            counted.append(timed(under))
            total = mode.get_total_flops()
        arch = gpuprof.TransformerArch(
            layers=layers, d_model=d, heads=heads, seq_len=seq, vocab=vocab
        )
        analytic = arch.flops_per_step(batch * seq)
        p, c = statistics.median(plain), statistics.median(counted)
        lo, lo_c = min(plain), min(counted)
        print(
            f"L={layers} d={d} T={seq} V={vocab} B={batch}: step median {p:.1f} ms (min "
            f"{lo:.1f}), counted {c:.1f} ms (min {lo_c:.1f}): x{c / p:.2f} by medians, "
            f"x{lo_c / lo:.2f} by minima; counter {total:.4g} FLOP, "
            f"TransformerArch {analytic:.4g} ({analytic / total - 1:+.2%})"
        )

    layers, d, heads, seq, vocab, batch = SIZES[1]
    with tempfile.TemporaryDirectory() as tmp:
        model = TinyGPT(layers, d, heads, vocab, seq)
        opt = torch.optim.AdamW(model.parameters())
        with gpuprof.profile(
            "flop-cost",
            count_flops=True,
            db=Path(tmp) / "g.db",
            socket_dir=Path(tmp) / "s",
            print_summary=False,
        ) as prof:
            for _ in range(args.steps):
                train_step(model, opt, batch, seq, vocab)
        counter = prof._flop_counter
        done = counter is not None and counter.flops is not None
        print(
            f"in profile(count_flops=True): step {counter.step} counted, {counter.flops:.4g} FLOP"
            if counter is not None and done
            else "in profile(count_flops=True): not counted"
        )
        conn = sqlite3.connect(Path(tmp) / "g.db")
        sql = "SELECT step, t1_ns - t0_ns, traced FROM steps ORDER BY step"
        rows = conn.execute(sql).fetchall()
        others = [ns / 1e6 for i, ns, tr in rows if not tr and i >= 2]
        traced = [round(ns / 1e6, 1) for i, ns, tr in rows if tr]
        print(
            f"  steps (ms, from 2): median untraced {statistics.median(others):.1f}, "
            f"traced {traced}"
        )
        conn.close()


if __name__ == "__main__":
    main()
