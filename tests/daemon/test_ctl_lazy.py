"""gpuprofctl imports a command's module only when that command runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuprofd.storage import schema

PROBE = (
    "import sys\n"
    "from gpuprofd.ctl import main\n"
    "rc = main(sys.argv[1:])\n"
    "print('aiohttp' in sys.modules, 'gpuprofd.forward.client' in sys.modules)\n"
    "sys.exit(rc)\n"
)


def _loaded(*args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stdout.strip().splitlines()[-1]


def test_reading_runs_does_not_load_the_team_servers_client(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    schema.prepare(db)
    rc, loaded = _loaded("runs", str(db), "--format", "json")
    assert (rc, loaded) == (0, "False False")


def test_drain_loads_it_when_it_runs() -> None:
    rc, loaded = _loaded("drain", "--help")
    assert (rc, loaded) == (0, "True True")


def test_help_lists_every_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprofd.ctl", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    listed = {line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line}
    assert {"compare", "drain", "insights", "kernels", "nsys-import", "rollup", "runs"} <= listed
    assert {"status", "stop", "top", "version", "watch"} <= listed


def test_a_runs_report_does_not_load_what_only_charts_need(tmp_path: Path) -> None:
    """``gpuprofctl insights`` on a run computes its report without the
    modules only charts and the team server use (statistics brings decimal
    and fractions: milliseconds of every cold start)."""
    import sqlite3

    db = tmp_path / "g.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, start_mono_ns, end_mono_ns) "
        "VALUES (1, 'k', 'r', 'finished', 0, 2000000000)"
    )
    conn.execute(
        "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns) VALUES (1, 0, 0, 1000000, 0)"
    )
    conn.commit()
    conn.close()
    probe = (
        "import sys\n"
        "from gpuprofd.ctl import main\n"
        "rc = main(sys.argv[1:])\n"
        "print(sorted(m for m in ('statistics', 'decimal', 'fractions', 'aiohttp') "
        "if m in sys.modules))\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, "insights", str(db), "1", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"steps": 1' in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"
