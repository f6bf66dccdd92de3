"""Who a training process is (gpuprof_shim.identity): ranks from torchrun's
environment, or from an initialized process group without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from gpuprof_shim import identity


def test_without_rank_variables_the_process_group_gives_rank_and_world() -> None:
    # torch.multiprocessing.spawn: init_process_group(rank=r, world_size=n), no
    # RANK / WORLD_SIZE: every rank was rank 0 of 1
    assert identity.read_ranks({}, process_group=(3, 4)) == identity.Ranks(3, 0, 4, 1)
    assert identity.read_ranks({"LOCAL_RANK": "1"}, (3, 4)) == identity.Ranks(3, 1, 4, 2)
    # torchrun's variables win; an impossible group is ignored
    env = {"RANK": "1", "WORLD_SIZE": "2"}
    assert identity.read_ranks(env, process_group=(3, 4)) == identity.Ranks(1, 0, 2, 1)
    assert identity.read_ranks({}, process_group=(4, 4)) == identity.Ranks()


def test_process_group_ranks_reads_an_initialized_group(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    assert identity.process_group_ranks() is None
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        assert identity.process_group_ranks() == (0, 1)
        assert identity.read_ranks() == identity.Ranks()
    finally:
        dist.destroy_process_group()


def test_the_user_is_the_login_name_printable_or_none(monkeypatch) -> None:
    import getpass

    monkeypatch.setattr(getpass, "getuser", lambda: "al\x1bice" + "x" * 100)
    assert identity.user_name() == ("alice" + "x" * 100)[:64]

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 1234")

    monkeypatch.setattr(getpass, "getuser", no_user)
    assert identity.user_name() is None
