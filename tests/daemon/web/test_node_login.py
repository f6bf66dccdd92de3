"""A node's dashboard beyond loopback: only behind the team server's viewer
login (a real daemon on every address, reached over loopback here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.daemon import helpers as h
from tests.daemon.server.conftest import CHEAP_HASH, PASSWORD, csrf, login

SCRAPE_KEY = "scrape-key-0123456789abcdef"


def test_every_address_is_refused_without_a_login(sock_dir: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "gpuprofd", "--socket-dir", str(sock_dir)]
    cmd += ["--db", str(tmp_path / "g.db"), "--http", "0.0.0.0:0"]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert got.returncode == 2
    assert "add --viewer-password-file" in got.stderr and "Traceback" not in got.stderr


def test_a_node_dashboard_on_every_address_needs_the_viewer_login(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    password = tmp_path / "viewer"
    password.write_text(CHEAP_HASH + "\n")
    keys = tmp_path / "scrape-keys"
    keys.write_text(SCRAPE_KEY + "\n")
    db = tmp_path / "g.db"
    args = ("--http", "0.0.0.0:0", "--viewer-password-file", str(password))
    proc, client = daemons.start_ready(sock_dir, db, *args, "--metrics-key-file", str(keys))
    run_id = client.request(h.hello("k", my_pid, run_name="behind-login"))["run_id"]
    port = int(client.ping()["dashboard_url"].rsplit(":", 1)[1])
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=30) as anon:
        assert anon.get("/api/v1/runs").status_code == 401
        page = anon.get("/", follow_redirects=False)
        assert page.status_code in (302, 303) and "/login" in page.headers["location"]
        assert anon.get("/metrics").status_code == 401
        scraped = anon.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_KEY}"})
        assert scraped.status_code == 200 and "gpuprof_runs_live 1.0" in scraped.text
        assert login(anon, "wrong").status_code == 401
    with httpx.Client(base_url=base, timeout=30) as viewer:
        assert login(viewer, PASSWORD).status_code == 200
        runs = viewer.get("/api/v1/runs").json()["runs"]
        assert [(r["id"], r["run_name"]) for r in runs] == [(run_id, "behind-login")]
        assert viewer.post("/api/v1/logout", headers=csrf(viewer)).status_code in (200, 204)
        assert viewer.get("/api/v1/runs").status_code == 401
    assert proc.poll() is None
