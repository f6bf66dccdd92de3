"""How right are the findings' gains? Each pair trains a real CPU loop
twice under gpuprof: with a pathology, then with the fix its finding
prescribes, one run each. It prints, per pair, the speed-up the
pathology's finding predicted (``gain_speedup_max``) against the one the fix
gave (the first run's mean steady iteration over the second's, as gpuprof
measured them) and the error. The prediction must come within 25 % of what
was measured (``--tolerance``).

    python bench/gain_accuracy.py [--pairs demo cpu_workers ...] [--steps 200]

The pairs:

* ``demo``: the README's demo, ``examples/digits_mlp.py`` (two workers
  running a CPU-heavy augmentation) then ``--no-augment``;
* ``cpu_workers``: two workers pegging the host with a CPU-heavy
  augmentation → the augmentation made cheap (the finding: "the workers are
  CPU-bound": cheaper loading);
* ``threads_workers``: the same, with torch's default intra-op threads (one
  per core) as a user's loop has them: the workers take the cores the step's
  threads compute on;
* ``more_workers``: one CPU-bound worker while cores sit idle → two workers
  (the finding: "the loading is CPU-bound with N% of the host idle");
* ``in_process``: ``num_workers=0`` with the same augmentation → two
  workers (the finding: "load in worker processes");
* ``contended_workers``: the ``cpu_workers`` loop while other processes
  (a Python busy loop per core) take the CPU for the whole run →
  what its finding prescribes, applied as a user reads it: the hog stopped
  when it names other processes, the augmentation made cheap when it says
  to make the loading cheaper, ``num_workers`` as it says;
* ``host_work``: host work between the steps (no DataLoader) → removed (the
  inter-step gap);
* ``slow_steps``: every 10th step does 150 ms of extra work → removed (the
  erratic-steps finding);
* ``ddp_straggler``: two DDP ranks on gloo under torchrun, rank 1's backward
  30 ms slower → balanced (the group's straggler finding).

A real gpuprofd runs for the whole benchmark in a temporary directory. A
benchmark, not a test: on a shared machine the figures move with the load;
read the errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: One training loop under gpuprof: ``python LOOP.py NAME STEPS KIND ARGS-JSON``.
LOOP = r"""
import json, math, sys, time
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
import gpuprof

NAME, STEPS, KIND = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ARGS = json.loads(sys.argv[4])
torch.manual_seed(0)
# one intra-op thread, as on a node whose cores serve the loader (unless "threads")
torch.set_num_threads(ARGS.get("threads", 1))


def burn(img, passes, seed):
    # pure-Python work per pixel: what a CPU-heavy augmentation costs
    out = img
    for p in range(passes):
        src, out = out, np.empty_like(out)
        a = 0.3 * math.sin(seed + p)
        for y in range(8):
            for x in range(8):
                sx = min(max(x + a * math.sin(y * 0.8 + p), 0.0), 6.999)
                x0 = int(sx)
                f = sx - x0
                out[y, x] = src[y, x0] * (1 - f) + src[y, x0 + 1] * f
    return out


class Images(Dataset):
    def __init__(self, passes):
        rng = np.random.default_rng(0)
        self.x = rng.random((4096, 8, 8), dtype=np.float32)
        self.y = rng.integers(0, 10, 4096)
        self.passes = passes

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = burn(self.x[i], self.passes, i) if self.passes else self.x[i]
        return torch.from_numpy(img.reshape(-1).copy()), int(self.y[i])


def busy(ms):
    end = time.perf_counter() + ms / 1e3
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


model = nn.Sequential(nn.Linear(64, 768), nn.ReLU(), nn.Linear(768, 768), nn.ReLU(),
                      nn.Linear(768, 768), nn.ReLU(), nn.Linear(768, 10))
loss_fn = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
if KIND == "loader":
    workers = ARGS["workers"]
    batches = DataLoader(Images(ARGS["passes"]), batch_size=128, shuffle=True, drop_last=True,
                         num_workers=workers, persistent_workers=workers > 0)
else:  # batches made up front: no loader to wait on
    data = [(torch.rand(128, 64), torch.randint(0, 10, (128,))) for _ in range(32)]
    batches = data
