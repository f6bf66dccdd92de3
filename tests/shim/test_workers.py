"""The shim reports each multi-process DataLoader iterator's worker pids
(``workers`` events): real DataLoaders with forked workers, a fake daemon."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info

import gpuprof
from gpuprof_shim.workers import WorkerReporter, worker_pids

from .training import MLP

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
    # 3 workers on a 2-core CI box: torch suggests fewer; the count is the point here
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


class WhoAmI(Dataset):
    """Each item says which process served it: (pid, worker id)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = get_worker_info()
        return torch.randn(8), torch.tensor([os.getpid(), info.id if info else -1])


def loader(num_workers: int = 3, **kw: Any) -> DataLoader:
    if num_workers:
        kw["multiprocessing_context"] = "fork"
    return DataLoader(WhoAmI(), batch_size=2, num_workers=num_workers, **kw)


def profile(socket_dir: Path, **kw: Any) -> Any:
    return gpuprof.profile("w", socket_dir=socket_dir, autostart=False, print_summary=False, **kw)


def served(batches: list[torch.Tensor]) -> set[tuple[int, int]]:
    return {(int(pid), int(wid)) for b in batches for pid, wid in b.tolist()}


def reported(fake_daemon: Any) -> list[dict[str, Any]]:
    return [m for m in fake_daemon.data if m["type"] == "workers"]


def as_pairs(msg: dict[str, Any]) -> set[tuple[int, int]]:
    return {(w["pid"], w["worker_id"]) for w in msg["workers"]}


def test_each_epochs_new_workers_are_one_group_with_torchs_worker_ids(socket_dir, fake_daemon):
    model, dl = MLP(), loader()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per_epoch: list[list[torch.Tensor]] = [[], []]
    with profile(socket_dir) as prof:
        for epoch in range(2):  # persistent_workers=False: a new pool each epoch
            for x, who in dl:
                per_epoch[epoch].append(who)
                model(x).sum().backward()
                opt.step()
    first, second = reported(fake_daemon)
    assert [first["loader_seq"], second["loader_seq"]] == [0, 1]
    assert as_pairs(first) == served(per_epoch[0]) and len(as_pairs(first)) == 3
    assert as_pairs(second) == served(per_epoch[1])
    assert not {p for p, _ in as_pairs(first)} & {p for p, _ in as_pairs(second)}
    t_hello = fake_daemon.of_type("hello")[0]["mono_ns"]
    assert t_hello < first["t_ns"] < second["t_ns"] < fake_daemon.steps[-1]["t1"]
    assert prof._workers is not None and prof._workers.errors == 0


def test_a_single_process_loader_reports_nothing(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        for x, _ in loader(num_workers=0):
            model(x).sum().backward()
            opt.step()
    assert len(fake_daemon.steps) == 3
    assert reported(fake_daemon) == []


def test_manual_mode_wrap_dataloader_reports_the_workers(socket_dir, fake_daemon):
    seen: list[torch.Tensor] = []
    with profile(socket_dir, auto=False) as prof:
        for i, (_, who) in enumerate(prof.wrap_dataloader(loader(num_workers=2))):
            with prof.step(i):
                seen.append(who)
    (msg,) = reported(fake_daemon)
    assert msg["loader_seq"] == 0 and as_pairs(msg) == served(seen)
    assert len(as_pairs(msg)) == 2


def test_auto_mode_with_wrap_dataloader_reports_a_pool_once(socket_dir, fake_daemon):
    """Both the patched ``DataLoader.__iter__`` and the wrapper see the iterator."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir) as prof:
        for x, _ in prof.wrap_dataloader(loader(num_workers=2)):
            model(x).sum().backward()
            opt.step()
    assert [m["loader_seq"] for m in reported(fake_daemon)] == [0]


# --- the reporter on its own -------------------------------------------------------


class NotALoaderIter:
    """Looks like a worker iterator but is not torch's: never read."""

    _workers = [type("P", (), {"pid": 1234})()]


def test_only_torchs_multiprocess_iterator_is_read():
    assert worker_pids(NotALoaderIter()) == []
    assert worker_pids(iter([1, 2])) == []
    assert worker_pids(iter(loader(num_workers=0))) == []


def test_the_reporter_never_raises_and_counts_its_errors():
    def broken_send(msg: dict[str, Any]) -> bool:
        raise RuntimeError("socket gone")

    rep = WorkerReporter("k", broken_send, clock=lambda: 5)
    it = iter(loader(num_workers=2))
    rep.on_iterator(it)
    assert rep.errors == 1
    del it


def test_a_fork_child_reports_nothing():
    sent: list[dict[str, Any]] = []
    pid = [100]
    rep = WorkerReporter("k", sent.append, clock=lambda: 5, getpid=lambda: pid[0])
    it = iter(loader(num_workers=2))
    pid[0] = 101  # as if forked after the reporter was made
    rep.on_iterator(it)
    assert sent == []
    pid[0] = 100
    rep.on_iterator(it)
    rep.on_iterator(it)  # the same pool again: not a new group
    assert [m["loader_seq"] for m in sent] == [0]
    assert {w["pid"] for w in sent[0]["workers"]} == {p.pid for p in it._workers}
    del it


def test_workers_pass_the_daemons_validation():
    nn.Linear(1, 1)  # torch is loaded
    from gpuprof.protocol import decode, encode

    sent: list[dict[str, Any]] = []
    rep = WorkerReporter("k", sent.append, clock=lambda: 5)
    it = iter(loader(num_workers=3))
    rep.on_iterator(it)
    (msg,) = sent
    assert decode(encode(msg), "data") == msg
    assert [w["worker_id"] for w in msg["workers"]] == [0, 1, 2]
    del it
