"""Group findings at a rank's end, through a real gpuprofd over real ZeroMQ
into real SQLite: the rank's summary carries the group rules' findings so
far (the shim prints them), the group's are stored once every rank has
ended, ``gpuprofctl insights --group`` shows the stored ones, and a failing
group rule never breaks a bye."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprof.insights.distributed import GroupContext, comm_fraction
from gpuprof.stats import median
from gpuprof.summary import format_summary
from gpuprofd.ctl import main
from gpuprofd.storage import reads
from gpuprofd.storage.reader import open_reader
from tests.daemon import helpers as h
from tests.gpuprof.insights.group_fixtures import MS, group_steps

RAISING_RULE = """
import gpuprof.insights.distributed as d
def boom(ctx):
    raise RuntimeError("group rule bug")
d.GROUP_RULES = (*d.GROUP_RULES, boom)
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[h.Daemons, Path, Path]]:
    with h.daemons_on_own_socket(tmp_path) as (daemons, sock_dir):
        yield daemons, sock_dir, tmp_path / "g.db"


def _start_ranks(
    client: h.Client,
    group: str,
    steps: dict[int, list[dict[str, Any]]],
    pids: dict[int, int] | None = None,
) -> None:
    """Every rank says hello and sends all its steps (as concurrent ranks would
    have by the time the first one ends); *pids*: rank -> its process (default ours)."""
    n = len(steps)
    for r in range(n):
        pid = (pids or {}).get(r, os.getpid())
        hello = h.hello(
            f"{group}-{r}",
            pid,
            run_name=group,
            rank=r,
            local_rank=r,
            world_size=n,
            group=group,
            local_world_size=n,
            host="node-a",
        )
        assert client.request(hello)["ok"]
    for i in range(len(steps[0])):
        for r in range(n):
            client.push({"v": 1, "type": "step", "run_key": f"{group}-{r}", **steps[r][i]})


def _bye(client: h.Client, group: str, rank: int, sent: int) -> dict[str, Any]:
    reply = client.request(h.bye(f"{group}-{rank}", sent=sent))
    assert reply is not None and reply["ok"], reply
    return reply["summary"]


def _stored(db: Path, group: str) -> list[tuple[Any, ...]]:
    rows = h.query(
        db,
        "SELECT ranks, rule, severity, title, evidence FROM group_insights "
        "WHERE group_id = ? ORDER BY rowid",
        (group,),
    )
    return [tuple(r) for r in rows]