steps = 0
with gpuprof.profile(NAME, print_summary=False):
    while steps < STEPS:
        for x, y in batches:
            out = model(x)
            if ARGS.get("slow_every") and steps % ARGS["slow_every"] == ARGS["slow_every"] - 1:
                busy(ARGS["slow_ms"])  # periodic work inside the step (a checkpoint, a sync)
            loss_fn(out, y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if ARGS.get("host_ms"):
                busy(ARGS["host_ms"])  # host work between the steps (logging, metrics)
            if steps >= STEPS:
                break
print("TRAINED", steps)
"""

#: A DDP rank on gloo: ``torchrun ... DDP.py NAME GROUP STEPS SLOW_RANK DELAY_MS``.
DDP = r"""
import sys, time
import torch
import torch.distributed as dist
from torch import nn
import gpuprof

NAME, GROUP, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
SLOW, DELAY = int(sys.argv[4]), float(sys.argv[5])
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
net = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(128, 128), nn.ReLU())])
# device time, as sleeps (the CPU idles, as it does while a GPU computes)
net[0].register_forward_pre_hook(lambda m, i: time.sleep(0.010))
net[8].register_full_backward_pre_hook(lambda m, g: time.sleep(0.020))
if rank == SLOW:  # a throttled GPU: this rank's backward is slower
    net[-1].register_full_backward_pre_hook(lambda m, g: time.sleep(DELAY / 1e3))
