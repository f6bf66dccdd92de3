"""gpuprof.LightningCallback with real PyTorch Lightning fits on the CPU,
against the fake daemon: exact steps, micro-batches and evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gpuprof

L = pytest.importorskip("lightning.pytorch")

#: Lightning 2.6's own use of an API torch 2.13 deprecates (not gpuprof's).
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*isinstance.treespec, LeafSpec.* is deprecated:FutureWarning"
)

BATCH = 4


def loader(batches: int, seed: int = 0) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    n = batches * BATCH
    data = torch.utils.data.TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,)))
    return torch.utils.data.DataLoader(data, batch_size=BATCH)


class Classifier(L.LightningModule):
    """Automatic optimization: one SGD."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Validated(Classifier):
    """With a validation step that counts its batches."""

    def __init__(self) -> None:
        super().__init__()
        self.val_batches = 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.val_batches += 1
        nn.functional.cross_entropy(self.layer(x), y)


class Gan(L.LightningModule):
    """Manual optimization, GAN style: the discriminator's and the
    generator's optimizer each step once per ``training_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.gen = nn.Linear(4, 8)
        self.disc = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, _ = batch
        opt_d, opt_g = self.optimizers()
        fake = self.gen(torch.randn(real.shape[0], 4))
        d_loss = self.disc(real).mean() - self.disc(fake.detach()).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = -self.disc(self.gen(torch.randn(real.shape[0], 4))).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.SGD(self.disc.parameters(), lr=0.01),
            torch.optim.Adam(self.gen.parameters(), lr=0.01),
        ]


def trainer(callback: gpuprof.LightningCallback, **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "max_epochs": 1,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "accelerator": "cpu",
        "devices": 1,
    }
    return L.Trainer(callbacks=[callback], **{**options, **kwargs})


def callback(socket_dir: Path, name: str = "lit") -> gpuprof.LightningCallback:
    return gpuprof.LightningCallback(
        run_name=name, socket_dir=socket_dir, autostart=False, print_summary=False
    )


def test_is_a_callback_of_the_installed_lightning(socket_dir):
    cb = callback(socket_dir)
    assert isinstance(cb, L.Callback)
    pl = pytest.importorskip("pytorch_lightning")
    assert isinstance(cb, pl.Callback)  # either package's Trainer accepts it


def test_automatic_optimization_one_step_per_batch(socket_dir, fake_daemon):
    cb = callback(socket_dir)
    trainer(cb, max_epochs=2).fit(Classifier(), loader(5))
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(10))
    # training_step + backward run in optimizer.step(closure): one micro-batch
    assert [s["micro"] for s in steps] == [1] * 10
    for s in steps:
        assert s["phases"]["forward"] > 0 and s["phases"]["backward"] > 0
        assert [(o["name"], o["updates"], o["skipped"]) for o in s["optimizers"]] == [
            ("SGD#0", 1, 0)
        ]
        assert "skipped" not in s and "eval" not in s
    (hello,) = fake_daemon.of_type("hello")
    assert hello["run_name"] == "lit"
    (bye,) = fake_daemon.of_type("bye")
    sent = 11 + fake_daemon.stacks_sent()  # + the loader's settings
    assert (bye["status"], bye["sent"]) == ("finished", sent)
    assert gpuprof_inactive()


@pytest.mark.parametrize(
    ("batches", "accumulate", "micro"),
    [(6, 2, [2, 2, 2]), (5, 2, [2, 2, 1]), (7, 3, [3, 3, 1])],
)
def test_accumulate_grad_batches(socket_dir, fake_daemon, batches, accumulate, micro):
    cb = callback(socket_dir)
    trainer(cb, accumulate_grad_batches=accumulate).fit(Classifier(), loader(batches))
    steps = fake_daemon.steps
    # the last window of an epoch steps even when short (Lightning's rule)
    assert [s["micro"] for s in steps] == micro
    assert all(s["optimizers"][0]["updates"] == 1 for s in steps)


def test_manual_optimization_two_optimizers_one_step_per_batch(socket_dir, fake_daemon):
    cb = callback(socket_dir)
    trainer(cb).fit(Gan(), loader(4))
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == [0, 1, 2, 3]
    # the generator's backward joined the step after the primary stepped
    assert [s["micro"] for s in steps] == [1, 1, 1, 1]
    for s in steps:
        assert [(o["name"], o["updates"], o["skipped"]) for o in s["optimizers"]] == [
            ("SGD#0", 1, 0),
            ("Adam#1", 1, 0),
        ]


def test_validation_and_sanity_check_are_eval_not_steps(socket_dir, fake_daemon):
    model = Validated()
    cb = callback(socket_dir)
    # sanity check: 2 batches (Lightning's default) before step 0; validation:
    # 3 batches after each epoch: before step 4, and after the last step
    trainer(cb, max_epochs=2, limit_val_batches=3, num_sanity_val_steps=2).fit(
        model, loader(4), loader(3, seed=1)
    )
    assert model.val_batches == 2 + 3 + 3
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(8))
    assert [s["micro"] for s in steps] == [1] * 8
    assert [i for i, s in enumerate(steps) if "eval" in s] == [0, 4]
    assert steps[0]["eval"] > 0 and steps[4]["eval"] > 0
    # the validation between epochs is not loader wait
    assert steps[4]["wait"] + steps[4]["eval"] <= steps[4]["t0"] - steps[3]["t1"]
    (bye,) = fake_daemon.of_type("bye")
    assert bye["eval_ns"] > 0  # the validation after the last step


def test_one_batch_validations_are_still_eval(socket_dir, fake_daemon):
    """Auto mode alone would take one or two no-grad calls right before a
    training forward for a teacher's; the callback marks each validation end."""
    model = Validated()
    cb = callback(socket_dir)
    trainer(cb, max_epochs=2, limit_val_batches=1, num_sanity_val_steps=1).fit(
        model, loader(3), loader(1, seed=1)
    )
    assert model.val_batches == 1 + 1 + 1
    steps = fake_daemon.steps
    assert [s["micro"] for s in steps] == [1] * 6
    assert [i for i, s in enumerate(steps) if "eval" in s] == [0, 3]
    assert steps[0]["eval"] > 0 and steps[3]["eval"] > 0  # the one call's duration
    (bye,) = fake_daemon.of_type("bye")
    assert bye["eval_ns"] > 0