def _ctl_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main([*args, "--format", "json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_each_rank_summary_names_the_straggler_and_the_ended_group_stores_it(
    daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db)
    steps = group_steps(4, n_steps=30, slow_backward={1: 30 * MS})
    _start_ranks(client, "job", steps)
    first = _bye(client, "job", 0, sent=30)
    group = first["group"]
    assert (group["group"], group["ranks"]) == ("job", 4)
    assert [i["rule"] for i in group["insights"]] == ["straggler_rank"]
    assert group["insights"][0]["evidence"]["rank"] == 1
    text = format_summary(first).splitlines()
    at = text.index("  Group job (4 ranks):")
    assert text[at + 1].startswith("  [") and "Rank 1 is a straggler" in text[at + 1]
    assert next(i for i, x in enumerate(text) if x.startswith("  Insights (")) < at
    # ranks 1-3 still run: the group has not ended, nothing stored yet
    assert _stored(db, "job") == []
    live = _ctl_json(capsys, "insights", str(db), "--group", "job")
    assert live["insights_source"] == "computed" and live["status"] == "running"

    for r in (1, 2, 3):
        summary = _bye(client, "job", r, sent=30)
        assert "Rank 1 is a straggler" in format_summary(summary)
    ((ranks, rule, severity, title, evidence),) = _stored(db, "job")
    assert (ranks, rule) == (4, "straggler_rank") and "Rank 1" in title
    assert orjson.loads(evidence)["rank"] == 1 and severity in ("HIGH", "MED")
    # the stored summary (gpuprofctl insights RUN) has the block too
    (row,) = h.query(db, "SELECT summary FROM runs WHERE run_key = 'job-1'")
    assert orjson.loads(row[0])["group"]["insights"][0]["evidence"]["rank"] == 1

    data = _ctl_json(capsys, "insights", str(db), "--group", "job")
    assert data["insights_source"] == "stored" and data["status"] == "finished"
    assert [i["rule"] for i in data["insights"]] == ["straggler_rank"]
    assert data["insights"][0]["title"] == title
    assert main(["insights", str(db), "--group", "job"]) == 0
    report = capsys.readouterr().out
    assert report.count("Rank 1 is a straggler") == 1  # once, in the group's findings
    assert "Group job (4 ranks):" not in report


def test_a_balanced_group_and_a_lone_run_get_no_group_block(
    daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db)
    steps = group_steps(2, n_steps=30)
    _start_ranks(client, "even", steps)
    summaries = [_bye(client, "even", r, sent=30) for r in (0, 1)]
    for s in summaries:
        gains = s["group"].pop("gains")  # nothing to fix: no fix-all figure
        assert gains["findings"] == 0 and gains["fix_all_speedup_max"] is None
        assert s["group"] == {
            "group": "even",
            "ranks": 2,
            "insights": [],
            "lost_ranks": [],
            "missing_ranks": [],
            "runs_note": None,
        }
        text = format_summary(s)
        assert "  Group even" not in text  # no block; the group report is named
        assert f"  Group report: gpuprofctl insights {db} --group even" in text.splitlines()
    assert _stored(db, "even") == []
    # ... but the rules ran on the ended group: --group reads that, not again
    checked = h.query(db, "SELECT ranks, found FROM group_checks WHERE group_id = 'even'")
    assert [tuple(r) for r in checked] == [(2, 0)]
    data = _ctl_json(capsys, "insights", str(db), "--group", "even")
    assert (data["insights_source"], data["insights"]) == ("stored", [])

    assert client.request(h.hello("lone", os.getpid(), run_name="lone"))["ok"]
    for i in range(5):
        client.push(h.step("lone", i, 10**12))
    lone = _bye_key(client, "lone", 5)
    assert "group" not in lone and "group_id" not in lone and "Group " not in format_summary(lone)


def _bye_key(client: h.Client, key: str, sent: int) -> dict[str, Any]:
    reply = client.request(h.bye(key, sent=sent))
    assert reply is not None and reply["ok"], reply
    return reply["summary"]


def test_a_lost_rank_ends_the_group_and_its_findings_are_stored(daemon) -> None:
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    steps = group_steps(4, n_steps=30, slow_backward={1: 30 * MS})
    _start_ranks(client, "job", steps, pids={3: dead.pid})
    for r in (0, 1, 2):
        _bye(client, "job", r, sent=30)
    # rank 3's process is gone without a bye: lost, and the group ends with it
    h.poll_db(db, "SELECT status FROM runs WHERE run_key = 'job-3'", (), "lost")
    h.poll_db(db, "SELECT rule FROM group_insights WHERE group_id = 'job'", (), "straggler_rank")
    # the summary is stored just after the group's findings
    h.poll_db(db, "SELECT summary IS NOT NULL FROM runs WHERE run_key = 'job-3'", (), 1)
    (row,) = h.query(db, "SELECT summary FROM runs WHERE run_key = 'job-3'")
    assert orjson.loads(row[0])["group"]["insights"][0]["rule"] == "straggler_rank"


def test_a_raising_group_rule_does_not_break_bye(daemon) -> None:
    daemons, sock_dir, db = daemon
    proc, client = daemons.start_ready(sock_dir, db, prelude=RAISING_RULE)
    steps = group_steps(2, n_steps=30, slow_backward={1: 30 * MS})
    _start_ranks(client, "job", steps)
    summaries = [_bye(client, "job", r, sent=30) for r in (0, 1)]
    for s in summaries:
        assert s["status"] == "finished" and s["steps"] == 30
        assert "group" not in s
        format_summary(s)
    rows = h.query(db, "SELECT status, summary IS NOT NULL FROM runs WHERE group_id = 'job'")
    assert [tuple(r) for r in rows] == [("finished", 1)] * 2
    reply = client.ping()
    assert reply is not None and reply["dropped"].get("group_insights_failed") == 2
    assert _stored(db, "job") == []
    # the daemon goes on: another run starts and ends
    assert client.request(h.hello("after", os.getpid(), run_name="after"))["ok"]
    assert _bye_key(client, "after", 0)["status"] == "finished"
    assert "group insights of 'job' failed" in daemons.log(proc)
    assert "group rule bug" in daemons.log(proc)


SLOW_RULE = """
import time
import gpuprof.insights.distributed as d
from gpuprof.insights.base import Insight
def slow(ctx):
    time.sleep(1.5)
    return Insight("slow_rule", "LOW", "slow finding", "d", "f", {"rank": 0})
d.GROUP_RULES = (slow,)
import gpuprofd.services.insights_runner as r
r.GROUP_WAIT_S = 0.5
"""


def test_slow_group_rules_leave_a_note_and_are_stored_once_ready(daemon) -> None:
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db, prelude=SLOW_RULE)
    steps = group_steps(2, n_steps=10)
    _start_ranks(client, "job", steps)
    t = time.monotonic()
    summaries = [_bye(client, "job", r, sent=10) for r in (0, 1)]
    assert time.monotonic() - t < 2 * 1.5  # neither bye waited for the rules
    for s in summaries:
        assert "group" not in s
        assert (
            "the group's findings were not ready in time: gpuprofctl insights --group job"
            in (s["notes"])
        )
    h.poll_db(db, "SELECT rule FROM group_insights WHERE group_id = 'job'", (), "slow_rule")


