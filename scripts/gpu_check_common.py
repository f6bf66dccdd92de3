"""What the prepared real-GPU checks (``scripts/gpu_check*.py``) share: the
repository on ``sys.path``, the children's environment, stopping a gpuprofd,
the report's files and closing lines, and ``main``'s run-and-report tail.

The checks run as ``python3 scripts/X.py`` on a bare GPU node (its own
python, no install): ``scripts/`` is then on ``sys.path`` as the script's own
folder, which is how they import this module. Importing it puts gpuprofd, the
shim and gpuprof (and ``tests/``) of this checkout on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The checkout's import roots, first on ``sys.path`` and on the children's ``PYTHONPATH``.
PATHS = [str(ROOT / "daemon"), str(ROOT / "shim"), str(ROOT)]
for _p in reversed(PATHS):
    if _p not in sys.path:
        sys.path.insert(0, _p)


class NoGpu(Exception):
    """Live mode cannot run here (no CUDA, no NVML): exit 2 with this message."""


def no_cuda(torch: Any) -> str:
    """Why live mode cannot run: *torch* sees no CUDA device."""
    return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"


def start_cuda(torch: Any) -> tuple[Any, float]:
    """Initialise CUDA on the current device (a first kernel, synced): the
    device and the seconds it took."""
    t = time.perf_counter()
    torch.cuda.init()
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.ones(1, device=dev).add_(1)
    torch.cuda.synchronize(dev)
    return dev, time.perf_counter() - t


def child_env(sock: Path, db: Path, one_thread: bool = False) -> dict[str, str]:
    """This environment for a child that talks to the gpuprofd on *sock* (database
    *db*): the checkout first on ``PYTHONPATH``, unbuffered output, NVML as the
    daemon finds it; *one_thread*: ``OMP_NUM_THREADS=1`` (a dry run's CPU ranks)."""
    env = dict(os.environ)
    env.update(
        GPUPROF_SOCKET=str(sock),
        GPUPROF_DB=str(db),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            PATHS + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    if one_thread:
        env["OMP_NUM_THREADS"] = "1"
    env.pop("GPUPROF_NVML", None)
    return env


def stop_daemon(proc: subprocess.Popen) -> None:
    """SIGTERM (the daemon flushes its store and exits), SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def fmt(v: Any, nd: int = 1, pct: bool = False) -> str:
    """*v* for a report: ``n/a`` for None, a float to *nd* places (*pct*: as a percentage)."""
    if v is None:
        return "n/a"
    if pct:
        return f"{100 * v:.{nd}f} %"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def errors_md(rep: Mapping[str, Any]) -> list[str]:
    """The summary's errors line, if the report has errors."""
    return ["", "**Errors:** " + "; ".join(rep["errors"])] if rep.get("errors") else []


def plumbing_md(plumbing: Mapping[str, bool]) -> list[str]:
    """A dry run's closing line: every part ran, or the parts that did not."""
    bad = [k for k, ok in plumbing.items() if not ok]
    return [
        "",
        "**Plumbing OK: every part ran.**" if not bad else f"**Plumbing FAILED:** {', '.join(bad)}",
    ]


def save_report(rep: Mapping[str, Any], out_dir: Path, md: str) -> str:
    """Write report.json and report.md (*md*) to *out_dir*; return *md*."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    (out_dir / "report.md").write_text(md)
    return md


def add_out_option(ap: argparse.ArgumentParser, default_out: Path, temporary_for: str) -> None:
    """``--out DIR``: *default_out* for a live run, a temporary folder for *temporary_for*."""
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"report folder (default: {default_out.relative_to(ROOT)} for a live "
        f"run; a temporary folder for {temporary_for})",
    )


def check_parser(doc: str | None, default_out: Path, child_flag: str) -> argparse.ArgumentParser:
    """A ``--dry-run`` check's parser: described by *doc*'s first paragraph,
    with ``--out`` (:func:`add_out_option`) and the hidden options of the
    script run as its own child: *child_flag* (it is the child), ``--_result``,
    ``--_sock`` and ``--_db``."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    add_out_option(ap, default_out, "--dry-run")
    ap.add_argument(child_flag, action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--_result", "--_sock", "--_db"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    return ap


def dry_run_check(
    name: str,
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    write_report: Callable[[dict[str, Any], Path], str],
    default_out: Path,
    live_pass: str,
) -> int:
    """:func:`run_and_report` for a check with ``--dry-run``: its report in
    ``--out``, else *default_out* (live) or a temporary folder (dry run); a
    dry run passes when its plumbing did, a live one on ``rep[live_pass]``."""
    dry = args.dry_run
    return run_and_report(
        name,
        lambda: run(args),
        write_report,
        report_dir(name, args.out, default_out, dry),
        lambda rep: all(rep["plumbing"].values()) if dry else rep[live_pass],
    )


def report_dir(name: str, out: Path | None, default_out: Path, temporary: bool) -> Path:
    """*out* if given, else a temporary folder (``gpuprof-NAME``) or *default_out*."""
    if out is not None:
        return out
    return (
        Path(tempfile.gettempdir()) / f"gpuprof-{name.replace('_', '-')}"
        if temporary
        else default_out
    )


def run_and_report(
    name: str,
    run: Callable[[], dict[str, Any]],
    write_report: Callable[[dict[str, Any], Path], str],
    out: Path,
    passed: Callable[[dict[str, Any]], bool],
    needs: str = "a CUDA GPU",
    instead: str = "use --dry-run to check the plumbing on the CPU",
) -> int:
    """``main``'s tail: *run* the check, write its report to *out*, print the
    summary; the exit status. 2 (one line on stderr) when live mode *needs*
    what this machine lacks (:class:`NoGpu`), 1 when the run failed
    (``RuntimeError``: nothing to judge) or the report is not *passed*."""
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        rep = run()
    except NoGpu as exc:
        print(f"{name}: live mode needs {needs}: {exc} ({instead})", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"{name}: failed: {exc}", file=sys.stderr)
        return 1
    rep = {"created_utc": created, **rep}
    md = write_report(rep, out)
    print(md, end="")
    print(f"{name}: report in {out}", file=sys.stderr)
    return 0 if passed(rep) else 1


def script_main(main: Callable[[], int]) -> None:
    """Run a check's *main* as a script (unbuffered output for its children) and exit."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
