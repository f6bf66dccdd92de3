"""The shim's own model probes on real CPU torch, against the fake daemon:
one step counted by FlopCounterMode (``count_flops``), the dtype probe,
and the arch option in ``hello``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import gpuprof
from gpuprof.protocol import decode, encode
from gpuprof_shim import flops as shim_flops
from gpuprof_shim import probes as probes_mod

from .tiny_gpt import TinyGPT, train_step

B, T, VOCAB = 4, 32, 128


def profile(socket_dir: Path, name: str = "flops", **kw):
    return gpuprof.profile(name, socket_dir=socket_dir, autostart=False, **kw)


def pretend_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The automatic probes run only with CUDA in use: make the CPU count."""
    monkeypatch.setattr(shim_flops, "MFU_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(probes_mod, "cuda_in_use", lambda: True)


def tiny_arch() -> gpuprof.TransformerArch:
    return gpuprof.TransformerArch(layers=2, d_model=64, heads=4, seq_len=T, vocab=VOCAB)


def counted_by_hand() -> int:
    """FlopCounterMode's own count of one TinyGPT training step."""
    torch.manual_seed(0)
    model = TinyGPT(seq=T, vocab=VOCAB)
    opt = torch.optim.AdamW(model.parameters())
    train_step(model, opt, B, T, VOCAB)  # AdamW's state exists from here on, as in the run
    with FlopCounterMode(display=False) as mode:
        train_step(model, opt, B, T, VOCAB)
    return mode.get_total_flops()


def run(steps: int) -> None:
    torch.manual_seed(0)
    model = TinyGPT(seq=T, vocab=VOCAB)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        train_step(model, opt, B, T, VOCAB)


def test_counted_step_equals_flopcountermode_and_is_traced(socket_dir, fake_daemon):
    with profile(socket_dir, count_flops=True) as prof:
        run(6)
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(6))
    assert [s.get("traced", False) for s in steps] == [i == shim_flops.COUNT_STEP for i in range(6)]
    (info,) = [m for m in fake_daemon.data if m["type"] == "model_info"]
    expected = counted_by_hand()
    assert info["flops_counted"] == expected == tiny_arch().flops_per_step(B * T)
    assert info["flops_step"] == shim_flops.COUNT_STEP
    assert "dtype" not in info  # CPU: no peak, so the dtype is not probed
    (bye,) = fake_daemon.of_type("bye")
    assert bye["sent"] == len(fake_daemon.data) == 7 + fake_daemon.stacks_sent()
    assert prof._flop_counter is not None and not prof._flop_counter.active
    assert not any(isinstance(m, FlopCounterMode) for m in _dispatch_modes())


def _dispatch_modes() -> list:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def test_cpu_run_without_options_sends_no_model_info(socket_dir, fake_daemon):
    with profile(socket_dir):
        run(5)
    assert [m["type"] for m in fake_daemon.data if m["type"] != "stacks"] == ["step"] * 5
    assert not any(s.get("traced") for s in fake_daemon.steps)


def test_automatic_count_on_a_gpu_run_without_declared_flops(socket_dir, fake_daemon, monkeypatch):
    pretend_gpu(monkeypatch)
    with profile(socket_dir):
        run(5)
    infos = [m for m in fake_daemon.data if m["type"] == "model_info"]
    assert [("dtype" in m, "flops_counted" in m) for m in infos] in (
        [(True, True)],
        [(True, False), (False, True)],
    )
    assert infos[-1]["flops_counted"] == counted_by_hand()
    assert [s.get("traced", False) for s in fake_daemon.steps] == [False] * 3 + [True, False]


def test_run_shorter_than_the_counted_step_leaves_no_mode_on(socket_dir, fake_daemon):
    with profile(socket_dir, count_flops=True) as prof:
        run(shim_flops.COUNT_STEP)  # the mode starts at the last step's end
    assert prof._flop_counter is not None and prof._flop_counter.done
    assert prof._flop_counter.flops is None
    assert not _dispatch_modes()
    assert not [m for m in fake_daemon.data if m["type"] == "model_info"]


def test_compiled_model_is_not_counted_and_the_summary_says_so(socket_dir, fake_daemon):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.compile(TinyGPT(seq=T, vocab=VOCAB), backend="eager")
    opt = torch.optim.AdamW(model.parameters())
    with profile(socket_dir, count_flops=True) as prof:
        for _ in range(5):
            train_step(model, opt, B, T, VOCAB)
    assert not [m for m in fake_daemon.data if m["type"] == "model_info"]
    assert any("torch.compile" in n for n in prof.summary["notes"])
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # "compiled once in this process" ends with the test


@pytest.mark.parametrize(
    ("autocast", "expected"), [(True, ("bfloat16", "autocast")), (False, ("float32", "params"))]
)
def test_dtype_probe_reads_autocast_else_parameters(
    socket_dir, fake_daemon, monkeypatch, autocast, expected
):
    pretend_gpu(monkeypatch)
    torch.manual_seed(0)
    model = TinyGPT(seq=T, vocab=VOCAB)
    opt = torch.optim.AdamW(model.parameters())
    with profile(socket_dir, flops_per_step=1e9):
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(torch.randint(0, VOCAB, (B, T)))
            logits.float().mean().backward()
            opt.step()
            opt.zero_grad()
    (info,) = [m for m in fake_daemon.data if m["type"] == "model_info"]
    assert (info["dtype"], info["dtype_source"]) == expected
    assert "flops_counted" not in info  # declared FLOPs: no automatic count
    assert not any(s.get("traced") for s in fake_daemon.steps)


