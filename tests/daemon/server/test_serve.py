"""``gpuprofd serve`` as users run it: one process, ingest with a key, the
dashboard's API behind the login, insights when a run's end arrives, and
one-line errors for what cannot work."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.daemon.batches import BOOT, batch, end_event, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import (
    KEY_TWO,
    PASSWORD,
    TeamServer,
    db_rows,
    login,
)
from tests.daemon.storage.test_ingest import doc_example


def test_a_forwarded_run_is_served_with_its_insights(
    tmp_path: Path, storage_url: str, team_servers: list[TeamServer]
) -> None:
    (tmp_path / "viewer").write_text(PASSWORD + "\n")  # a plain password, hashed at start
    server = TeamServer(tmp_path, storage_url).start()
    team_servers.append(server)
    first = server.ingest(doc_example())
    again = server.ingest(doc_example(), key=KEY_TWO)  # the key listed by its digest
    assert first.status_code == 200, first.text
    assert first.json() == {
        "node": "5b0d6f43-9d7e-4f27-a0f3-41c9e2b1d8aa",
        "acked_seq": 5,
        "applied": 5,
        "skipped": 0,
    }
    assert again.status_code == 200 and again.json()["skipped"] == 5
    assert db_rows(storage_url, "SELECT COUNT(*) FROM steps") == [(2,)]
    with server.client() as c:
        assert login(c).status_code == 200
        runs = c.get("/api/v1/runs").json()["runs"]
        assert [(r["run_name"], r["status"], r["steps"]) for r in runs] == [
            ("llama-7b-sft", "finished", 2)
        ]
        deadline = time.monotonic() + 30
        summary = None
        while summary is None and time.monotonic() < deadline:  # computed after the answer
            summary = c.get(f"/api/v1/runs/{runs[0]['id']}").json()["summary"]
            time.sleep(0.1)
    assert summary is not None and summary["median_step_ms"] == 103.5  # wait + step, as a node says
    assert "ended: insights stored" in server.log()


def test_a_run_in_many_batches(
    tmp_path: Path, storage_url: str, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, storage_url).start()
    team_servers.append(server)
    run = new_uuid()
    answers = [
        server.ingest(batch("node-1", [run_event(1, run, name="many")])),
        server.ingest(batch("node-1", [steps_event(2, run, 0, 50), steps_event(3, run, 50, 50)])),
        server.ingest(batch("node-1", [steps_event(4, run, 100, 20), end_event(5, run)])),
        server.ingest(batch("node-1", [host_event(6)])),
    ]
    assert [a.json()["acked_seq"] for a in answers] == [1, 3, 5, 6]
    assert db_rows(storage_url, "SELECT COUNT(*), MAX(step) FROM steps") == [(120, 119)]
    assert db_rows(storage_url, "SELECT status, node_id FROM runs") == [("finished", "node-1")]
    # the server rolls the steps into blocks as a node does: the ended run's last block too
    blocks = "SELECT block, first_step, last_step, n FROM step_rollups ORDER BY block"
    deadline = time.monotonic() + 120
    while len(db_rows(storage_url, blocks)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert db_rows(storage_url, blocks) == [(0, 0, 99, 100), (1, 100, 119, 20)]
    # and the host samples of the run's boot into 10 s blocks of the run
    hosts = "SELECT COALESCE(SUM(n), 0) FROM host_rollups"
    while db_rows(storage_url, hosts) == [(0,)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert db_rows(storage_url, hosts)[0][0] > 0


def host_event(seq: int) -> dict:
    """Host samples of the run's boot every 0.5 s for 25 s (a 10 s block is
    rolled once a sample after it is stored)."""
    rows = [
        {
            "mono_ns": 1_000_000_000 + k * 500_000_000,
            "boot_id": BOOT,
            "cpu_pct": 40.0,
            "cpu_count": 8,
        }
        for k in range(50)
    ]
    return {"seq": seq, "kind": "host_samples", "rows": rows}


def _serve(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuprofd", "serve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_what_cannot_work_is_one_line(tmp_path: Path) -> None:
    pw = tmp_path / "viewer"
    pw.write_text("pw\n")
    keys = tmp_path / "keys"
    keys.write_text("k\n")
    db = f"sqlite:///{tmp_path / 's.db'}"
    empty = tmp_path / "empty-url"
    empty.write_text("# nothing yet\n\n")
    cases = {
        "no key file": (
            [
                "--storage-url",
                db,
                "--api-key-file",
                str(tmp_path / "nope"),
                "--viewer-password-file",
                str(pw),
            ],
            "cannot read the API key file",
        ),
        "no keys at all": (
            ["--storage-url", db, "--viewer-password-file", str(pw)],
            "no API keys",
        ),
        "no password file": (
            [
                "--storage-url",
                db,
                "--api-key-file",
                str(keys),
                "--viewer-password-file",
                str(tmp_path / "nope"),
            ],
            "cannot read the viewer password file",
        ),
        "a down database": (
            [
                "--storage-url",
                "postgres://root@127.0.0.1:1/test",
                "--api-key-file",
                str(keys),
                "--viewer-password-file",
                str(pw),
            ],
            "cannot connect to Postgres at postgres://root@127.0.0.1:1/test",
        ),
        "no database": (
            ["--api-key-file", str(keys), "--viewer-password-file", str(pw)],
            "give the database as --storage-url URL or --storage-url-file FILE",
        ),
        "two databases": (
            [
                "--storage-url",
                db,
                "--storage-url-file",
                str(keys),
                "--viewer-password-file",
                str(pw),
            ],
            "(one of the two)",
        ),
        "no storage URL file": (
            [
                "--storage-url-file",
                str(tmp_path / "nope"),
                "--api-key-file",
                str(keys),
                "--viewer-password-file",
                str(pw),
            ],
            "cannot read the storage URL file",
        ),
        "an empty storage URL file": (
            [
                "--storage-url-file",
                str(empty),
                "--api-key-file",
                str(keys),
                "--viewer-password-file",
                str(pw),
            ],
            "holds no URL",
        ),
        "a bad address": (
            [
                "--storage-url",
                db,
                "--api-key-file",
                str(keys),
                "--viewer-password-file",
                str(pw),
                "--http",
                "127.0.0.1:http",
            ],
            "--http '127.0.0.1:http'",
        ),
    }
    for what, (args, said) in cases.items():
        done = _serve(*args)
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        assert done.returncode != 0, what
        assert len(errors) == 1 and said in errors[0], (what, done.stderr)
        assert "Traceback" not in done.stderr, what


def test_the_database_password_stays_out_of_ps(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer]
) -> None:
    # this Postgres trusts local connections: a password in the URL is sent and ignored
    with_password = pg_url.replace("://root@", "://root:s3cret-pw@")
    assert "s3cret-pw" in with_password
    server = TeamServer(tmp_path, with_password, url_file=tmp_path / "storage-url").start()
    team_servers.append(server)
    assert server.proc is not None
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode()
    assert "--storage-url-file" in cmdline and "s3cret-pw" not in cmdline
    assert "127.0.0.1:5432" not in cmdline  # the whole URL is off the command line
    assert server.ingest(batch("n1", [run_event(1, new_uuid(), name="via-file")])).is_success
    assert db_rows(pg_url, "SELECT run_name FROM runs") == [("via-file",)]
    assert "s3cret-pw" not in server.log() and "root:***@" in server.log()
    # on the command line it works too, said with a warning, the password never printed
    down = _serve(
        "--storage-url",
        "postgres://root:s3cret-pw@127.0.0.1:1/test",
        "--api-key-file",
        str(server.keys),
        "--viewer-password-file",
        str(server.password),
    )
    assert down.returncode != 0
    assert "where ps shows it: put the URL in --storage-url-file" in down.stderr
    assert "s3cret-pw" not in down.stderr
