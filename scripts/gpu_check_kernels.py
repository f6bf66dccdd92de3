"""The prepared real-GPU check of kernels, FLOPs, MFU and trace overhead.

Live mode (default; needs CUDA) trains the fixture GPT of
``tests/fixtures/h200/steps.json`` (B=8, T=1024, d=1024, 4 layers, 16
heads, vocab 8192; a compact nanoGPT-like model defined here) in bf16
autocast, in a child process, with a real gpuprofd that ``gpuprof.profile()``
starts itself (its own temporary ``GPUPROF_DB`` and socket directory):

1. **Variants.** ``--steps`` (:data:`LIVE_STEPS`) steps with fused attention
   (``F.scaled_dot_product_attention``) and ``--steps`` with hand-written
   attention (``softmax(QKᵀ/√dh)`` with ``masked_fill``, then ``@ V``), each
   under ``profile(arch=TransformerArch(...), trace_every_n_steps=20,
   continuous_traces_hz=1)``. Per variant the report gives MFU and achieved
   TFLOP/s from gpuprof (the run's summary and ``gpuprofctl runs --format
   json``) beside the hand computation: arch FLOP per step / the median of
   this script's own per-step wall times (ms; each step ends with
   ``loss.item()``, a sync; warm-up and gpuprof-traced steps left out) / the
   GPU's dense bf16 peak from :mod:`gpuprof.gpus` (with its datasheet
   source); the rules that fired (summary and ``gpuprofctl insights``); the
   top kernels from ``gpuprofctl kernels --format json``.
2. **Overhead.** The fused variant's loop in blocks of ``--overhead-steps``
   steps: without gpuprof, under ``profile()`` with no tracing, with
   ``trace_every_n_steps=20``, with ``continuous_traces_hz=1``; the modes
   interleaved, ``--rounds`` rounds, the median block per mode; ratios of
   whole-loop time (traced steps included) to the untraced ``profile()`` and
   to no gpuprof at all.

Verdicts (live): each variant counted every step, MFU is known, gpuprof's
MFU agrees with the hand computation within :data:`MFU_TOLERANCE`, kernel
windows were stored, ``dataloader_stall`` does not fire (the loop has no loader;
its ``loss.item()`` waits on the GPU), and ``sdpa_suboptimal`` fires for the hand-written
attention and not for SDPA. The overhead ratios are reported, not judged.

``--dry-run`` runs the same plumbing on the CPU with a tiny GPT and few
steps (daemon, profile, trace windows, gpuprofctl, report); its verdicts are
not judged (MFU is unknown on a CPU, with the reason): exit 0 if every part
ran. That is how CI tests this script.

Writes ``report.json`` and ``report.md`` to ``--out`` (default
``bench/results/gpu_check_kernels/`` for a live run; a temporary folder for
``--dry-run``) and prints the summary. Exit status: 0 every verdict matches
(dry run: every part ran), 1 a mismatch or a failed run, 2 live mode without
CUDA (one line on stderr). Never changes GPU settings; the child frees its
GPU memory after each part and exits at the end; the daemon it started is
stopped. Live: about a minute on an H200, ``import torch`` and CUDA's
initialisation included.

    python scripts/gpu_check_kernels.py [--steps 100] [--out DIR]
    python scripts/gpu_check_kernels.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_check_common import (
    ROOT,
    NoGpu,
    check_parser,
    child_env,
    dry_run_check,
    errors_md,
    no_cuda,
    plumbing_md,
    save_report,
    script_main,
    start_cuda,
    stop_daemon,
)
from gpu_check_common import fmt as _f

from gpuprof.flops import TransformerArch
from gpuprof.gpus import find_gpu, peak_tflops

DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check_kernels"
#: The fixture GPT (steps.json): batch, seq, d_model, layers, heads, vocab.
LIVE_SHAPE = {"batch": 8, "seq": 1024, "d": 1024, "layers": 4, "heads": 16, "vocab": 8192}
#: The dry run's GPT: the same shape scaled down to a few ms per CPU step.
DRY_SHAPE = {"batch": 2, "seq": 32, "d": 64, "layers": 2, "heads": 4, "vocab": 128}
#: gpuprof's MFU and the hand computation share the FLOP figure, so they
#: differ only by step time (gpuprof's median iteration: loader wait + step,
#: its own warm-up and traced steps left out, vs this script's wall time per
#: step): 10 % relative.
MFU_TOLERANCE = 0.10
#: Profiled steps per variant, live: 6 s and 16 s of training. gpuprofd keeps
#: NVML per second, so a run's first and last second hold idle time from
#: before and after it; 100 steps (1-2.6 s) read the busy GPU ~60 % used.
LIVE_STEPS = 600
#: Steps before timing starts: cuBLAS/cuDNN choose kernels, the allocator
#: settles (outside profile(); gpuprof's own warm-up rule applies inside).
WARMUP_OUTSIDE = 3
#: Steps left out of this script's own median at the start of a profiled run.
HAND_SKIP = 10
#: Where :mod:`gpuprof.gpus` takes the H200's dense peaks from.
PEAK_SOURCE = (
    "gpuprof.gpus: NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: same SMs and "
    "clocks as the H100 SXM5; dense = half the printed 'with sparsity' figure)"
)
TRACE_OPTS: dict[str, Any] = {"trace_every_n_steps": 20, "continuous_traces_hz": 1.0}
OVERHEAD_MODES: dict[str, dict[str, Any] | None] = {
    "no gpuprof": None,
    "profile(), no tracing": {},
    "trace_every_n_steps=20": {"trace_every_n_steps": 20},
    "continuous_traces_hz=1": {"continuous_traces_hz": 1.0},
}
CHILD_TIMEOUT_S = {"live": 280.0, "dry": 150.0}


# --- the child: torch, the model, the runs ----------------------------------------


def _build(torch: Any, shape: Mapping[str, int], sdpa: bool, dev: Any) -> Any:
    """A nanoGPT-like GPT (pre-norm blocks, causal attention, untied LM head)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):  # type: ignore[misc]
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def attend(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # hand-written: QKᵀ/√dh, causal mask, softmax, @V
                att = (q @ k.transpose(-2, -1)) * (k.size(-1) ** -0.5)
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

        def forward(self, x: Any) -> Any:
            x = x + self.attend(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            d = shape["d"]
            self.wte, self.wpe = nn.Embedding(shape["vocab"], d), nn.Embedding(shape["seq"], d)
            self.blocks = nn.ModuleList(Block(d, shape["heads"]) for _ in range(shape["layers"]))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, shape["vocab"], bias=False)

        def forward(self, idx: Any) -> Any:
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return GPT().to(dev)


def _arch(shape: Mapping[str, int]) -> TransformerArch:
    return TransformerArch(
        layers=shape["layers"],
        d_model=shape["d"],
        heads=shape["heads"],
        seq_len=shape["seq"],
        vocab=shape["vocab"],
    )


class Trainer:
    """One model and optimizer; :meth:`run` times *n* training steps (s each)."""

    def __init__(self, torch: Any, shape: Mapping[str, int], sdpa: bool, dev: Any) -> None:
        self.torch, self.shape, self.dev = torch, shape, dev
        self.model = _build(torch, shape, sdpa, dev)
        cuda = dev.type == "cuda"
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=3e-4, **({"fused": True} if cuda else {})
        )
        self.dtype = torch.bfloat16

    def step(self) -> float:
        """One next-token step on random tokens; returns the loss (a sync)."""
        torch, s = self.torch, self.shape
        idx = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=self.dev)
        with torch.autocast(self.dev.type, dtype=self.dtype):
            logits = self.model(idx)
            loss = torch.nn.functional.cross_entropy(
                logits.view(-1, s["vocab"]).float(), idx.roll(-1, 1).view(-1)
            )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def run(self, n: int, windows: Callable[[], int] | None = None) -> tuple[list[float], set[int]]:
        """Wall seconds of each of *n* steps, and the steps a gpuprof profiler
        window overlapped: *windows* counts the windows closed so far; a
        window covers one gpuprof step, which ends at ``opt.step()``, so it
        overlaps the step it closed in and the one before (whose
        ``loss.item()`` falls inside it)."""
        out: list[float] = []
        traced: set[int] = set()
        seen = windows() if windows else 0
        for i in range(n):
            t = time.perf_counter()
            self.step()
            out.append(time.perf_counter() - t)
            if windows is not None and (now := windows()) != seen:
                seen = now
                traced.update((i - 1, i))
        return out, traced

    def close(self) -> None:
        del self.model, self.opt
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)
            self.torch.cuda.empty_cache()