model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
with gpuprof.profile(NAME, group=GROUP, print_summary=False):
    for _ in range(STEPS):
        loss = model(torch.randn(32, 128)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
dist.barrier()
dist.destroy_process_group()
print("TRAINED", STEPS)
"""


class Bench:
    """A gpuprofd in a temporary directory, the loops' scripts, the database."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.tmp = Path(tempfile.mkdtemp(prefix="gpgain", dir="/tmp"))
        self.db = self.tmp / "bench.db"
        self.env = {
            **os.environ,
            "GPUPROF_SOCKET": str(self.tmp / "s"),
            "GPUPROF_DB": str(self.db),
            "OMP_NUM_THREADS": "1",
        }
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "GPUPROF_NVML"):
            self.env.pop(key, None)
        (self.tmp / "loop.py").write_text(LOOP)
        (self.tmp / "ddp.py").write_text(DDP)
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "gpuprofd", "--socket-dir", str(self.tmp / "s")]
            + ["--db", str(self.db), "--idle-exit", "0"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not _ping(self.tmp / "s"):
            if time.monotonic() > deadline or self.daemon.poll() is not None:
                sys.exit("gpuprofd did not start")
            time.sleep(0.05)

    def close(self) -> None:
        self.daemon.terminate()
        self.daemon.wait(30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _run(self, argv: list[str]) -> None:
        out = subprocess.run(
            argv, env=self.env, cwd=self.tmp, capture_output=True, text=True, timeout=1800
        )
        if out.returncode != 0 or "trained" not in out.stdout.lower():
            sys.exit(f"{' '.join(argv[:4])} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")

    def loop(self, name: str, kind: str, hogs: int = 0, **args: Any) -> dict[str, Any]:
        """Train one loop (:data:`LOOP`) while *hogs* other processes each
        spin on a core for the whole run; its stored summary."""
        script = str(self.tmp / "loop.py")
        spin = [sys.executable, "-c", "while True: pass"]
        others = [subprocess.Popen(spin) for _ in range(hogs)]
        try:
            self._run([sys.executable, script, name, str(self.steps), kind, json.dumps(args)])
        finally:
            for p in others:
                p.kill()
                p.wait()
        return self.summary(name)

    def example(self, name: str, *flags: str) -> dict[str, Any]:
        """``examples/digits_mlp.py`` (the README's demo) as run *name*."""
        script = str(ROOT / "examples" / "digits_mlp.py")
        self._run([sys.executable, script, "--run-name", name, "--steps", str(self.steps), *flags])
        return self.summary(name)

    def ddp(self, group: str, slow_rank: int) -> dict[str, Any]:
        """Two gloo ranks under torchrun (:data:`DDP`); the group's report."""
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        script = str(self.tmp / "ddp.py")
        argv = [torchrun, "--standalone", "--nproc-per-node=2", script, group, group]
        self._run([*argv, str(self.steps), str(slow_rank), "30"])
        return self.group(group)

    def _read(self, fn: Callable[[Any], Any]) -> Any:
        from gpuprofd.commands.common import read_with

        deadline = time.monotonic() + 60
        while True:  # the run's end is stored once its summary is made
            try:
                return read_with(self.db, fn)
            except LookupError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def summary(self, name: str) -> dict[str, Any]:
        """The stored summary of the latest run named *name*."""
        from gpuprofd.storage import reads
        from gpuprofd.views.runs import load_summary

        async def get(reader: Any) -> dict[str, Any]:
            runs = [r for r in await reads.runs_rows(reader) if r["run_name"] == name]
            ended = [r for r in runs if r["status"] != "running" and r.get("summary")]
            if not ended:
                raise LookupError(name)
            return await load_summary(reader, max(r["id"] for r in ended))

        return self._read(get)

    def group(self, group: str) -> dict[str, Any]:
        """The group's report: its findings and each rank's summary."""
        from gpuprofd.views.runs import load_group

        async def get(reader: Any) -> dict[str, Any]:
            data = await load_group(reader, group)
            if not data["ended"] or any(not r["summary"].get("insights") for r in data["ranks"]):
                raise LookupError(group)
            return data

        return self._read(get)


def _ping(socket_dir: Path) -> bool:
    from gpuprofd.commands import client
    from gpuprofd.core.errors import NoDaemonError

    try:
        return client.ping(socket_dir, 0.3) is not None
    except NoDaemonError:
        return False


def _finding(found: list[dict[str, Any]], rules: tuple[str, ...]) -> dict[str, Any] | None:
    return next((i for i in found if i["rule"] in rules), None)


STALL = ("cpu_bound_dataloader", "dataloader_stall", "io_bound_dataloader")

#: pair -> (what it is, the rules whose finding predicts, the pathology's
#: loop, the fix's loop): each loop a (kind, args) of :data:`LOOP`, or
#: ("example", flags) for the demo.
PAIRS: dict[str, tuple[str, tuple[str, ...], tuple[str, Any], tuple[str, Any]]] = {
    "demo": (
        "README demo: augmentation in 2 workers -> --no-augment",
        STALL,
        ("example", ()),
        ("example", ("--no-augment",)),
    ),
    "cpu_workers": (
        "2 CPU-bound workers pegging the host -> cheap augmentation",
        STALL,
        ("loader", {"workers": 2, "passes": 6}),
        ("loader", {"workers": 2, "passes": 0}),
    ),
    "threads_workers": (
        "2 CPU-bound workers beside torch's default intra-op threads -> cheap augmentation",
        STALL,
        ("loader", {"workers": 2, "passes": 6, "threads": os.cpu_count() or 1}),
        ("loader", {"workers": 2, "passes": 0, "threads": os.cpu_count() or 1}),
    ),
    "more_workers": (
        "1 CPU-bound worker, cores idle -> 2 workers",
        STALL,
        ("loader", {"workers": 1, "passes": 4}),
        ("loader", {"workers": 2, "passes": 4}),
    ),
    "in_process": (
        "num_workers=0 with augmentation -> 2 workers",
        STALL,
        ("loader", {"workers": 0, "passes": 2}),
        ("loader", {"workers": 2, "passes": 2}),
    ),
    "contended_workers": (
        "2 CPU-bound workers, a process spinning on each core -> what the finding says",
        STALL,
        ("loader", {"workers": 2, "passes": 6, "hogs": os.cpu_count() or 1}),
        ("prescribed", None),
    ),
    "host_work": (
        "25 ms of host work between steps -> removed",
        STALL,
        ("list", {"host_ms": 25}),
        ("list", {}),
    ),
    "slow_steps": (
        "every 10th step 150 ms slower -> removed",
        ("high_step_variance",),
        ("list", {"slow_every": 10, "slow_ms": 150}),
        ("list", {}),
    ),
    "ddp_straggler": (
        "DDP on gloo, rank 1's backward 30 ms slower -> balanced",
        ("straggler_rank", "rank_skew", "bucket_skew"),
        ("ddp", 1),
        ("ddp", -1),
    ),
}


def prescribed(finding: dict[str, Any] | None, args: dict[str, Any]) -> dict[str, Any]:
    """The loop's *args* with what *finding* tells the user to do, done: the
    other processes stopped when it names them, the augmentation made cheap
    when it says to make the loading cheaper or precompute it, the
    ``num_workers`` it names. Unchanged when it says none of these."""
    if finding is None:
        return dict(args)
    text = f"{finding['title']} {finding.get('fix') or ''}"
    out = dict(args)
    if re.search("other processes", text, re.IGNORECASE):
        out["hogs"] = 0
    if re.search(r"cheaper|[Pp]recompute", finding.get("fix") or ""):
        out["passes"] = 0
    workers = re.search(r"num_workers=(\d+)", finding.get("fix") or "")
    if workers:
        out["workers"] = int(workers.group(1))
    return out


def _mean_iteration(summary: dict[str, Any]) -> float:
    return float(summary.get("mean_iteration_ms") or summary.get("median_step_ms") or 0.0)


def run_pair(bench: Bench, pair: str) -> dict[str, Any]:
    """Train *pair*'s pathology then its fix; predicted and measured speed-ups."""
    what, rules, (kind, args), (fix_kind, fix_args) = PAIRS[pair]
    t = time.monotonic()
    if kind == "ddp":
        before = bench.ddp(f"gain-{pair}-path", args)
        after = bench.ddp(f"gain-{pair}-fix", fix_args)
        found = before["insights"]

        def job(g: dict[str, Any]) -> float:  # the job's pace: its ranks' mean iteration
            its = [_mean_iteration(r["summary"]) for r in g["ranks"]]
            return sum(its) / len(its)

        t_path, t_fix = job(before), job(after)
    else:
        if kind == "example":
            before = bench.example(f"gain-{pair}-path", *args)
            after = bench.example(f"gain-{pair}-fix", *fix_args)
        else:
            before = bench.loop(f"gain-{pair}-path", kind, **args)
            if fix_kind == "prescribed":  # the fix is what the finding says
                fix_kind, fix_args = kind, prescribed(_finding(before["insights"], rules), args)
            after = bench.loop(f"gain-{pair}-fix", fix_kind, **fix_args)
        found = before["insights"]
        t_path, t_fix = _mean_iteration(before), _mean_iteration(after)
    finding = _finding(found, rules)
    measured = t_path / t_fix if t_fix > 0 else None
    if kind == "ddp":
        busy = [
            r["summary"].get("measured_under_contention")
            for g in (before, after)
            for r in g["ranks"]
        ]
    else:
        busy = [before.get("measured_under_contention"), after.get("measured_under_contention")]
    # the cores other processes held during each run's contended steps (None: quiet)
    others = None if kind == "ddp" else [(b or {}).get("other_cores") for b in busy]
    predicted = finding.get("gain_speedup_max") if finding else None
    return {
        "pair": pair,
        "what": what,
        "rule": finding["rule"] if finding else None,
        "title": finding["title"] if finding else None,
        "method": finding.get("gain_method") if finding else None,
        "fix": finding.get("fix") if finding else None,
        # what the fix run changed (a prescribed fix: what the finding said to do)
        "applied": (
            {k: v for k, v in fix_args.items() if args.get(k) != v}
            if isinstance(args, dict) and isinstance(fix_args, dict)
            else None
        ),
        "iteration_ms": [round(t_path, 1), round(t_fix, 1)],
        "predicted": predicted,
        "measured": None if measured is None else round(measured, 2),
        "error": None if not predicted or not measured else round(predicted / measured - 1, 3),
        "others": [(i["rule"], i.get("gain_speedup_max")) for i in found if i is not finding],
        "seconds": round(time.monotonic() - t),
        # other processes held the host during a run: its figures are a busy host's
        "contended": any(busy),
        "other_cores": others,
        "load": round(os.getloadavg()[0], 1),
    }


def _held(cores: list[float | None] | None) -> str:
    """What other processes held during each run's contended steps, as
    ``, others held 0.9 / - cores`` ("-": that run was not contended)."""
    if not cores or not any(c is not None for c in cores):
        return ""
    return ", others held " + " / ".join("-" if c is None else f"{c:.1f}" for c in cores) + " cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS))
    ap.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    ap.add_argument("--tolerance", type=float, default=0.25, help="largest |error| (0.25)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    bench = Bench(args.steps)
    results = []
    try:
        for pair in args.pairs:
            r = run_pair(bench, pair)
            results.append(r)
            ok = r["error"] is not None and abs(r["error"]) <= args.tolerance
            err = "-" if r["error"] is None else f"{r['error']:+.0%}"
            print(
                f"{pair:<14} {r['what']}\n  {r['rule'] or 'no finding'}: predicted "
                f"{r['predicted']}×, measured {r['measured']}× "
                f"({r['iteration_ms'][0]} -> {r['iteration_ms'][1]} ms/iteration), error "
                f"{err} [{'ok' if ok else 'MISS'}] ({r['seconds']} s, load {r['load']}"
                f"{', measured under contention' if r['contended'] else ''}"
                f"{_held(r['other_cores'])}); "
                f"others {r['others']}"
                f"\n  method: {r['method']}"
                + (f"\n  fix: {r['fix']}\n  applied: {r['applied']}" if r["applied"] else ""),
                flush=True,
            )
    finally:
        bench.close()
    print("\n| pair | finding | ms/iteration | predicted | measured | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        err = "-" if r["error"] is None else f"{r['error']:+.0%}"
        busy = " (busy host)" if r["contended"] else ""
        print(
            f"| {r['pair']}: {r['what']} | `{r['rule']}` | {r['iteration_ms'][0]} → "
            f"{r['iteration_ms'][1]} | {r['predicted']}× | {r['measured']}×{busy} | {err} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    missed = [r["pair"] for r in results if r["error"] is None or abs(r["error"]) > args.tolerance]
    if missed:
        print(f"outside ±{args.tolerance:.0%}: {', '.join(missed)}")


if __name__ == "__main__":
    main()
