"""The prepared real-GPU check of per-bucket DDP comm timing on NCCL.

Live mode (default; needs CUDA) starts a gpuprofd in a temporary folder,
then ``torchrun --standalone --nproc-per-node=N`` (``python -m
torch.distributed.run``; N = the visible GPUs, at least 1, or ``--nproc``)
with this file as the worker: NCCL backend, each rank on
``cuda:LOCAL_RANK``, a DDP of ``--layers`` (6) ``Linear(4096, 4096)`` + GELU
layers (one 67 MB fp32 gradient bucket per layer with DDP's default 25 MB
cap: 6 buckets), bf16 autocast, SGD, batch 8192, ``loss.item()`` every
``--sync-every`` (10) steps (a logging cadence; otherwise the CPU runs ahead):

1. **Main run.** ``--steps`` (60) steps under ``gpuprof.profile(...)``
   (default ``time_comm=True``); steps ``--window`` (40-47) also under a
   ``torch.profiler`` window (CPU + CUDA activities), each of those steps
   ending in ``torch.cuda.synchronize()`` so that their bucket records are
   resolved when the shim sends them, and the window opened and closed
   after a sync (it holds exactly those steps' kernels).
2. **Overhead.** A second, identical DDP; ``--rounds`` (6) interleaved
   rounds of one ``--block-steps`` (40) block per mode, each block its own
   ``gpuprof.profile``: ``time_comm=False`` on one model, ``time_comm=True``
   (comm hook + clock alignment) on the other; a block's time is from a
   sync after its first step to a sync after its last.

Which hook. With two or more ranks DDP's buckets go through gpuprof's own
hook (the default all-reduce, a sum). With one rank (``--hook auto``) NCCL
launches no kernel for an in-place sum (``ncclLaunchOneRank``: a no-op), so
there would be nothing to time against: the workers then register, inside
the profile, a user hook averaging with ``ReduceOp.AVG`` (NCCL runs a
one-rank ``PreMulSum`` kernel), which gpuprof wraps and times (the
user-hook path of :mod:`gpuprof_shim.comm`). ``--hook default|avg`` forces
one.

After the job the daemon is stopped (it flushes) and its database read.
Per rank the report gives, and judges:

- **buckets**: stored bucket rows per step (>= :data:`MIN_BUCKETS`, each
  index once; every bucket in >= 90 % of the steps after DDP's re-bucketing
  step, or every missing row one of the unresolved records), and their
  bytes per step = the DDP's parameter bytes;
- **events vs kernels**: each bucket's CUDA-event duration (the stored
  ``end_ns - start_ns``) beside the NCCL kernel that torch.profiler saw for
  it in the window (paired in launch order, step by step), median ratio
  within :data:`RATIO_RANGE`;
- **unresolved**: records left out because their CUDA events had not
  completed when their step was sent (from the run summary's note),
  <= :data:`MAX_UNRESOLVED_FRAC` of the main run's records;
- **comm phase**: the median ``comm`` phase (> 0 and below the median
  step) beside the median step;
- **clock**: the stored clock offset and its uncertainty (one node shares
  ``CLOCK_MONOTONIC``: |offset| <= uncertainty + :data:`CLOCK_SLACK_NS`;
  a world of one rank stores none: SKIP, with the reason);
- **overhead**: the median block's step time with / without comm timing,
  <= :data:`MAX_OVERHEAD` (comm timing may add at most 2 % to a step).

``--dry-run`` runs the same on the CPU: gloo, 2 ranks, six
``Linear(128, 128)`` layers with ``bucket_cap_mb=0.05`` (6 buckets), fewer
overhead steps. There are no NCCL kernels on a CPU: that comparison is
skipped with the reason, and the torch.profiler window is checked by the
``gloo:all_reduce`` ranges it saw. It is judged on plumbing (every part ran,
rows and offsets stored, bytes right); the overhead is reported, not judged.
That is how CI tests this script.

Writes ``report.json`` and ``report.md`` to ``--out`` (default
``bench/results/gpu_check_comm/`` for a live run; a temporary folder for
``--dry-run``) and prints the summary. Exit status: 0 every verdict PASS
or SKIP with its reason (dry run: plumbing OK), 1 a FAIL or a failed run, 2 live mode without CUDA
(one line on stderr). Never changes GPU settings; the workers exit at the
end (freeing their GPU memory) and the daemon is stopped. Live: well under
a minute of training on one H200 beyond ``import torch`` and NCCL's start.

    python scripts/gpu_check_comm.py [--steps 60] [--nproc N] [--out DIR]
    python scripts/gpu_check_comm.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_check_common import (
    ROOT,
    NoGpu,
    check_parser,
    child_env,
    dry_run_check,
    errors_md,
    fmt,
    no_cuda,
    plumbing_md,
    save_report,
    script_main,
    stop_daemon,
)

DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check_comm"
RUN = "gpu_check_comm"
#: The live model: layers x Linear(d, d), batch rows; DDP's default bucket cap.
LIVE_SHAPE = {"d": 4096, "batch": 8192, "bucket_cap_mb": 25.0}
#: The dry run's: small enough for a few ms per CPU step; a cap that gives
#: each layer its own bucket.
DRY_SHAPE = {"d": 128, "batch": 64, "bucket_cap_mb": 0.05}
#: Fewest buckets per step the model must make (the brief: >= 4).
MIN_BUCKETS = 4
#: Steps of the main run left out of the per-step checks: DDP rebuilds its
#: buckets after step 0 (step 0's buckets follow registration order).
SKIP_STEPS = 2
#: Share of analysed steps that must hold every bucket.
MIN_COMPLETE_FRAC = 0.9
#: CUDA-event duration / NCCL kernel duration, median over the window's
#: buckets: the events bracket the collective (from the bucket's point in
#: the compute stream to the callback's stream waiting on NCCL's), so they
#: read a little more than the kernel (stream-wait latency, queueing behind
#: an earlier bucket's kernel, or SMs held by backward's GEMMs before the
#: kernel could start: the report's per-bucket excess shows which; the last
#: bucket overlaps no backward), never a different quantity.
RATIO_RANGE = (0.5, 2.0)
#: Records left out (events not complete at send) of the main run's records.
MAX_UNRESOLVED_FRAC = 0.05
#: Slack on |clock offset| <= uncertainty (rounding of the NTP estimate), ns.
CLOCK_SLACK_NS = 5_000
#: Step time with comm timing / without: at most 2 % more, or it is not invisible.
MAX_OVERHEAD = 1.02
#: Device kernels of a collective: NCCL's (``ncclKernel_*``,
#: ``ncclDevKernel_*``) and its one-rank reduction (``oneRankReduce<...>``).
COLL_KERNEL_RE = re.compile(r"nccl(?:Dev)?Kernel|oneRankReduce", re.IGNORECASE)
#: CPU-side ranges of a collective in torch.profiler (gloo's, NCCL's).
COLL_OP_RE = re.compile(r"^(?:gloo|nccl):all_?reduce")
#: The shim's summary note for records left out (gpuprof_shim.comm).
UNRESOLVED_RE = re.compile(r"(\d+) DDP bucket timings? left out")
CHILD_TIMEOUT_S = {"live": 420.0, "dry": 150.0}
MS = 1e6


# --- the worker (one per rank, under torchrun) -------------------------------------


def avg_hook(state, bucket):  # unannotated: DDP's _check_comm_hook compares annotations
    """A user comm hook: average the bucket (NCCL: ``ReduceOp.AVG``, which
    runs a kernel even on one rank; gloo has no AVG: scale, then sum)."""
    import torch.distributed as dist

    tensor = bucket.buffer()
    if dist.get_backend() == "nccl":
        work = dist.all_reduce(tensor, op=dist.ReduceOp.AVG, async_op=True)
    else:
        tensor.mul_(1.0 / dist.get_world_size())
        work = dist.all_reduce(tensor, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class Worker:
    """One rank: the DDP models, the timed loops, the torch.profiler window."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.args = torch, dist, args
        self.rank = int(os.environ.get("RANK", "0"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.shape = DRY_SHAPE if args.dry_run else LIVE_SHAPE
        if args.dry_run:
            torch.set_num_threads(1)
            self.dev = torch.device("cpu")
            backend = "gloo"
        else:
            torch.cuda.set_device(self.local)
            self.dev = torch.device("cuda", self.local)
            backend = "nccl"
        t = time.perf_counter()
        dist.init_process_group(backend)
        self.backend = dist.get_backend()
        self.hook = args.hook
        if self.hook == "auto":
            self.hook = "avg" if self.backend == "nccl" and self.world == 1 else "default"
        self.cuda = self.dev.type == "cuda"
        if self.cuda:  # NCCL's communicator starts at its first collective: time it here
            dist.barrier(device_ids=[self.local])
            torch.cuda.synchronize(self.dev)
        self.init_s = time.perf_counter() - t
        g = torch.Generator().manual_seed(1000 + self.rank)
        self.x = torch.randn(self.shape["batch"], self.shape["d"], generator=g).to(self.dev)

    def build(self) -> tuple[Any, Any]:
        torch = self.torch
        nn = torch.nn
        torch.manual_seed(0)
        d = self.shape["d"]
        layers: list[Any] = []
        for _ in range(self.args.layers):
            layers += [nn.Linear(d, d), nn.GELU()]
        net = nn.Sequential(*layers).to(self.dev)
        ddp = nn.parallel.DistributedDataParallel(
            net,
            device_ids=[self.local] if self.cuda else None,
            bucket_cap_mb=self.shape["bucket_cap_mb"],
        )
        return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def step(self, model: Any, opt: Any) -> Any:
        torch = self.torch
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = model(self.x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def _profile(self, name: str, time_comm: bool) -> Any:
        import gpuprof

        return gpuprof.profile(
            f"{RUN}:{name}",
            print_summary=False,
            count_flops=False,
            socket_dir=self.args._sock,
            db=self.args._db,
            autostart=False,
            time_comm=time_comm,
        )

    def main_run(self, model: Any, opt: Any) -> dict[str, Any]:
        """``--steps`` steps under profile(); the window's steps under torch.profiler."""
        torch = self.torch
        a, b = self.args.window
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        tp: Any = None
        w0 = w1 = 0
        t = time.perf_counter()
        with self._profile("main", True) as prof:
            if self.hook == "avg":  # inside the profile: gpuprof wraps it
                model.register_comm_hook(None, avg_hook)
            try:
                for i in range(self.args.steps):
                    if i == a:
                        self.sync()
                        tp = torch.profiler.profile(activities=acts)
                        tp.__enter__()
                        w0 = time.monotonic_ns()
                    loss = self.step(model, opt)
                    if a <= i < b:
                        self.sync()
                    elif (i + 1) % self.args.sync_every == 0:
                        loss.item()
                    if i == b - 1:
                        w1 = time.monotonic_ns()
                        tp.__exit__(None, None, None)
            finally:
                if tp is not None and not w1:  # a step failed inside the window
                    tp.__exit__(None, None, None)
            self.sync()
            timer = getattr(prof, "_comm", None)
        wall = time.perf_counter() - t
        kernels, ops = self._window_events(tp)
        summary = prof.summary or {}
        return {
            "run_id": summary.get("run_id"),
            "wall_s": round(wall, 3),
            "window": {
                "steps": [a, b],
                "t0_ns": w0,
                "t1_ns": w1,
                "kernels": kernels,
                "coll_ops": ops,
            },
            "notes": list(summary.get("notes") or []),
            "timer": {k: getattr(timer, k, None) for k in ("attached", "unresolved", "dropped")},
        }

    def _window_events(self, tp: Any) -> tuple[list[list[Any]], dict[str, int]]:
        """Collective kernels seen in the window ``[start_ns, duration_ns,
        name]`` by start, and the collective CPU ranges counted by name."""
        if tp is None or tp.profiler is None:
            return [], {}
        cpu = self.torch.autograd.DeviceType.CPU
        kernels: list[list[Any]] = []
        ops: Counter[str] = Counter()
        for e in tp.profiler.kineto_results.events():
            name = e.name()
            if e.device_type() != cpu:
                if COLL_KERNEL_RE.search(name):
                    kernels.append([int(e.start_ns()), int(e.duration_ns()), name[:160]])
            elif COLL_OP_RE.match(name):
                ops[name] += 1
        kernels.sort()
        return kernels, dict(ops)

    def overhead(self, model_on: Any, opt_on: Any) -> dict[str, Any]:
        """Interleaved blocks: time_comm=False on a second DDP, True on the first."""
        model_off, opt_off = self.build()
        if self.hook == "avg":  # outside any profile: not wrapped
            model_off.register_comm_hook(None, avg_hook)
        for _ in range(3):  # DDP's re-bucketing, the allocator
            self.step(model_off, opt_off)
        self.sync()
        models = {"off": (model_off, opt_off), "on": (model_on, opt_on)}
        blocks: dict[str, list[float]] = {"off": [], "on": []}
        n = self.args.block_steps
        for r in range(self.args.rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                model, opt = models[mode]
                with self._profile(f"overhead:{mode}:r{r}", mode == "on"):
                    self.step(model, opt)  # the hook found, alignment started
                    self.sync()
                    t = time.perf_counter()
                    for i in range(n):
                        loss = self.step(model, opt)
                        if (i + 1) % self.args.sync_every == 0:
                            loss.item()
                    self.sync()
                    blocks[mode].append(time.perf_counter() - t)
        return {
            "block_steps": n,
            "rounds": self.args.rounds,
            "block_s": {m: [round(v, 5) for v in vs] for m, vs in blocks.items()},
        }

    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "local_rank": self.local,
            "world_size": self.world,
            "backend": self.backend,
            "hook": self.hook,
            "device": str(self.dev),
            "device_name": (
                self.torch.cuda.get_device_name(self.dev) if self.cuda else "CPU (dry run)"
            ),
            "torch": self.torch.__version__,
            "cuda": self.torch.version.cuda,
            "nccl": _nccl_version(self.torch) if self.cuda else None,
            "init_s": round(self.init_s, 3),
            "errors": [],
        }
        try:
            model, opt = self.build()
            out["param_bytes"] = sum(
                p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
            )
            out["main"] = self.main_run(model, opt)
            t = time.perf_counter()
            out["overhead"] = self.overhead(model, opt)
            out["overhead"]["wall_s"] = round(time.perf_counter() - t, 3)
        except Exception as exc:  # noqa: BLE001 - reported, judged as a failed part
            out["errors"].append(f"rank {self.rank}: {exc.__class__.__name__}: {exc}")
        if self.cuda:
            peak = self.torch.cuda.max_memory_allocated(self.dev)
            out["peak_allocated_gb"] = round(peak / 1e9, 2)
        return out


def _nccl_version(torch: Any) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a figure for the report only
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def worker_main(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("gpuprof").setLevel(logging.WARNING)
    t = time.perf_counter()
    import torch  # noqa: F401 - timed here

    import_s = time.perf_counter() - t
    rank = int(os.environ.get("RANK", "0"))
    try:
        w = Worker(args)
    except Exception as exc:  # noqa: BLE001 - no process group: say so in the result
        out = {
            "rank": rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "errors": [f"rank {rank}: process group: {exc.__class__.__name__}: {exc}"],
        }
        Path(args._result, f"rank{rank}.json").write_text(json.dumps(out, default=str))
        return 1
    out = w.run()
    out["import_torch_s"] = round(import_s, 3)
    Path(args._result, f"rank{rank}.json").write_text(json.dumps(out, default=str))
    try:
        w.dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the result is written; leaving is all that is left
        pass
    return 0


# --- the parent: daemon, torchrun, the database, the verdicts ----------------------


def _ping(sock: Path) -> bool:
    from gpuprofd.commands import client
    from gpuprofd.core.errors import NoDaemonError

    try:
        return client.ping(sock, 0.3) is not None
    except NoDaemonError:
        return False


def start_daemon(sock: Path, db: Path, env: Mapping[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuprofd",
                "--socket-dir",
                str(sock),
                "--db",
                str(db),
                "--idle-exit",
                "0",
            ],
            env=dict(env),
            stdout=subprocess.DEVNULL,
            stderr=fh,
            start_new_session=True,
        )
    deadline = time.monotonic() + 30
    while not _ping(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_daemon(proc)
            raise RuntimeError(f"gpuprofd did not start: {log.read_text()[-600:]}")
        time.sleep(0.05)
    return proc


def run_job(cmd: list[str], env: Mapping[str, str], cwd: Path, timeout_s: float) -> int | None:
    """Run the torchrun job (its own process group, its output on stderr);
    its exit status, or None when it ran past *timeout_s* (then the job's
    process group, torchrun and its workers, is terminated, then killed)."""
    proc = subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdout=sys.stderr, start_new_session=True)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        return None


def gpu_count() -> int:
    """Visible CUDA devices (live mode); :class:`NoGpu` without any."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise NoGpu(no_cuda(torch))
    return torch.cuda.device_count()


def read_db(db: Path) -> dict[str, Any]:
    """The runs, steps and bucket rows of this job (read-only)."""
    from gpuprofd.storage import commpack

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        runs = [
            dict(r)
            for r in conn.execute(
                "SELECT id, run_name, rank, status, clock_offset_ns, clock_uncertainty_ns, "
                "clock_rtt_ns, clock_round_trips, clock_reference_rank FROM runs ORDER BY id"
            )
        ]
        steps = [
            dict(r)
            for r in conn.execute(
                "SELECT run_id, step, t0_ns, t1_ns, phases FROM steps ORDER BY run_id, step"
            )
        ]
        names = ("run_id", "step", *commpack.COLUMNS)
        buckets = sorted(
            (
                dict(zip(names, (run_id, *b), strict=True))
                for run_id, step, packed in conn.execute(
                    "SELECT run_id, step, packed FROM comm_steps ORDER BY run_id, step"
                )
                for b in commpack.bucket_rows([(step, packed)])
            ),
            key=lambda b: (b["run_id"], b["start_ns"] or 0),
        )
    finally:
        conn.close()
    return {"runs": runs, "steps": steps, "buckets": buckets}


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def _check(ok: bool | None, detail: str) -> dict[str, Any]:
    return {"verdict": "SKIP" if ok is None else "PASS" if ok else "FAIL", "detail": detail}


def pair_window(
    rows: Sequence[Mapping[str, Any]],
    window_steps: Sequence[int],
    nb: int,
    kernels: Sequence[Sequence[Any]],
) -> tuple[list[tuple[float, float, int | None]], str]:
    """Pair each bucket row of the window with its kernel: ``[(event_ms,
    kernel_ms, bucket index)]`` and how. Kernels run in launch order on NCCL's stream, *nb*
    per step: the j-th kernel of the window's k-th step is that step's j-th
    bucket launched. A step short of rows (records left out) drops only its
    own pairs; without exactly *nb* kernels per step, the sorted durations
    are paired instead (all buckets are the same size here)."""
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    ev = lambda r: (r["end_ns"] - r["start_ns"]) / MS  # noqa: E731
    if window_steps and nb and len(kernels) == len(window_steps) * nb:
        pairs = []
        for k, s in enumerate(window_steps):
            got = sorted(by_step.get(s, []), key=lambda r: r["start_ns"])
            if len(got) != nb:
                continue
            for j, r in enumerate(got):
                pairs.append((ev(r), kernels[k * nb + j][1] / MS, r["bucket"]))
        return pairs, "launch order, step by step"
    evs = sorted(ev(r) for r in rows)
    ks = sorted(k[1] / MS for k in kernels)
    n = min(len(evs), len(ks))
    if not n:
        return [], "none"
    pick = lambda xs: [xs[round(i * (len(xs) - 1) / max(1, n - 1))] for i in range(n)]  # noqa: E731
    return [(e, k, None) for e, k in zip(pick(evs), pick(ks), strict=True)], (
        f"sorted durations ({len(rows)} rows, {len(kernels)} kernels: not {nb} per step)"
    )


def assess_rank(w: Mapping[str, Any], db: Mapping[str, Any], live: bool) -> dict[str, Any]:
    """One rank's figures and verdicts from its worker result and the database."""
    rank = w["rank"]
    runs = [r for r in db["runs"] if r["rank"] == rank or (r["rank"] is None and rank == 0)]
    main = next((r for r in runs if r["run_name"] == f"{RUN}:main"), None)
    out: dict[str, Any] = {
        "rank": rank,
        "device": w.get("device"),
        "hook": w.get("hook"),
        "param_bytes": w.get("param_bytes"),
        "checks": {},
    }
    checks = out["checks"]
    m = w.get("main") or {}
    if main is None or not m:
        out["error"] = "no stored main run for this rank"
        for name in ("buckets", "bytes", "events_vs_kernels", "unresolved", "comm_phase", "clock"):
            checks[name] = _check(False, out["error"])
        return out
    rid = main["id"]
    steps = [s for s in db["steps"] if s["run_id"] == rid]
    rows = [b for b in db["buckets"] if b["run_id"] == rid]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for b in rows:
        by_step.setdefault(b["step"], []).append(b)
    analysed = [s for s in steps if s["step"] >= SKIP_STEPS]
    counts = Counter(len(by_step.get(s["step"], [])) for s in analysed)
    nb = max(counts, default=0)  # records left out only ever make a step shorter
    complete = [s["step"] for s in analysed if len(by_step.get(s["step"], [])) == nb and nb]
    # every step's indices distinct and below nb; complete steps hold each once
    idx_ok = all(
        len({b["bucket"] for b in by_step.get(s["step"], [])}) == len(by_step.get(s["step"], []))
        and all(0 <= b["bucket"] < nb for b in by_step.get(s["step"], []))
        for s in analysed
    )
    frac = len(complete) / len(analysed) if analysed else 0.0
    missing = nb * len(analysed) - sum(len(by_step.get(s["step"], [])) for s in analysed)
    notes = m.get("notes") or []
    unresolved = sum(int(x.group(1)) for n in notes if (x := UNRESOLVED_RE.search(n)))
    out["steps_stored"] = len(steps)
    out["buckets"] = {
        "per_step": nb,
        "count_histogram": {str(k): v for k, v in sorted(counts.items())},
        "steps_analysed": len(analysed),
        "steps_complete": len(complete),
        "rows": len(rows),
        "rows_missing": missing,
        "indices_once": idx_ok,
        "step0_rows": len(by_step.get(0, [])),
    }
    checks["buckets"] = _check(
        nb >= MIN_BUCKETS
        and idx_ok
        and bool(complete)
        and (frac >= MIN_COMPLETE_FRAC or missing <= unresolved),
        f"{nb} buckets per step (>= {MIN_BUCKETS}), each index once: {idx_ok}; "
        f"{len(complete)}/{len(analysed)} steps from step {SKIP_STEPS} complete "
        f"(>= {MIN_COMPLETE_FRAC:.0%}, or the {missing} row(s) missing all among the "
        f"{unresolved} unresolved)",
    )
    step_bytes = sorted({sum(b["bytes"] for b in by_step[s]) for s in complete})
    pb = w.get("param_bytes")
    out["bytes_per_step"] = step_bytes
    checks["bytes"] = _check(
        bool(step_bytes) and step_bytes == [pb],
        f"bytes per complete step {step_bytes} vs parameters' {pb}",
    )
    durs = [(b["end_ns"] - b["start_ns"]) / MS for b in rows]
    out["event_ms"] = {
        "median": _r(_median(durs)),
        "min": _r(min(durs, default=None)),
        "max": _r(max(durs, default=None)),
    }
    # torch.profiler window
    win = m.get("window") or {}
    w0, w1 = win.get("t0_ns") or 0, win.get("t1_ns") or 0
    wsteps = [s["step"] for s in steps if w0 < s["t1_ns"] <= w1]
    wrows = [b for b in rows if w0 <= b["start_ns"] <= w1]
    kernels = win.get("kernels") or []
    ops = win.get("coll_ops") or {}
    pairs, how = pair_window(wrows, wsteps, nb, kernels)
    ratios = [e / k for e, k, _ in pairs if k > 0]
    med = _median(ratios)
    per_bucket: dict[int, list[tuple[float, float]]] = {}
    for e, k, j in pairs:
        if j is not None and k > 0:
            per_bucket.setdefault(j, []).append((e / k, (e - k) * 1e3))
    by_bucket = {
        str(j): {
            "ratio_median": _r(_median([x for x, _ in v])),
            "excess_us_median": _r(_median([y for _, y in v]), 1),
        }
        for j, v in sorted(per_bucket.items())
    }
    out["window"] = {
        "loop_steps": win.get("steps"),
        "gpuprof_steps": wsteps,
        "rows": len(wrows),
        "kernels": len(kernels),
        "kernel_names": sorted({k[2] for k in kernels})[:4],
        "coll_ops": ops,
        "pairs": len(pairs),
        "paired_by": how,
        "event_ms_median": _r(_median([e for e, _, _ in pairs])),
        "kernel_ms_median": _r(_median([k for _, k, _ in pairs])),
        # event - kernel: the wait before the kernel ran (an earlier bucket's
        # kernel, SMs held by backward's GEMMs) and the stream-wait latency
        "excess_us_median": _r(_median([(e - k) * 1e3 for e, k, _ in pairs]), 1),
        # per bucket index; the last one overlaps no backward compute
        "by_bucket": by_bucket,
        "ratio_median": _r(med),
        "ratio_min": _r(min(ratios, default=None)),
        "ratio_max": _r(max(ratios, default=None)),
    }
    lo, hi = RATIO_RANGE
    if not kernels and not live:
        checks["events_vs_kernels"] = _check(
            None,
            f"skipped: no NCCL kernels on a CPU ({w.get('backend')}); the window saw "
            f"{sum(ops.values())} collective range(s) for {len(wrows)} bucket row(s)",
        )
    elif not kernels:
        why = (
            "; one rank: NCCL's in-place sum runs no kernel (use --hook avg)"
            if w.get("world_size") == 1 and w.get("hook") == "default"
            else ""
        )
        checks["events_vs_kernels"] = _check(
            False, f"no NCCL kernel in the torch.profiler window: nothing to compare{why}"
        )
    else:
        checks["events_vs_kernels"] = _check(
            med is not None and lo <= med <= hi,
            f"median event/kernel {_r(med, 3)} over {len(pairs)} bucket(s) "
            f"(within {lo}-{hi}x; paired by {how})",
        )
    # unresolved records
    total = len(rows) + unresolved
    out["unresolved"] = {
        "from_notes": unresolved,
        "timer": (m.get("timer") or {}),
        "records": total,
        "notes": notes,
    }
    checks["unresolved"] = _check(
        unresolved <= MAX_UNRESOLVED_FRAC * total if total else False,
        f"{unresolved} of {total} record(s) left out (<= {MAX_UNRESOLVED_FRAC:.0%}; summary note)",
    )
    # comm phase
    comm = []
    step_ms = []
    for s in analysed:
        ph = json.loads(s["phases"] or "{}")
        step_ms.append((s["t1_ns"] - s["t0_ns"]) / MS)
        if s["step"] in complete:
            comm.append(ph.get("comm", 0) / MS)
    mc, ms = _median(comm), _median(step_ms)
    out["comm_phase_ms"] = {
        "median": _r(mc),
        "min": _r(min(comm, default=None)),
        "max": _r(max(comm, default=None)),
        "median_step_ms": _r(ms),
        "share": _r(mc / ms if mc is not None and ms else None),
    }
    checks["comm_phase"] = _check(
        mc is not None and ms is not None and 0 < mc < ms and min(comm) > 0,
        f"median comm phase {_r(mc, 3)} ms (> 0 in every complete step: "
        f"{bool(comm) and min(comm) > 0}) of a {_r(ms, 3)} ms median step",
    )
    # clock offset
    off, unc = main.get("clock_offset_ns"), main.get("clock_uncertainty_ns")
    out["clock"] = {
        k: main.get(k)
        for k in (
            "clock_offset_ns",
            "clock_uncertainty_ns",
            "clock_rtt_ns",
            "clock_round_trips",
            "clock_reference_rank",
        )
    }
    within = off is not None and unc is not None and abs(off) <= unc + CLOCK_SLACK_NS
    lone = w.get("world_size") == 1
    checks["clock"] = _check(
        None if lone and off is None else within if live else off is not None,
        "skipped: a world of one rank has nothing to align (no offset stored)"
        if lone and off is None
        else "not stored"
        if off is None
        else f"offset {off / 1e3:.1f} us, uncertainty {unc / 1e3:.1f} us (one node: "
        f"|offset| <= uncertainty + {CLOCK_SLACK_NS / 1e3:g} us: {within})",
    )
    # overhead
    ov = w.get("overhead") or {}
    bs = ov.get("block_s") or {}
    n = ov.get("block_steps") or 1
    if bs.get("off") and bs.get("on"):
        off_ms = statistics.median(bs["off"]) / n * 1e3
        on_ms = statistics.median(bs["on"]) / n * 1e3
        ratio = on_ms / off_ms
        out["overhead"] = {
            "step_ms_off": _r(off_ms),
            "step_ms_on": _r(on_ms),
            "ratio": _r(ratio),
            **ov,
        }
        checks["overhead"] = _check(
            ratio <= MAX_OVERHEAD if live else None,
            f"time_comm=True/False {ratio:.3f}x ({on_ms:.3f} / {off_ms:.3f} ms per step, "
            f"median of {len(bs['on'])} interleaved blocks)"
            + (f"; <= {MAX_OVERHEAD}x" if live else "; reported, not judged on a CPU"),
        )
    else:
        out["overhead"] = ov or None
        checks["overhead"] = _check(False, "the overhead blocks did not run")
    return out


def plumbing_checks(rep: Mapping[str, Any]) -> dict[str, bool]:
    """A dry run's pass: every part ran and left the right data behind."""
    ranks = rep.get("ranks") or []

    def every(name: str) -> bool:
        return bool(ranks) and all(r["checks"][name]["verdict"] == "PASS" for r in ranks)

    return {
        "no_errors": not rep.get("errors"),
        "all_ranks": len(ranks) == rep.get("world_size"),
        "steps_stored": bool(ranks) and all(r.get("steps_stored") == rep["steps"] for r in ranks),
        "buckets": every("buckets"),
        "bytes": every("bytes"),
        "comm_phase": every("comm_phase"),
        "clock_stored": every("clock"),
        "unresolved_read": every("unresolved"),
        "window_saw_collectives": bool(ranks)
        and all(sum(r["window"]["coll_ops"].values()) >= r["window"]["rows"] > 0 for r in ranks),
        "overhead_blocks": bool(ranks)
        and all((r.get("overhead") or {}).get("ratio") is not None for r in ranks),
    }


CHECKS = ["buckets", "bytes", "events_vs_kernels", "unresolved", "comm_phase", "clock", "overhead"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Daemon, torchrun, database: the report's content."""
    t_start = time.monotonic()
    visible = None if args.dry_run else gpu_count()  # NoGpu before anything starts
    nproc = args.nproc or visible or 2
    tmp = Path(tempfile.mkdtemp(prefix="gpcc", dir="/tmp"))  # short: a Unix socket path
    sock, db, res = tmp / "s", tmp / "gpuprof.db", tmp / "res"
    res.mkdir()
    env = child_env(sock, db, one_thread=args.dry_run)
    daemon = None
    try:
        daemon = start_daemon(sock, db, env, tmp / "gpuprofd.log")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2",
            str(Path(__file__).resolve()),
            "--_worker",
            "--_result",
            str(res),
            "--_sock",
            str(sock),
            "--_db",
            str(db),
            "--steps",
            str(args.steps),
            "--window",
            f"{args.window[0]}-{args.window[1] - 1}",
            "--layers",
            str(args.layers),
            "--rounds",
            str(args.rounds),
            "--block-steps",
            str(args.block_steps),
            "--sync-every",
            str(args.sync_every),
            "--hook",
            args.hook,
        ] + ["--dry-run"] * args.dry_run
        t = time.monotonic()
        rc = run_job(cmd, env, tmp, args.timeout_s)
        job_s = time.monotonic() - t
        stop_daemon(daemon)
        workers = [json.loads(p.read_text()) for p in sorted(res.glob("rank*.json"))]
        if not workers:
            raise RuntimeError(
                f"no rank left a result (torchrun exit {rc}"
                + (f"; timeout {args.timeout_s:g} s)" if rc is None else ")")
            )
        data = read_db(db) if db.exists() else {"runs": [], "steps": [], "buckets": []}
        live = not args.dry_run
        errors = [e for w in workers for e in w.get("errors", [])]
        if rc != 0:
            errors.append(
                f"torchrun exited {rc}"
                if rc is not None
                else f"torchrun ran past {args.timeout_s:g} s"
            )
        w0 = workers[0]
        ranks = [assess_rank(w, data, live) for w in sorted(workers, key=lambda w: w["rank"])]
        return {
            "mode": "dry-run" if args.dry_run else "live",
            "device": {
                "name": w0.get("device_name"),
                "torch": w0.get("torch"),
                "cuda": w0.get("cuda"),
                "nccl": w0.get("nccl"),
            },
            "world_size": w0.get("world_size"),
            "backend": w0.get("backend"),
            "hook": w0.get("hook"),
            "steps": args.steps,
            "window": list(args.window),
            "model": {
                **(DRY_SHAPE if args.dry_run else LIVE_SHAPE),
                "layers": args.layers,
                "param_bytes": w0.get("param_bytes"),
            },
            "timings_s": {
                "import_torch": w0.get("import_torch_s"),
                "init_process_group": w0.get("init_s"),
                "main_run": (w0.get("main") or {}).get("wall_s"),
                "torchrun_job": round(job_s, 2),
                "total_wall": round(time.monotonic() - t_start, 2),
            },
            "peak_allocated_gb": w0.get("peak_allocated_gb"),
            "runs_in_db": len(data["runs"]),
            "ranks": ranks,
            "errors": errors,
        }
    finally:
        if daemon is not None:
            stop_daemon(daemon)
        shutil.rmtree(tmp, ignore_errors=True)


# --- report --------------------------------------------------------------------------


def verdicts(rep: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each check over all ranks: FAIL if any rank fails, SKIP if all skip."""
    out = {}
    for name in CHECKS:
        vs = [r["checks"][name] for r in rep["ranks"]]
        got = {v["verdict"] for v in vs}
        verdict = "FAIL" if "FAIL" in got or not vs else "SKIP" if got == {"SKIP"} else "PASS"
        out[name] = {
            "verdict": verdict,
            "detail": "; ".join(
                f"rank {r['rank']}: {r['checks'][name]['detail']}" for r in rep["ranks"]
            ),
        }
    return out


def _f(v: Any, nd: int = 3) -> str:
    return fmt(v, nd)


def summary_md(rep: Mapping[str, Any]) -> str:
    dev, t, mdl = rep["device"], rep["timings_s"], rep["model"]
    out = [
        f"# gpuprof comm-timing check: {rep['mode']} on {dev['name']} x "
        f"{rep['world_size']} ({rep['backend']})",
        "",
    ]
    if rep["mode"] == "dry-run":
        out += [
            "Dry run: gloo ranks on the CPU. It checks the plumbing (daemon, torchrun, comm "
            "hook, stored rows and offsets, torch.profiler window, overhead blocks); there "
            "are no NCCL kernels to compare with.",
            "",
        ]
    hook = {
        "default": "gpuprof's own hook (DDP's default all-reduce, a sum)",
        "avg": "a user hook averaging the bucket (NCCL: ReduceOp.AVG) registered inside "
        "the profile and wrapped by gpuprof (`--hook auto` picks it on one NCCL rank: "
        "an in-place sum there runs no kernel)",
    }.get(rep["hook"], rep["hook"])
    out.append(
        f"{rep['created_utc']}; torch {dev['torch']}, CUDA {dev['cuda']}, NCCL "
        f"{dev['nccl']}. DDP of {mdl['layers']} x Linear({mdl['d']}, {mdl['d']}) "
        f"({mdl['param_bytes']} parameter bytes), batch {mdl['batch']}, bucket cap "
        f"{mdl['bucket_cap_mb']} MB; {rep['steps']} steps under `gpuprof.profile`, "
        f"torch.profiler over steps {rep['window'][0]}-{rep['window'][1] - 1}; "
        f"buckets through {hook}."
    )
    out.append(
        f"`import torch` {_f(t['import_torch'], 2)} s, process group "
        f"{_f(t['init_process_group'], 2)} s, main run {_f(t['main_run'], 2)} s, "
        f"torchrun job {_f(t['torchrun_job'], 1)} s, whole check "
        f"{_f(t['total_wall'], 1)} s; peak GPU memory {_f(rep['peak_allocated_gb'], 2)} GB."
    )
    out += [
        "",
        "| rank | buckets/step | bytes/step | event ms (median) | window: event / "
        "kernel ms, ratio | unresolved | comm phase ms / step ms | clock offset ± unc. µs "
        "| step ms off / on (ratio) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["ranks"]:
        if "error" in r:
            out.append(f"| {r['rank']} | {r['error']} | | | | | | | |")
            continue
        b, wn, c, cl = r["buckets"], r["window"], r["comm_phase_ms"], r["clock"]
        ov = r.get("overhead") or {}
        off = cl["clock_offset_ns"]
        clk = (
            "n/a"
            if off is None
            else f"{off / 1e3:.1f} ± {(cl['clock_uncertainty_ns'] or 0) / 1e3:.1f}"
        )
        out.append(
            f"| {r['rank']} | {b['per_step']} ({b['steps_complete']}/{b['steps_analysed']} "
            f"steps complete) | {', '.join(map(str, r['bytes_per_step'])) or 'n/a'} "
            f"| {_f(r['event_ms']['median'])} | {_f(wn['event_ms_median'])} / "
            f"{_f(wn['kernel_ms_median'])}, {_f(wn['ratio_median'])} ({wn['pairs']} pairs) "
            f"| {r['unresolved']['from_notes']} of {r['unresolved']['records']} "
            f"| {_f(c['median'])} / {_f(c['median_step_ms'])} | {clk} "
            f"| {_f(ov.get('step_ms_off'))} / {_f(ov.get('step_ms_on'))} "
            f"({_f(ov.get('ratio'))}) |"
        )
    for r in rep["ranks"]:
        bb = (r.get("window") or {}).get("by_bucket") or {}
        if bb:
            out += [
                "",
                f"Rank {r['rank']}, event/kernel by bucket index (median ratio, median "
                f"excess µs): "
                + "; ".join(
                    f"{j}: {_f(v['ratio_median'], 2)}x, {_f(v['excess_us_median'], 1)}"
                    for j, v in bb.items()
                )
                + ".",
            ]
    names = {r0 for r in rep["ranks"] for r0 in (r.get("window") or {}).get("kernel_names", [])}
    if names:
        out += [
            "",
            "Collective kernels in the window: " + "; ".join(f"`{n}`" for n in sorted(names)) + ".",
        ]
    out += ["", "## Verdicts", "", "| check | verdict | detail |", "|---|---|---|"]
    for name, v in rep["verdicts"].items():
        out.append(f"| {name} | {v['verdict']} | {v['detail']} |")
    out += errors_md(rep)
    if rep["mode"] == "dry-run":
        out += plumbing_md(rep["plumbing"])
    else:
        bad = [k for k, v in rep["verdicts"].items() if v["verdict"] == "FAIL"]
        out += [
            "",
            "**All verdicts PASS (SKIP: see why).**"
            if rep["all_pass"]
            else "**FAIL:** " + ", ".join(bad + (["errors"] if rep.get("errors") else [])),
        ]
    return "\n".join(out) + "\n"


def write_report(rep: dict[str, Any], out_dir: Path) -> str:
    rep["verdicts"] = verdicts(rep)
    rep["plumbing"] = plumbing_checks(rep)
    # a SKIP says why (one rank: no offset to store); only a FAIL fails
    rep["all_pass"] = (
        not rep["errors"]
        and bool(rep["ranks"])
        and all(v["verdict"] != "FAIL" for v in rep["verdicts"].values())
    )
    return save_report(rep, out_dir, summary_md(rep))


def _window(text: str) -> tuple[int, int]:
    a, _, b = text.partition("-")
    lo, hi = int(a), int(b) + 1
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"bad window {text!r} (FIRST-LAST)")
    return lo, hi


def main(argv: Sequence[str] | None = None) -> int:
    ap = check_parser(__doc__, DEFAULT_OUT, "--_worker")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="the plumbing on the CPU: gloo, 2 ranks (NCCL comparison skipped)",
    )
    ap.add_argument(
        "--nproc", type=int, default=None, help="ranks (default: the visible GPUs; dry run 2)"
    )
    ap.add_argument("--steps", type=int, default=60, help="profiled steps of the main run")
    ap.add_argument(
        "--window",
        type=_window,
        default=None,
        help="main-run steps under torch.profiler, FIRST-LAST (default 40-47)",
    )
    ap.add_argument("--layers", type=int, default=6, help="Linear layers (one bucket each)")
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved overhead rounds (live 6, dry run 2)"
    )
    ap.add_argument(
        "--block-steps",
        type=int,
        default=None,
        help="steps per overhead block (live 40, dry run 10)",
    )
    ap.add_argument(
        "--sync-every", type=int, default=10, help="loss.item() every N steps outside the window"
    )
    ap.add_argument(
        "--hook",
        choices=("auto", "default", "avg"),
        default="auto",
        help="auto: gpuprof's default hook; a ReduceOp.AVG user hook on one NCCL rank",
    )
    ap.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="the torchrun job's limit, s (live 420, dry run 150)",
    )
    args = ap.parse_args(argv)
    dry = args.dry_run
    args.window = args.window or (40, 48)
    args.rounds = args.rounds or (2 if dry else 6)
    args.block_steps = args.block_steps or (10 if dry else 40)
    args.timeout_s = args.timeout_s or CHILD_TIMEOUT_S["dry" if dry else "live"]
    if args.window[1] > args.steps:
        ap.error(f"--window must end before --steps ({args.steps})")
    if args._worker:
        return worker_main(args)
    return dry_run_check("gpu_check_comm", args, run, write_report, DEFAULT_OUT, "all_pass")


if __name__ == "__main__":
    script_main(main)