def _profile_kw(sock: Path, db: Path) -> dict[str, Any]:
    return {"socket_dir": sock, "db": db, "print_summary": False}


def _window_count(prof: Any) -> Callable[[], int]:
    """Profiler windows *prof* has closed so far (its tracer's counter)."""
    return lambda: int(getattr(getattr(prof, "_tracer", None), "windows", 0) or 0)


def run_variant(
    torch: Any, dev: Any, shape: Mapping[str, int], sdpa: bool, steps: int, sock: Path, db: Path
) -> dict[str, Any]:
    """Train one attention variant under profile(arch=..., trace options)."""
    import gpuprof

    name = "sdpa" if sdpa else "math"
    tr = Trainer(torch, shape, sdpa, dev)
    try:
        tr.run(WARMUP_OUTSIDE)
        arch = _arch(shape)
        tokens = shape["batch"] * shape["seq"]
        t0 = time.perf_counter()
        with gpuprof.profile(
            f"gpu_check_kernels:{name}",
            arch=arch,
            tokens_per_step=tokens,
            **TRACE_OPTS,
            **_profile_kw(sock, db),
        ) as prof:
            times, traced = tr.run(steps, _window_count(prof))
        wall = time.perf_counter() - t0
    finally:
        tr.close()
    kept = [t for i, t in enumerate(times) if i >= min(HAND_SKIP, steps // 2) and i not in traced]
    summary = prof.summary or {}
    return {
        "variant": name,
        "attention": "F.scaled_dot_product_attention"
        if sdpa
        else "softmax(QK^T) V with masked_fill",
        "steps_run": steps,
        "profiled_wall_s": round(wall, 3),
        "step_ms": [round(t * 1e3, 3) for t in times],
        "traced_steps": sorted(t for t in traced if t >= 0),
        "hand_median_step_ms": round(statistics.median(kept) * 1e3, 4) if kept else None,
        "hand_steps_used": len(kept),
        "flops_per_step": arch.flops_per_step(tokens),
        "summary": summary,
    }


def run_overhead(
    torch: Any, dev: Any, shape: Mapping[str, int], steps: int, rounds: int, sock: Path, db: Path
) -> dict[str, Any]:
    """The fused loop in interleaved blocks of each trace mode; whole-loop times."""
    import gpuprof

    tr = Trainer(torch, shape, True, dev)
    blocks: dict[str, list[float]] = {m: [] for m in OVERHEAD_MODES}
    windows: dict[str, list[int]] = {m: [] for m in OVERHEAD_MODES}
    try:
        tr.run(WARMUP_OUTSIDE)
        for r in range(rounds):
            for mode, opts in OVERHEAD_MODES.items():
                if opts is None:
                    t = time.perf_counter()
                    tr.run(steps)
                    blocks[mode].append(time.perf_counter() - t)
                    continue
                with gpuprof.profile(
                    f"gpu_check_kernels:overhead:{mode}:r{r}",
                    count_flops=False,
                    **opts,
                    **_profile_kw(sock, db),
                ) as prof:
                    t = time.perf_counter()
                    tr.run(steps)
                    blocks[mode].append(time.perf_counter() - t)
                tracer = getattr(prof, "_tracer", None)
                windows[mode].append(int(getattr(tracer, "windows", 0) or 0))
    finally:
        tr.close()
    med = {m: statistics.median(v) for m, v in blocks.items()}
    base, none = med["profile(), no tracing"], med["no gpuprof"]
    modes = []
    for m in OVERHEAD_MODES:
        modes.append(
            {
                "mode": m,
                "block_s": [round(x, 4) for x in blocks[m]],
                "median_block_s": round(med[m], 4),
                "step_ms": round(med[m] / steps * 1e3, 4),
                "ratio_vs_profile": round(med[m] / base, 4),
                "ratio_vs_no_gpuprof": round(med[m] / none, 4),
                "windows_per_block": windows[m] or None,
            }
        )
    return {"steps_per_block": steps, "rounds": rounds, "modes": modes}


def _emit(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, default=str))


def child_main(args: argparse.Namespace) -> int:
    """The training process: everything that needs torch. Writes its result
    (JSON) to ``--_result``; a missing CUDA is ``{"no_cuda": why}``, exit 2."""
    import logging

    result = Path(args._result)
    t = time.perf_counter()
    import torch

    import_s = time.perf_counter() - t
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "import_torch_s": round(import_s, 3),
    }
    if args.dry_run:
        dev = torch.device("cpu")
        torch.set_num_threads(1)
        info.update(device_name="CPU (dry run)", cuda_init_s=0.0)
        shape = DRY_SHAPE
    elif not torch.cuda.is_available():
        _emit(result, {"no_cuda": no_cuda(torch)})
        return 2
    else:
        dev, init_s = start_cuda(torch)
        info["cuda_init_s"] = round(init_s, 3)
        info["device_name"] = torch.cuda.get_device_name(dev)
        shape = LIVE_SHAPE
    logging.getLogger("gpuprof").setLevel(logging.WARNING)
    sock, db = Path(args._sock), Path(args._db)
    out: dict[str, Any] = {"env": info, "shape": shape, "variants": [], "errors": []}
    t_runs = time.perf_counter()
    try:
        for sdpa in (True, False):
            out["variants"].append(run_variant(torch, dev, shape, sdpa, args.steps, sock, db))
        out["overhead"] = run_overhead(
            torch, dev, shape, args.overhead_steps, args.rounds, sock, db
        )
    except Exception as exc:  # noqa: BLE001 - reported, judged as a failed part
        out["errors"].append(f"{exc.__class__.__name__}: {exc}")
    finally:
        out["env"]["runs_wall_s"] = round(time.perf_counter() - t_runs, 2)
        out["env"]["peak_allocated_gb"] = (
            round(torch.cuda.max_memory_allocated(dev) / 1e9, 2) if dev.type == "cuda" else None
        )
        out["daemon_pids"] = _stop_daemons()
        _emit(result, out)
    return 0