def test_validation_every_n_steps_inside_an_epoch(socket_dir, fake_daemon):
    cb = callback(socket_dir)
    trainer(cb, limit_val_batches=4, val_check_interval=3).fit(
        Validated(), loader(6), loader(4, seed=1)
    )
    steps = fake_daemon.steps
    assert len(steps) == 6
    assert [i for i, s in enumerate(steps) if "eval" in s] == [3]
    (bye,) = fake_daemon.of_type("bye")
    assert bye["eval_ns"] > 0


class Exploding(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 2:
            raise ValueError("boom in training_step")
        return super().training_step(batch, batch_idx)


def test_exception_marks_the_run_failed_and_restores_torch(socket_dir, fake_daemon):
    cb = callback(socket_dir)
    with pytest.raises(ValueError, match="boom in training_step"):
        trainer(cb).fit(Exploding(), loader(5))
    (bye,) = fake_daemon.of_type("bye")
    assert bye["status"] == "failed"
    assert bye["error"] == "ValueError: boom in training_step"
    steps = fake_daemon.steps
    assert [s["micro"] for s in steps[:2]] == [1, 1]
    # batch 2 raised inside optimizer.step(closure): auto mode flushes that
    # half-begun step at exit, with no micro-batch and no update
    assert [s["micro"] for s in steps[2:]] in ([], [0])
    assert sum(o["updates"] for s in steps for o in s["optimizers"]) == 2
    assert gpuprof_inactive()


def test_second_fit_is_a_second_run(socket_dir, fake_daemon):
    cb = callback(socket_dir)
    model = Classifier()
    trainer(cb).fit(model, loader(2))
    first = cb.profiler
    trainer(cb).fit(model, loader(3))
    assert cb.profiler is not first
    hellos, byes = fake_daemon.of_type("hello"), fake_daemon.of_type("bye")
    assert len(hellos) == len(byes) == 2
    keys = [h["run_key"] for h in hellos]
    assert [sum(s["run_key"] == k for s in fake_daemon.steps) for k in keys] == [2, 3]


def test_an_active_profile_elsewhere_leaves_the_fit_unprofiled(socket_dir, fake_daemon, caplog):
    cb = callback(socket_dir, "inner")
    with gpuprof.profile("outer", socket_dir=socket_dir, autostart=False, print_summary=False):
        trainer(cb).fit(Classifier(), loader(3))
    assert cb.profiler is None
    assert "not profiling this run" in caplog.text
    # the outer profile saw the fit's steps itself
    assert [h["run_name"] for h in fake_daemon.of_type("hello")] == ["outer"]
    assert len(fake_daemon.steps) == 3


def test_reserved_options_are_refused(socket_dir):
    with pytest.raises(TypeError, match="step_source"):
        gpuprof.LightningCallback("x", step_source="external")
    with pytest.raises(TypeError, match="auto"):
        gpuprof.LightningCallback("x", auto=False)
    with pytest.raises(ValueError, match="flops_per_step"):
        gpuprof.LightningCallback("x", flops_per_step=-1)


def gpuprof_inactive() -> bool:
    from gpuprof_shim.session import active_profiler

    return active_profiler() is None