def test_one_comm_definition_for_the_summary_the_group_report_and_the_rules(
    daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary's comm line, insights --group's per-rank comm and
    comm_dominant's share are one figure: the median over steady steps
    (warm-up left out), not a mean a few slow warm-up steps inflate."""
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db)
    steps = group_steps(2, n_steps=30, slow_backward={1: 30 * MS})
    for s in steps[0][:3]:  # rank 0 waits 300 ms more in its warm-up steps' all-reduce
        s["phases"]["comm"] += 300 * MS
        s["t1"] += 300 * MS
    _start_ranks(client, "one", steps)
    summaries = [_bye(client, "one", r, sent=30) for r in (0, 1)]
    comm = summaries[0]["comm"]

    async def read() -> GroupContext:
        async with open_reader(db) as reader:
            return await reads.group_context(reader, "one")

    rank0 = next(r for r in asyncio.run(read()).ranks if r.rank == 0)
    assert comm["median_share_of_step"] == round(comm_fraction(rank0), 4)
    assert 0.3 < comm["median_share_of_step"] < 0.4  # the mean share would be ~45 %
    assert comm["median_exposed_ms"] == pytest.approx(median(rank0.comm_ms[3:]), abs=1e-3)
    assert comm["median_exposed_ms"] < 40  # the mean is ~62 ms
    line = next(x for x in format_summary(summaries[0]).splitlines() if "Comm " in x)
    assert line.startswith(
        f"  Comm (median of steady steps): {comm['median_exposed_ms']:.1f} "
        f"ms/step exposed, {100 * comm['median_share_of_step']:.0f} % of step"
    )

    data = _ctl_json(capsys, "insights", str(db), "--group", "one")
    r0 = next(r for r in data["ranks"] if r["rank"] == 0)["comm"]
    assert r0["median_exposed_ms"] == comm["median_exposed_ms"]
    assert r0["median_share_of_step"] == comm["median_share_of_step"]
    assert main(["insights", str(db), "--group", "one"]) == 0
    rank_line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  rank 0 "))
    assert (
        f"comm median {comm['median_exposed_ms']:.1f} ms/step exposed "
        f"({100 * comm['median_share_of_step']:.0f} % of step)"
    ) in rank_line


def test_rank_zeros_summary_says_which_rank_was_lost_and_which_never_reported(daemon) -> None:
    """Rank 1 dies at step 19 and rank 2 never runs gpuprof: rank 0's printed
    summary (it then fails) names both in its group block, from the statuses
    stored by then, not only its own error."""
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    steps = group_steps(2, n_steps=30)
    for r, pid in ((0, os.getpid()), (1, dead.pid)):
        hello = h.hello(
            f"lost-{r}",
            pid,
            run_name="lost",
            rank=r,
            local_rank=r,
            world_size=3,
            group="lost",
            local_world_size=3,
            host="node-a",
        )
        assert client.request(hello)["ok"]
    for i in range(30):
        for r in (0, 1) if i < 20 else (0,):
            client.push({"v": 1, "type": "step", "run_key": f"lost-{r}", **steps[r][i]})
    h.poll_db(db, "SELECT status FROM runs WHERE run_key = 'lost-1'", (), "lost")
    reply = client.request(h.bye("lost-0", sent=30, status="failed"))
    assert reply is not None and reply["ok"], reply
    summary = reply["summary"]
    group = summary["group"]
    assert [m["message"] for m in group["lost_ranks"]] == ["rank 1 lost at step ~19"]
    assert (group["lost_ranks"][0]["rank"], group["lost_ranks"][0]["last_step"]) == (1, 19)
    assert [m["rank"] for m in group["missing_ranks"]] == [2]
    text = format_summary(summary).splitlines()
    at = text.index("  Group lost (2 ranks):")
    assert text[at + 1] == "  rank 1 lost at step ~19"
    assert text[at + 2] == (
        "  rank 2 never reported: it did not run gpuprof.profile, or ended before its first message"
    )
    # the lost rank's own summary does not list itself (its status says it)
    h.poll_db(db, "SELECT summary IS NOT NULL FROM runs WHERE run_key = 'lost-1'", (), 1)
    (row,) = h.query(db, "SELECT summary FROM runs WHERE run_key = 'lost-1'")
    assert 1 not in [m["rank"] for m in orjson.loads(row[0])["group"]["lost_ranks"]]


def test_a_group_name_reused_across_launches_counts_ranks_not_runs(
    daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    """profile(group="my-exp") on two launches of 2 ranks: the group has 2
    ranks (4 runs), each rank's latest run compared, and the views say so."""
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db)
    for launch in (1, 2):
        steps = group_steps(2, n_steps=10, seed=launch)
        for r in (0, 1):
            key = f"l{launch}-{r}"
            hello = h.hello(
                key,
                os.getpid(),
                run_name="exp",
                rank=r,
                local_rank=r,
                world_size=2,
                group="my-exp",
                local_world_size=2,
                host="node-a",
            )
            assert client.request(hello)["ok"]
            for s in steps[r]:
                client.push({"v": 1, "type": "step", "run_key": key, **s})
        for r in (0, 1):
            _bye_key(client, f"l{launch}-{r}", 10)
    note = "4 runs of 2 ranks: each rank's latest run is compared; pass a new group= per launch"
    assert main(["runs", str(db), "--group", "my-exp"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"group my-exp: finished (2 ranks: 2 finished); {note}"
    data = _ctl_json(capsys, "insights", str(db), "--group", "my-exp")
    assert (data["runs"], data["runs_note"], data["counts"]) == (4, note, {"finished": 2})
    latest = {r[0]: r[1] for r in h.query(db, "SELECT run_key, id FROM runs")}
    assert [(r["rank"], r["run_id"]) for r in data["ranks"]] == [
        (0, latest["l2-0"]),
        (1, latest["l2-1"]),
    ]
    assert main(["insights", str(db), "--group", "my-exp"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[:2] == ["group my-exp: finished (2 ranks: 2 finished)", f"  {note}"]


def test_ranks_without_collective_timings_are_said_and_their_clock_is_unknown(
    daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    """A comm hook registered before gpuprof.profile (or time_comm=False): no
    bucket rows, no comm phase. The group report says which group rules that
    rules out, instead of a bare "Group insights (0)"; the clock reads
    "reference" on the rank the others were aligned to and "unknown" where no
    clock event was stored, not "+0.000 ± 0.000"."""
    daemons, sock_dir, db = daemon
    _, client = daemons.start_ready(sock_dir, db)
    steps = group_steps(2, n_steps=30)
    for events in steps.values():
        for s in events:
            del s["comm"]
            s["phases"]["backward"] += s["phases"].pop("comm")
    _start_ranks(client, "nocomm", steps)
    # rank 0 aligned the others to itself: offset 0 ± 0 (what the shim stores)
    client.push(
        {
            "v": 1,
            "type": "clock",
            "run_key": "nocomm-0",
            "offset_ns": 0,
            "uncertainty_ns": 0,
            "rtt_ns": 0,
            "round_trips": 64,
            "reference_rank": 0,
        }
    )
    for r in (0, 1):
        _bye(client, "nocomm", r, sent=31 if r == 0 else 30)
    data = _ctl_json(capsys, "insights", str(db), "--group", "nocomm")
    message = (
        "no collective timings from ranks 0, 1 (comm hook registered before "
        "gpuprof.profile, or time_comm=False): straggler_rank, bucket_skew and "
        "comm_dominant cannot run; rank_skew only"
    )
    assert data["comm_missing"] == {"ranks": [0, 1], "message": message}
    assert main(["insights", str(db), "--group", "nocomm"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[:3] == [
        "group nocomm: finished (2 ranks: 2 finished)",
        f"  {message}",
        "  Group insights (0):",
    ]
    rank0 = next(x for x in text if x.startswith("  rank 0 "))
    rank1 = next(x for x in text if x.startswith("  rank 1 "))
    assert rank0.endswith("comm none timed, clock reference") and "0.000" not in rank0
    assert rank1.endswith("comm none timed, clock unknown")
