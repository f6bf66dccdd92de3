"""``rm gpuprof.db*`` between two runs of one auto-started daemon: the second
run is in a fresh database at the path (not in the deleted file)."""

from __future__ import annotations

import json

from .conftest import Node, ping
from .scripts import TRAIN


def test_db_deleted_between_runs_of_one_autostarted_daemon(node: Node):
    first = node.run_script(TRAIN, "20", "1", "0", "again")
    assert first.returncode == 0, first.stderr
    pid = ping(node.socket_dir)["pid"]
    for p in node.db.parent.glob(node.db.name + "*"):
        p.unlink()
    second = node.run_script(TRAIN, "20", "1", "0.03", "again")
    assert second.returncode == 0, second.stderr
    assert ping(node.socket_dir)["pid"] == pid  # the same daemon took it
    assert f"Full report: gpuprofctl insights {node.db} 1" in second.stdout
    assert "Regression" not in second.stdout  # the deleted run is no history
    runs = node.ctl("runs", str(node.db), "--format", "json")
    assert runs.returncode == 0, runs.stderr
    assert [(r["id"], r["run_name"], r["steps"]) for r in json.loads(runs.stdout)] == [
        (1, "again", 20)
    ]
    status = node.ctl("status", "--format", "json")
    info = json.loads(status.stdout)
    assert info["db_file"] == "ok" and [e["was"] for e in info["db_reopened"]] == ["deleted"]
    assert not any(k.startswith("group_insights") for k in info["dropped"]), info["dropped"]