def test_declared_dtype_is_not_probed(socket_dir, fake_daemon, monkeypatch):
    pretend_gpu(monkeypatch)
    with profile(socket_dir, dtype="bf16", flops_per_step=1e9):
        run(3)
    assert not [m for m in fake_daemon.data if m["type"] == "model_info"]


def test_arch_in_hello_gives_flops_per_step(socket_dir, fake_daemon):
    arch = tiny_arch()
    with profile(socket_dir, arch=arch, tokens_per_step=B * T):
        pass
    (hello,) = fake_daemon.of_type("hello")
    opts = hello["options"]
    assert opts["arch"] == arch.to_dict() and opts["arch"]["checkpointing"] is False
    assert opts["flops_per_step"] == arch.flops_per_step(B * T)
    assert (opts["flops_source"], opts["tokens_per_step"]) == ("arch", B * T)
    assert "count_flops" not in opts  # None values are left out


def test_samples_and_tokens_per_step_are_sent_without_arch(socket_dir, fake_daemon):
    """What gpuprofctl compare normalises runs of other shapes by."""
    with profile(socket_dir, samples_per_step=64, tokens_per_step=64 * 128):
        pass
    opts = fake_daemon.of_type("hello")[0]["options"]
    assert (opts["samples_per_step"], opts["tokens_per_step"]) == (64, 64 * 128)
    assert "flops_per_step" not in opts and "arch" not in opts


def test_declared_flops_win_over_arch(socket_dir, fake_daemon):
    with profile(socket_dir, arch=tiny_arch().to_dict(), tokens_per_step=8, flops_per_step=5e9):
        pass
    opts = fake_daemon.of_type("hello")[0]["options"]
    assert (opts["flops_per_step"], opts["flops_source"]) == (5e9, "user")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"arch": tiny_arch()}, "tokens_per_step"),
        ({"arch": "gpt2", "tokens_per_step": 8}, "TransformerArch"),
        ({"arch": {"layers": 1}, "tokens_per_step": 8}, "missing"),
        ({"tokens_per_step": 0}, "tokens_per_step"),
        ({"samples_per_step": 0}, "samples_per_step"),
        ({"samples_per_step": 2.5}, "samples_per_step"),
        ({"count_flops": "yes"}, "count_flops"),
    ],
)
def test_bad_flop_options_raise_before_anything_starts(socket_dir, kw, match):
    with pytest.raises(ValueError, match=match):
        profile(socket_dir, **kw)


def test_protocol_checks_model_info_and_arch_option():
    ok = {"v": 1, "type": "model_info", "run_key": "k"}
    assert decode(encode({**ok, "dtype": "bfloat16", "dtype_source": "autocast"}), "data")
    assert decode(encode({**ok, "flops_counted": 3.3e12, "flops_step": 3}), "data")
    for bad in [
        ok,
        {**ok, "flops_counted": -1.0},
        {**ok, "flops_counted": 1e31},
        {**ok, "dtype": "x" * 33},
        {**ok, "dtype": "bf16", "dtype_source": "guess"},
        {**ok, "flops_counted": 1.0, "flops_step": -1},
    ]:
        with pytest.raises(ValueError):
            decode(encode(bad), "data")
    hello = {
        "v": 1,
        "type": "hello",
        "run_key": "k",
        "run_name": "r",
        "pid": 1,
        "host": "h",
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "wall_ns": 1,
        "mono_ns": 1,
        "auto": True,
    }
    good = {"arch": tiny_arch().to_dict(), "tokens_per_step": 128, "flops_source": "arch"}
    assert decode(encode({**hello, "options": good}), "control")
    assert decode(encode({**hello, "options": {"samples_per_step": 64}}), "control")
    for bad in [
        {**good, "arch": {**good["arch"], "layers": -1}},
        {**good, "tokens_per_step": 0},
        {**good, "samples_per_step": 0},
        {**good, "samples_per_step": "64"},
        {**good, "flops_source": "guess"},
        {**good, "count_flops": 1},
    ]:
        with pytest.raises(ValueError, match="options"):
            decode(encode({**hello, "options": bad}), "control")


def test_a_failing_flop_formula_never_reaches_training(socket_dir, fake_daemon, monkeypatch):
    from torch.utils.flop_counter import FlopCounterMode

    def broken(self, func_packet, out, args, kwargs):
        raise RuntimeError("formula bug")

    monkeypatch.setattr(FlopCounterMode, "_count_flops", broken)
    with profile(socket_dir, count_flops=True) as prof:
        run(5)  # trains through the counted step
    assert [s["i"] for s in fake_daemon.steps] == list(range(5))
    assert not [m for m in fake_daemon.data if m["type"] == "model_info"]
    assert any("failed on an operator" in n for n in prof.summary["notes"])
