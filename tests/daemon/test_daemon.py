"""The daemon's command line: numeric options refuse NaN and infinity; an
unknown GPU backend is one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("option", ["--sample-hz", "--raw-window", "--idle-exit"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_numeric_options_refuse_nan_and_infinity(tmp_path: Path, option: str, value: str):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprofd", "--db", str(tmp_path / "g.db"), option, value],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2
    assert f"Invalid value for '{option}'" in proc.stderr
    assert "not a finite number" in proc.stderr or "not in the range" in proc.stderr


def test_an_unknown_gpu_backend_is_one_clear_line(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprofd", "--db", str(tmp_path / "g.db")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "GPUPROF_NVML": "bogus"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpuprofd: error: GPUPROF_NVML='bogus' is not a GPU backend: use real (the default), "
        "mock, or replay:PATH (a recorded nvml_trace.jsonl)"
    ]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--storage-url", "postgres://u@127.0.0.1:1/x", "--server", "http://team:8000"],
            "runs stored in Postgres are shared already",
        ),
        (["--server", "team:8000"], "is not a team server URL: give http(s)://HOST[:PORT]"),
        (["--server", "http://team:8000/?x=1"], "give the server's base URL, without ? or #"),
        (["--metrics-key-file", "/nonexistent"], "--metrics-key-file needs --viewer-password-file"),
    ],
)
def test_forwarding_and_login_options_that_cannot_work_are_one_clear_line(
    tmp_path: Path, args: list[str], says: str
):
    cmd = [sys.executable, "-m", "gpuprofd", "--socket-dir", str(tmp_path / "s")]
    proc = subprocess.run(
        [*cmd, *(["--db", str(tmp_path / "g.db")] if "--storage-url" not in args else []), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpuprofd: error: ") and says in line
