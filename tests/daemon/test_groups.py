"""The hello's distributed fields (group, local_world_size), the shim's
detection of them from torchrun's environment, and a group's status."""

from __future__ import annotations

import os

import pytest

from gpuprof.protocol import MAX_GROUP_CHARS, PROTOCOL_VERSION, ProtocolError, decode, encode
from gpuprof_shim import identity, messages
from gpuprofd.commands.runs import group_line
from gpuprofd.storage.reads import group_status, missing_ranks


def hello(**kw):
    msg = {
        "v": PROTOCOL_VERSION,
        "type": "hello",
        "run_key": "k",
        "run_name": "r",
        "pid": 1,
        "host": "h",
        "rank": 1,
        "local_rank": 1,
        "world_size": 4,
        "wall_ns": 1,
        "mono_ns": 1,
        "auto": True,
        "options": {},
    }
    msg.update(kw)
    return msg


def reason(msg) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(encode(msg), "control")
    return info.value.reason


def test_hello_with_group_and_local_world_size_is_valid():
    msg = hello(group="3f2a-run", local_world_size=2)
    assert decode(encode(msg), "control") == msg
    assert decode(encode(hello(group=None)), "control")["group"] is None
    assert "group" not in decode(encode(hello()), "control")  # optional: older shims


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"group": "a\x1bb"}, "group"),
        ({"group": "\u202egroup"}, "group"),
        ({"group": "x" * (MAX_GROUP_CHARS + 1)}, "group"),
        ({"group": 7}, "group"),
        ({"local_world_size": 0}, "local_world_size"),
        ({"local_world_size": 1 << 21}, "local_world_size"),
        ({"local_world_size": "2"}, "local_world_size"),
        ({"local_world_size": True}, "local_world_size"),
    ],
)
def test_bad_group_fields_are_rejected(extra, field):
    assert reason(hello(**extra)) == f"bad_field:{field}"


TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "TORCHELASTIC_RUN_ID": "job-42",
}


def test_ranks_and_group_from_torchrun_env():
    assert identity.read_ranks(TORCHRUN) == identity.Ranks(3, 1, 4, 2)
    assert identity.group_id(env=TORCHRUN) == "job-42"
    assert identity.group_id("mine", env=TORCHRUN) == "mine"  # group= overrides


def test_outside_torchrun_a_run_is_its_own_group():
    assert identity.read_ranks({}) == identity.Ranks(0, 0, 1, 1)
    assert identity.group_id(env={}) is None
    assert identity.group_id("", env={}) is None


def test_torchrun_default_run_id_becomes_one_group_per_launch():
    # torchrun without --rdzv-id sets TORCHELASTIC_RUN_ID=none for every launch
    assert identity.group_id(env={"TORCHELASTIC_RUN_ID": "none"}) == f"torchrun-{os.getppid()}"
    assert identity.group_id("none", env={}) == "none"  # an explicit name is kept


def test_group_is_cleaned_and_bounded_so_the_daemon_accepts_it():
    gid = identity.group_id(env={"TORCHELASTIC_RUN_ID": "a\x1b[0m\u202e" + "y" * 500})
    assert gid is not None and len(gid) <= MAX_GROUP_CHARS
    msg = messages.hello(
        run_key="k",
        run_name="r",
        pid=1,
        host="h",
        ranks=identity.Ranks(),
        wall_ns=1,
        mono_ns=1,
        auto=True,
        options={},
        cuda_uuid=None,
        argv=None,
        group=gid,
    )
    assert decode(encode(msg), "control")["group"] == gid


@pytest.mark.parametrize(
    "env, local_world",
    [
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "8"}, 4),  # above the world: cut
        ({"WORLD_SIZE": "4", "LOCAL_RANK": "2"}, 3),  # missing: at least our slot
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "x"}, 1),
    ],
)
def test_local_world_size_is_kept_consistent(env, local_world):
    assert identity.read_ranks(env).local_world_size == local_world


@pytest.mark.parametrize(
    "statuses, status",
    [
        (["finished", "running"], "running"),
        (["lost", "running"], "running"),
        (["finished", "finished"], "finished"),
        (["finished", "lost", "finished"], "lost"),
        (["failed", "lost"], "failed"),
    ],
)
def test_group_status_summarises_the_ranks(statuses, status):
    st = group_status(statuses)
    assert st["status"] == status
    assert st["ended"] == (status != "running")
    assert sum(st["counts"].values()) == len(statuses)


def _run(rank, local_rank, host="h", world=4, local_world=4, status="finished"):
    return {
        "rank": rank,
        "local_rank": local_rank,
        "host": host,
        "world_size": world,
        "local_world_size": local_world,
        "status": status,
    }


def test_missing_ranks_on_one_node_are_named_by_rank():
    runs = [_run(0, 0), _run(1, 1), _run(3, 3)]
    (gone,) = missing_ranks(runs)
    message = (
        "rank 2 never reported: it did not run gpuprof.profile, or ended before its first message"
    )
    assert gone == {"rank": 2, "local_rank": 2, "host": "h", "message": message}
    assert missing_ranks([*runs, _run(2, 2)]) == []
    assert group_line("g", runs) == (f"group g: finished (3 ranks: 3 finished); {message}")


def test_missing_ranks_across_nodes_are_named_by_local_rank_and_host():
    # 2 nodes of 2: node b's local rank 1 (global rank 3) never reported
    runs = [_run(0, 0, "a", 4, 2), _run(1, 1, "a", 4, 2), _run(2, 0, "b", 4, 2)]
    assert [m["message"] for m in missing_ranks(runs)] == [
        "local rank 1 on b never reported: it did not run gpuprof.profile, or ended before "
        "its first message"
    ]
    # this node's daemon sees only its own ranks: node a's 2 of 4
    assert missing_ranks(runs[:2]) == []
    # an older shim sent no LOCAL_WORLD_SIZE: nothing to compare with
    assert missing_ranks([_run(0, 0, local_world=None)]) == []


def test_a_relaunch_on_fewer_ranks_is_not_compared_with_the_old_launch():
    from gpuprofd.storage.reads import latest_rank_runs

    old = [{"id": i + 1, "rank": i, "world_size": 4} for i in range(4)]
    new = [{"id": 5 + i, "rank": i, "world_size": 2} for i in range(2)]
    assert [r["id"] for r in latest_rank_runs(old + new)] == [5, 6]  # not ranks 2, 3 of 4
    # the same world size: each rank's latest run
    again = [{"id": 7, "rank": 1, "world_size": 2}]
    assert [r["id"] for r in latest_rank_runs(new + again)] == [5, 7]
    assert latest_rank_runs([]) == []
