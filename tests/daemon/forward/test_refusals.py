"""What the team server refuses: a batch answered 400 is dead-lettered (all
of it, or the one event the server named) and the rest flows; a wrong API
key pauses forwarding with one clear error, keeps the backlog, and a fixed
key file resumes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.forward.conftest import (
    ForwardNode,
    Tap,
    db_rows,
    ended_on_server,
    node_ledger,
    serve,
    server_steps,
    wait_until,
)
from tests.daemon.server.conftest import KEY_ONE, TeamServer

pytestmark = pytest.mark.timeout(300)  # real torch and gpuprofd processes on a busy box


def _run_uuid(node: ForwardNode) -> str:
    return str(
        wait_until(lambda: (r := node.rows("SELECT run_uuid FROM runs")) and r[0][0], 60, "run")
    )


def _steps_of(events: list[dict[str, Any]]) -> list[int]:
    return [int(r["step"]) for e in events if e["kind"] == "steps" for r in e["rows"]]


def test_a_batch_answered_400_is_dead_lettered_and_the_rest_flows(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], nodes: Any, taps: list[Tap]
) -> None:
    server = serve(tmp_path, pg_url)
    team_servers.append(server)
    refused: dict[str, Any] = {}

    def fault(batch: dict[str, Any], _index: int) -> tuple[int, dict[str, Any]] | None:
        events = batch["events"]
        kinds = [e["kind"] for e in events]
        if "batch" not in refused and "run" in kinds and len(kinds) > kinds.count("run"):
            # the batch announcing the run, with other events: no event named, all of it
            refused["batch"] = [(e["seq"], e["kind"]) for e in events]
            return 400, {"error": "this batch is refused for the test", "field": "events"}
        named = [i for i, kind in enumerate(kinds) if kind == "steps" and i > 0]
        if "batch" in refused and "event" not in refused and named:
            refused["event"] = events[named[0]]["seq"]  # a steps event, not the first
            field = f"events[{named[0]}].rows"
            return 400, {"error": "one event is refused for the test", "field": field}
        return None

    tap = Tap(server.url, fault).start()
    taps.append(tap)
    node = nodes("node-a")
    node.start(tap.url)
    with node.training("refused", 100_000, 0.01) as run:
        run_uuid = _run_uuid(node)
        wait_until(lambda: "event" in refused, 90, "both refusals")
        # the rest flows: steps after the refusals reach the server
        after = max(_steps_of([e for p in tap.snapshot() for e in p.events]))
        wait_until(lambda: max(server_steps(pg_url, run_uuid) or [0]) > after, 90, "more steps")
        run.finish()
    wait_until(lambda: ended_on_server(pg_url, run_uuid), 120, "the run's end on the server")

    dead = node.rows("SELECT seq, kind, body, status, reason FROM outbox_dead ORDER BY seq")
    # the refused batch's events, but the run's announcement: without it the
    # server would refuse every later event of the run
    kept = [seq for seq, kind in refused["batch"] if kind in ("run", "end")]
    want = [seq for seq, kind in refused["batch"] if kind not in ("run", "end")]
    want.append(refused["event"])
    assert kept and [d[0] for d in dead] == want and {d[3] for d in dead} == {400}
    assert "400: this batch is refused for the test" in dead[0][4]
    assert dead[-1][4] == "400: one event is refused for the test"
    # never sent again: each refused event reached the server's door once;
    # the announcement went again, with the next batches, until taken
    posts = tap.snapshot()
    assert all(sum(seq in p.seqs for p in posts) == 1 for seq in want)
    for seq in kept:
        answers = [p.status for p in posts if seq in p.seqs]
        assert answers[0] == 400 and answers[-1] == 200 and answers.count(200) == 1, answers
    # the server has everything else: the steps of the refused events only are missing
    dead_steps = _steps_of([{"kind": d[1], **json.loads(d[2])} for d in dead if d[2]])
    node_steps = [int(r[0]) for r in node.rows("SELECT step FROM steps ORDER BY step")]
    on_server = server_steps(pg_url, run_uuid)
    assert len(on_server) > 20 and on_server == [s for s in node_steps if s not in dead_steps]
    assert node.count("SELECT COUNT(*) FROM outbox WHERE seq <= ?", want[-1]) == 0
    ((last_seq, applied, _),) = node_ledger(pg_url)
    rest = [seq for p in posts if p.status == 200 for seq in p.seqs]
    assert applied == len(set(rest)) and not set(rest) & set(want)
    assert last_seq == max(rest)

    text = node.status_text()
    assert (
        f"refused:  {len(want)} events dead-lettered (not sent again); latest: "
        "400: one event is refused for the test"
    ) in text, text
    log = node.log()
    assert log.count("refused 1 event(s) for good") == 1, log
    assert log.count(f"refused {len(want) - 1} event(s) for good") == 1, log
    said = [ln for ln in log.splitlines() if "gpuprofd.forward" in ln and "for the test" in ln]
    assert len(said) == 2, said  # each refusal once


#: A paused forwarder tries again every 30 s; 2 s here, so that a few tries
#: happen within the test (each must not log again).
_QUICK_PAUSE = "import gpuprofd.forward.client as c\nc.PAUSED_RETRY_S = 2.0"


def test_a_wrong_api_key_pauses_with_one_error_and_a_fixed_key_resumes(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], nodes: Any
) -> None:
    server = serve(tmp_path, pg_url)
    team_servers.append(server)
    node = nodes("node-a")
    node.key_file.write_text("not-a-key-of-this-server\n")
    node.start(server.url, prelude=_QUICK_PAUSE)
    with node.training("wrong-key", 100_000, 0.01) as run:
        run_uuid = _run_uuid(node)
        fwd = wait_until(
            lambda: (f := node.status()["forward"])["retries"] >= 3 and f, 90, "a few tries"
        )
        assert fwd["state"] == "paused" and fwd["sent_events"] == 0, fwd
        assert fwd["last_error"].startswith("the team server refused the API key (401: "), fwd
        assert "fix GPUPROF_API_KEY, GPUPROF_API_KEY_FILE or --api-key-file" in fwd["last_error"]
        text = node.status_text()
        assert "(paused)" in text and "    error:    the team server refused the API key" in text
        log = node.log()
        assert log.count("the team server refused the API key") == 1, log  # once, not per try
        # the backlog is kept, and grows
        held = node.count("SELECT COUNT(*) FROM outbox WHERE kind = 'steps'")
        assert held > 0 and db_rows(pg_url, "SELECT COUNT(*) FROM runs") == [(0,)]
        wait_until(
            lambda: node.count("SELECT COUNT(*) FROM outbox WHERE kind = 'steps'") > held,
            60,
            "the backlog growing",
        )

        node.key_file.write_text(KEY_ONE + "\n")  # fixed: read again at the next try
        stored = node.count("SELECT COUNT(*) FROM steps")
        wait_until(lambda: len(server_steps(pg_url, run_uuid)) >= stored, 90, "the backlog sent")
        run.finish()
    wait_until(lambda: ended_on_server(pg_url, run_uuid), 120, "the run's end on the server")
    node_steps = [int(r[0]) for r in node.rows("SELECT step FROM steps ORDER BY step")]
    assert server_steps(pg_url, run_uuid) == node_steps
    fwd = node.status()["forward"]
    assert fwd["state"] == "ok" and fwd["outbox"]["dead_events"] == 0, fwd
    assert "the team server refused the API key" not in node.status_text()
    log = node.log()
    assert log.count("the team server refused the API key") == 1
    assert f"forwarding to {server.url} again" in log
