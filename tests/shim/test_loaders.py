"""The shim reads each DataLoader's settings from the iterators torch hands out."""

from __future__ import annotations

from torch.utils.data import DataLoader

from gpuprof.protocol import decode, encode
from gpuprof_shim.loaders import LoaderReporter, loader_settings


def test_settings_of_in_process_and_worker_loaders():
    data = list(range(8))
    plain = iter(DataLoader(data))
    assert loader_settings(plain) == {
        "num_workers": 0,
        "persistent_workers": False,
        "pin_memory": False,
        "prefetch_factor": None,
    }
    dl = DataLoader(data, num_workers=1, persistent_workers=True, prefetch_factor=3)
    it = iter(dl)
    try:
        assert loader_settings(it) == {
            "num_workers": 1,
            "persistent_workers": True,
            "pin_memory": False,
            "prefetch_factor": 3,
        }
    finally:
        del it, dl
    assert loader_settings(iter([1, 2])) is None  # not a DataLoader's iterator


def test_reporter_sends_each_new_combination_once_as_a_valid_message():
    sent: list[dict] = []
    rep = LoaderReporter("k1", lambda m: sent.append(m) or True)
    loader = DataLoader(list(range(4)))
    for _ in range(3):  # three epochs of one loader: one report
        rep.on_iterator(iter(loader))
    rep.on_iterator(iter(DataLoader(list(range(9)), batch_size=3)))  # same settings: no news
    rep.on_iterator(object())  # not a loader: nothing, no error
    assert len(sent) == 1 and rep.errors == 0
    assert decode(encode(sent[0]), "data")["loaders"][0]["num_workers"] == 0
