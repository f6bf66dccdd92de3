"""Loop shapes end to end: real training script → auto-started gpuprofd →
stored steps, summary and ``gpuprofctl runs``."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from .conftest import Node
from .scripts import GAN_AMP_EVAL


def test_gan_with_grad_scaler_skip_and_eval_loops(node: Node):
    out = node.run_script(GAN_AMP_EVAL)
    assert out.returncode == 0, out.stderr
    assert "TRAINED" in out.stdout
    # 2 epochs x 5 iterations, each with a discriminator and a generator update: 10 steps
    assert "gpuprof · gan-amp  (10 steps" in out.stdout, out.stdout
    assert "  1 skipped updates (inf/NaN gradients);" in out.stdout
    assert re.search(r"; \d+(?: ms|\.\d s) in evaluation, outside steps", out.stdout)
    # one discriminator update skipped: 9 of 10 made; every generator update made
    assert "  Optimizers: SGD#0 9 updates, " in out.stdout
    assert "; Adam#1 10 updates, " in out.stdout
    steps = node.query("SELECT micro, skipped, eval_ns, optimizers FROM steps ORDER BY step")
    assert [s["micro"] for s in steps] == [1] * 10
    assert [s["skipped"] for s in steps] == [0, 0, 1] + [0] * 7
    # epoch 0's validation sits before step 5; epoch 1's after the last step
    assert [s["eval_ns"] > 0 for s in steps] == [False] * 5 + [True] + [False] * 4
    (run,) = node.query("SELECT trailing_eval_ns FROM runs")
    assert run["trailing_eval_ns"] > 0
    optimizers = [json.loads(s["optimizers"]) for s in steps]
    assert [[o["name"] for o in opts] for opts in optimizers] == [["SGD#0", "Adam#1"]] * 10
    assert [opts[0]["skipped"] for opts in optimizers] == [0, 0, 1] + [0] * 7
    assert all(opts[1]["updates"] == 1 for opts in optimizers)

    ctl = subprocess.run(
        [sys.executable, "-m", "gpuprofd.ctl", "runs", str(node.db), "--format", "json"],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ctl.returncode == 0, ctl.stderr
    (row,) = json.loads(ctl.stdout)
    assert (row["steps"], row["skipped_updates"]) == (10, 1)
    assert row["eval_s"] > 0