def _stop_daemons() -> list[int]:
    """Stop the gpuprofd this process started (SIGTERM: it flushes and exits)."""
    from gpuprof_shim.autostart import spawned_processes

    pids = []
    for p in spawned_processes():
        pids.append(p.pid)
        stop_daemon(p)
    return pids


# --- the parent: gpuprofctl, the verdicts, the report ---------------------------------


def ctl(env: Mapping[str, str], *args: str) -> Any:
    """``gpuprofctl ARGS --format json``, parsed; ``{"error": ...}`` if it failed."""
    cmd = [sys.executable, "-m", "gpuprofd.ctl", *args, "--format", "json"]
    proc = subprocess.run(cmd, env=dict(env), capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return {
            "error": f"gpuprofctl {' '.join(args)}: exit {proc.returncode}: "
            f"{proc.stderr.strip()[-400:]}"
        }
    return json.loads(proc.stdout)


def _rules(insights: Any) -> list[str]:
    if isinstance(insights, Mapping):
        insights = insights.get("insights") or []
    return sorted({i["rule"] for i in insights or [] if isinstance(i, Mapping) and "rule" in i})


def assess_variant(
    v: dict[str, Any],
    runs: list[dict[str, Any]],
    env: Mapping[str, str],
    device_name: str | None,
    live: bool,
    top: int,
) -> dict[str, Any]:
    """gpuprof's figures for one variant beside the hand computation, and its verdicts."""
    s = v.pop("summary")
    run_id = s.get("run_id")
    row = next((r for r in runs if r.get("id") == run_id), {})
    db = str(env["GPUPROF_DB"])
    none: dict[str, Any] = {"error": "the run has no id (gpuprofd did not answer)"}
    kernels = ctl(env, "kernels", db, str(run_id)) if run_id else none
    snap = ctl(env, "kernels", db, str(run_id), "--source", "snapshot") if run_id else none
    ins = ctl(env, "insights", db, str(run_id)) if run_id else none
    peak = peak_tflops(device_name, "bf16")
    hand_ms = v["hand_median_step_ms"]
    hand_tflops = v["flops_per_step"] / (hand_ms / 1e3) / 1e12 if hand_ms else None
    hand_mfu = hand_tflops / peak if hand_tflops is not None and peak else None
    compute = s.get("compute") or {}
    g_mfu = s.get("mfu")
    rel = abs(g_mfu - hand_mfu) / hand_mfu if g_mfu is not None and hand_mfu else None
    fired_summary, fired_ctl = _rules(s.get("insights")), _rules(ins)
    want = v["variant"] == "math"
    windows_stored = (
        (kernels.get("windows") or 0) + (snap.get("windows") or 0)
        if isinstance(kernels, Mapping)
        else 0
    )
    checks = {
        "steps_counted": s.get("steps") == v["steps_run"] and row.get("steps") == v["steps_run"],
        "trace_windows_stored": windows_stored > 0 and not kernels.get("error"),
        "mfu_known": g_mfu is not None,
        "mfu_agrees": rel is not None and rel <= MFU_TOLERANCE,
        "sdpa_suboptimal": ("sdpa_suboptimal" in fired_summary) == want
        and ("sdpa_suboptimal" in fired_ctl) == want,
        # no loader in this loop: its loss.item() waits between the steps on a busy GPU
        "no_loader_stall": "dataloader_stall" not in fired_summary + fired_ctl,
    }
    found = ins.get("insights") if isinstance(ins, Mapping) else ins
    findings = [
        {k: i.get(k) for k in ("rule", "severity", "title", "evidence")}
        for i in found or []
        if isinstance(i, Mapping)
    ]
    return {
        **{
            k: v[k]
            for k in (
                "variant",
                "attention",
                "steps_run",
                "profiled_wall_s",
                "traced_steps",
                "flops_per_step",
            )
        },
        "run_id": run_id,
        "gpuprof": {
            "steps": s.get("steps"),
            "median_step_ms": s.get("median_step_ms"),
            "mfu": g_mfu,
            "achieved_tflops": s.get("achieved_tflops"),
            "peak_tflops": compute.get("peak_tflops"),
            "dtype": compute.get("dtype"),
            "mfu_unknown": compute.get("mfu_unknown"),
            "runs_json": {
                k: row.get(k) for k in ("steps", "median_step_ms", "mfu", "achieved_tflops")
            },
        },
        "hand": {
            "median_step_ms": hand_ms,
            "steps_used": v["hand_steps_used"],
            "achieved_tflops": round(hand_tflops, 2) if hand_tflops is not None else None,
            "peak_tflops": peak,
            "peak_source": PEAK_SOURCE if peak else None,
            "gpu_row": getattr(find_gpu(device_name), "name", None),
            "mfu": round(hand_mfu, 4) if hand_mfu is not None else None,
            "mfu_unknown": None
            if hand_mfu is not None
            else f"no dense bf16 peak for {device_name!r} in gpuprof.gpus",
        },
        "mfu_rel_diff": round(rel, 4) if rel is not None else None,
        "rules_fired": fired_summary,
        "rules_fired_ctl": fired_ctl,
        "findings": findings,
        "sdpa_suboptimal_expected": want,
        "kernels": {
            k: kernels.get(k) for k in ("source", "windows", "steps", "total_ms", "of", "error")
        }
        if isinstance(kernels, Mapping)
        else {},
        "snapshot_windows": snap.get("windows") if isinstance(snap, Mapping) else None,
        "top_kernels": [
            {k: r.get(k) for k in ("name", "cls", "share", "count", "mean_us", "per_step_ms")}
            for r in (kernels.get("kernels") or [])[:top]
        ],
        "step_ms_series": v["step_ms"],
        "checks": checks,
        "match": all(checks.values()) if live else None,
    }


def plumbing_checks(rep: Mapping[str, Any]) -> dict[str, bool]:
    """A dry run's pass: every part ran and left data behind."""
    vs = rep.get("variants") or []
    ov = rep.get("overhead") or {}
    return {
        "no_errors": not rep.get("errors"),
        "both_variants": [v["variant"] for v in vs] == ["sdpa", "math"],
        "steps_counted": bool(vs) and all(v["checks"]["steps_counted"] for v in vs),
        "trace_windows_stored": bool(vs) and all(v["checks"]["trace_windows_stored"] for v in vs),
        "rules_read": bool(vs) and all("rules_fired_ctl" in v for v in vs),
        "overhead_modes": len(ov.get("modes") or []) == len(OVERHEAD_MODES),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the child, wait for it, read the database; the report's content."""
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gpck", dir="/tmp"))  # short: a Unix socket path
    sock, db, result = tmp / "s", tmp / "gpuprof.db", tmp / "child.json"
    env = child_env(sock, db)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_child",
        "--_result",
        str(result),
        "--_sock",
        str(sock),
        "--_db",
        str(db),
        "--steps",
        str(args.steps),
        "--overhead-steps",
        str(args.overhead_steps),
        "--rounds",
        str(args.rounds),
    ]
    cmd += ["--dry-run"] * args.dry_run
    try:
        try:
            proc = subprocess.run(cmd, env=env, cwd=tmp, timeout=args.timeout_s, stdout=sys.stderr)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
        child: dict[str, Any] = json.loads(result.read_text()) if result.exists() else {}
        if "no_cuda" in child:
            raise NoGpu(child["no_cuda"])
        if not child:
            raise RuntimeError(
                f"the training process left no result (exit {rc}; timeout {args.timeout_s:g} s)"
                if rc is None
                else f"the training process left no result (exit {rc})"
            )
        live = not args.dry_run
        runs = ctl(env, "runs", str(db))
        runs = runs if isinstance(runs, list) else []
        dev_name = child["env"].get("device_name")
        variants = [
            assess_variant(v, runs, env, dev_name, live, args.top)
            for v in child.get("variants", [])
        ]
        errors = list(child.get("errors", []))
        if rc not in (0, None):
            errors.append(f"the training process exited {rc}")
        return {
            "mode": "dry-run" if args.dry_run else "live",
            "device": {
                "name": child["env"].get("device_name"),
                "torch": child["env"]["torch"],
                "cuda": child["env"]["cuda"],
            },
            "shape": child["shape"],
            "arch": _arch(child["shape"]).to_dict(),
            "trace_options": TRACE_OPTS,
            "mfu_tolerance": MFU_TOLERANCE,
            "timings_s": {
                "import_torch": child["env"]["import_torch_s"],
                "cuda_init": child["env"]["cuda_init_s"],
                "runs": child["env"].get("runs_wall_s"),
                "total_wall": round(time.monotonic() - t_start, 2),
            },
            "peak_allocated_gb": child["env"].get("peak_allocated_gb"),
            "variants": variants,
            "overhead": child.get("overhead"),
            "runs_in_db": len(runs),
            "daemon_pids_stopped": child.get("daemon_pids"),
            "errors": errors,
        }
    finally:
        _stop_leftover_daemon(sock)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_leftover_daemon(sock: Path) -> None:
    """SIGTERM the gpuprofd still holding *sock*'s instance lock (the child
    started it; a child killed at its timeout could not stop it itself)."""
    import fcntl
    import signal

    from gpuprof.config import LOCK_NAME

    path = sock / LOCK_NAME
    if not path.exists():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return  # nobody holds it: the daemon is gone
        except OSError:
            pass
        pid = int(path.read_text().strip() or 0)
        if pid > 0:
            os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    finally:
        os.close(fd)


# --- report --------------------------------------------------------------------------


def summary_md(rep: Mapping[str, Any]) -> str:
    """The human summary (Markdown) of a report."""
    dev, t = rep["device"], rep["timings_s"]
    s = rep["shape"]
    out = [f"# gpuprof kernels/MFU check: {rep['mode']} on {dev['name']}", ""]
    if rep["mode"] == "dry-run":
        out += [
            "Dry run: a tiny GPT on the CPU. It checks the plumbing (daemon, profile, "
            "trace windows, gpuprofctl, report); its verdicts are not judged.",
            "",
        ]
    out.append(
        f"{rep['created_utc']}; torch {dev['torch']}, CUDA {dev['cuda']}. GPT: "
        f"B={s['batch']}, T={s['seq']}, d={s['d']}, {s['layers']} layers, "
        f"{s['heads']} heads, vocab {s['vocab']}; bf16 autocast; "
        f"`profile(trace_every_n_steps=20, continuous_traces_hz=1)`."
    )
    out.append(
        f"`import torch` {t['import_torch']:.2f} s, CUDA init {t['cuda_init']:.2f} s, "
        f"training runs {_f(t['runs'])} s, whole check {t['total_wall']:.1f} s; "
        f"peak GPU memory allocated {_f(rep['peak_allocated_gb'], 2)} GB."
    )
    out += [
        "",
        "## MFU: gpuprof vs hand computation",
        "",
        "| variant | steps (gpuprof) | median step ms gpuprof / hand | TFLOP/s gpuprof / "
        "hand | MFU gpuprof / hand | rel. diff | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in rep["variants"]:
        g, h = v["gpuprof"], v["hand"]
        out.append(
            f"| {v['variant']} | {v['steps_run']} ({_f(g['steps'])}) "
            f"| {_f(g['median_step_ms'], 2)} / {_f(h['median_step_ms'], 2)} "
            f"| {_f(g['achieved_tflops'])} / {_f(h['achieved_tflops'])} "
            f"| {_f(g['mfu'], 1, True)} / {_f(h['mfu'], 1, True)} "
            f"| {_f(v['mfu_rel_diff'], 1, True)} | {_verdict(v, rep['mode'])} |"
        )
    v0 = rep["variants"][0] if rep["variants"] else None
    if v0 is not None:
        h = v0["hand"]
        out += [
            "",
            f"Hand: arch FLOP per step {v0['flops_per_step']:.4g} "
            f"(`TransformerArch`) / median wall time per step (ms, each step ending in "
            f"`loss.item()`; first {HAND_SKIP} and traced steps left out) / "
            + (
                f"dense bf16 peak {h['peak_tflops']:g} TFLOP/s ({h['gpu_row']} row; "
                f"{h['peak_source']})."
                if h["peak_tflops"]
                else f"peak unknown: {h['mfu_unknown']}."
            ),
        ]
        if v0["gpuprof"]["mfu_unknown"]:
            out.append(f"gpuprof: MFU unknown: {v0['gpuprof']['mfu_unknown']}.")
    out += ["", "## Rules and kernels", ""]
    for v in rep["variants"]:
        want = "must fire" if v["sdpa_suboptimal_expected"] else "must not fire"
        out.append(
            f"**{v['variant']}** ({v['attention']}), run {v['run_id']}: rules fired "
            f"{', '.join(v['rules_fired']) or '-'} (gpuprofctl insights: "
            f"{', '.join(v['rules_fired_ctl']) or '-'}); sdpa_suboptimal {want}: "
            f"{_rule_verdict(v, rep['mode'])}; dataloader_stall must not fire (no loader; "
            f"loss.item() waits on the GPU): {_ok(v, 'no_loader_stall', rep['mode'])}. "
            "Kernel table: "
            f"{_f(v['kernels'].get('windows'))} {v['kernels'].get('source')} window(s), "
            f"{_f(v['snapshot_windows'])} snapshot window(s)."
        )
        if v["top_kernels"]:
            out += ["", "| share | count | mean µs | kernel |", "|---|---|---|---|"]
            for k in v["top_kernels"]:
                name = k["name"] if len(k["name"]) <= 90 else k["name"][:89] + "…"
                out.append(
                    f"| {_f(k['share'], 1, True)} | {k['count']} | {_f(k['mean_us'])} | `{name}` |"
                )
        out.append("")
    ov = rep.get("overhead")
    if ov:
        out += [
            "## Trace-mode overhead (fused variant)",
            "",
            f"{ov['rounds']} interleaved rounds of {ov['steps_per_block']} steps per mode; "
            "median block; whole-loop time, traced steps included.",
            "",
            "| mode | step ms | vs profile() | vs no gpuprof | windows per block |",
            "|---|---|---|---|---|",
        ]
        for m in ov["modes"]:
            w = m["windows_per_block"]
            out.append(
                f"| {m['mode']} | {m['step_ms']:.3f} | {m['ratio_vs_profile']:.3f}x "
                f"| {m['ratio_vs_no_gpuprof']:.3f}x | "
                f"{'-' if w is None else ', '.join(map(str, w))} |"
            )
    out += errors_md(rep)
    if rep["mode"] == "dry-run":
        out += plumbing_md(rep["plumbing"])
    else:
        bad = [
            f"{v['variant']}: {', '.join(k for k, ok in v['checks'].items() if not ok)}"
            for v in rep["variants"]
            if not v["match"]
        ]
        out += [
            "",
            "**All verdicts match.**"
            if rep["all_match"]
            else "**MISMATCH:** " + ("; ".join(bad) or "; ".join(rep.get("errors") or [])),
        ]
    return "\n".join(out) + "\n"


def _rule_verdict(v: Mapping[str, Any], mode: str) -> str:
    if mode == "dry-run":
        return "not judged (no device kernels on a CPU)"
    return "ok" if v["checks"]["sdpa_suboptimal"] else "MISMATCH"


def _ok(v: Mapping[str, Any], check: str, mode: str) -> str:
    if mode == "dry-run":
        return "not judged (a CPU has no NVML)"
    return "ok" if v["checks"][check] else "MISMATCH"


def _verdict(v: Mapping[str, Any], mode: str) -> str:
    if mode == "dry-run":
        return "not judged"
    return "match" if v["match"] else "MISMATCH"


def write_report(rep: dict[str, Any], out_dir: Path) -> str:
    """Write report.json and report.md to *out_dir*; return the summary."""
    rep["plumbing"] = plumbing_checks(rep)
    rep["all_match"] = (
        bool(rep["variants"])
        and all(v["match"] for v in rep["variants"])
        and not rep["errors"]
        and rep.get("overhead") is not None
    )
    return save_report(rep, out_dir, summary_md(rep))


def main(argv: Sequence[str] | None = None) -> int:
    ap = check_parser(__doc__, DEFAULT_OUT, "--_child")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="the plumbing on the CPU with a tiny GPT (verdicts not judged)",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"profiled steps per attention variant (live {LIVE_STEPS}, dry run 25)",
    )
    ap.add_argument(
        "--overhead-steps",
        type=int,
        default=None,
        help="steps per overhead block (live 150, dry run 25)",
    )
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved overhead rounds (live 3, dry run 2)"
    )
    ap.add_argument("--top", type=int, default=8, help="top kernels reported per variant")
    ap.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="the training process's limit, s (live 280, dry run 150)",
    )
    args = ap.parse_args(argv)
    dry = args.dry_run
    args.steps = args.steps or (25 if dry else LIVE_STEPS)
    args.overhead_steps = args.overhead_steps or (25 if dry else 150)
    args.rounds = args.rounds or (2 if dry else 3)
    args.timeout_s = args.timeout_s or CHILD_TIMEOUT_S["dry" if dry else "live"]
    if args._child:
        return child_main(args)
    return dry_run_check("gpu_check_kernels", args, run, write_report, DEFAULT_OUT, "all_match")


if __name__ == "__main__":
    script_main(main)
