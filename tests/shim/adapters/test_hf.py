"""gpuprof.HFTrainerCallback with a real transformers Trainer on the CPU (a
tiny nn.Module returning ``{"loss": ...}``; nothing downloaded), against the
fake daemon: exact steps, micro-batches and evaluation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gpuprof

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

BATCH = 4


class Tiny(nn.Module):
    """The Trainer only needs ``forward(**batch) -> {"loss": ...}``; it
    raises in forward number *explode_at* (counted from 1) if given."""

    def __init__(self, explode_at: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)
        self.calls = 0
        self.explode_at = explode_at

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.calls == self.explode_at:
            raise ValueError("boom in forward")
        logits = self.layer(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def make_trainer(
    tmp_path: Path,
    cb: gpuprof.HFTrainerCallback,
    *,
    batches: int,
    model: nn.Module | None = None,
    eval_batches: int = 0,
    **kwargs: Any,
) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        num_train_epochs=1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **kwargs,
    )
    return transformers.Trainer(
        model=model if model is not None else Tiny(),
        args=args,
        train_dataset=Rows(batches * BATCH),
        eval_dataset=Rows(eval_batches * BATCH) if eval_batches else None,
        callbacks=[cb],
    )


def callback(socket_dir: Path, name: str = "hf") -> gpuprof.HFTrainerCallback:
    return gpuprof.HFTrainerCallback(
        run_name=name, socket_dir=socket_dir, autostart=False, print_summary=False
    )


def active() -> Any:
    from gpuprof_shim.session import active_profiler

    return active_profiler()


def test_gradient_accumulation_with_an_uneven_last_window(tmp_path, socket_dir, fake_daemon):
    cb = callback(socket_dir)
    make_trainer(tmp_path, cb, batches=5, gradient_accumulation_steps=2).train()
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == [0, 1, 2]
    assert [s["micro"] for s in steps] == [2, 2, 1]
    for s in steps:
        assert [(o["name"], o["updates"], o["skipped"]) for o in s["optimizers"]] == [
            ("AdamW#0", 1, 0)
        ]
        assert s["phases"]["forward"] > 0 and s["phases"]["backward"] > 0
        assert "skipped" not in s and "eval" not in s
    (bye,) = fake_daemon.of_type("bye")
    sent = 4 + fake_daemon.stacks_sent()  # 3 steps + the loader's settings
    assert (bye["status"], bye["sent"]) == ("finished", sent)
    assert "eval_ns" not in bye
    assert active() is None


def test_max_steps_ends_training_early(tmp_path, socket_dir, fake_daemon):
    cb = callback(socket_dir)
    make_trainer(tmp_path, cb, batches=10, max_steps=3).train()
    assert [s["micro"] for s in fake_daemon.steps] == [1, 1, 1]


def test_evaluation_during_training_is_eval_not_steps(tmp_path, socket_dir, fake_daemon):
    cb = callback(socket_dir)
    trainer = make_trainer(
        tmp_path, cb, batches=4, eval_batches=3, eval_strategy="steps", eval_steps=2
    )
    trainer.train()
    steps = fake_daemon.steps
    # eval after steps 2 and 4 (3 batches each): before step index 2, and trailing
    assert [s["micro"] for s in steps] == [1, 1, 1, 1]
    assert [i for i, s in enumerate(steps) if "eval" in s] == [2]
    assert steps[2]["wait"] + steps[2]["eval"] <= steps[2]["t0"] - steps[1]["t1"]
    (bye,) = fake_daemon.of_type("bye")
    assert bye["eval_ns"] > 0


def test_a_one_batch_evaluation_is_still_eval(tmp_path, socket_dir, fake_daemon):
    cb = callback(socket_dir)
    trainer = make_trainer(
        tmp_path, cb, batches=3, eval_batches=1, eval_strategy="steps", eval_steps=1
    )
    trainer.train()
    steps = fake_daemon.steps
    assert [s["micro"] for s in steps] == [1, 1, 1]
    assert [i for i, s in enumerate(steps) if "eval" in s] == [1, 2]
    (bye,) = fake_daemon.of_type("bye")
    assert bye["eval_ns"] > 0


def test_second_train_call_is_a_second_run(tmp_path, socket_dir, fake_daemon):
    cb = callback(socket_dir)
    trainer = make_trainer(tmp_path, cb, batches=2)
    trainer.train()
    trainer.train()
    hellos, byes = fake_daemon.of_type("hello"), fake_daemon.of_type("bye")
    assert [b["status"] for b in byes] == ["finished", "finished"]
    keys = [h["run_key"] for h in hellos]
    assert [[s["i"] for s in fake_daemon.steps if s["run_key"] == k] for k in keys] == [
        [0, 1],
        [0, 1],
    ]


def test_train_raising_inside_the_callback_context_is_failed(tmp_path, socket_dir, fake_daemon):
    cb = callback(socket_dir)
    trainer = make_trainer(tmp_path, cb, batches=5, model=Tiny(explode_at=3))
    with pytest.raises(ValueError, match="boom in forward"):
        with cb:
            trainer.train()
    assert active() is None
    (bye,) = fake_daemon.of_type("bye")
    assert (bye["status"], bye["error"]) == ("failed", "ValueError: boom in forward")
    assert [s["micro"] for s in fake_daemon.steps] == [1, 1]


def test_train_raising_without_the_context_is_failed_at_the_next_train(
    tmp_path, socket_dir, fake_daemon
):
    cb = callback(socket_dir)
    trainer = make_trainer(tmp_path, cb, batches=3, model=Tiny(explode_at=2))
    with pytest.raises(ValueError, match="boom in forward"):
        trainer.train()
    assert active() is cb.profiler  # nothing told the callback
    trainer.train()  # the model no longer raises
    assert active() is None
    first, second = fake_daemon.of_type("bye")
    assert first["status"] == "failed"
    assert "restarted before it ended" in first["error"]
    assert second["status"] == "finished"


def test_events_out_of_order_never_raise_or_send(socket_dir, fake_daemon):
    cb = callback(socket_dir)
    args = state = control = None
    cb.on_step_end(args, state, control)  # no on_train_begin
    cb.on_substep_end(args, state, control)
    cb.on_train_end(args, state, control)
    with cb:
        pass
    assert fake_daemon.control == [] and fake_daemon.data == []
    cb.on_train_begin(args, state, control)
    cb.on_train_end(args, state, control)
    cb.on_train_end(args, state, control)  # a second end: nothing more
    assert [m["type"] for m in fake_daemon.control] == ["hello", "bye"]
    assert fake_daemon.steps == []  # no activity, no step


def test_skipped_update_reported_by_the_optimizer(socket_dir, fake_daemon):
    """accelerate's optimizer says when loss scaling skipped its update."""

    class Skipping:
        step_was_skipped = True

    model = nn.Linear(2, 1)
    cb = callback(socket_dir)
    cb.on_train_begin(None, None, None)
    model(torch.randn(3, 2)).sum().backward()
    cb.on_step_end(None, None, None, optimizer=Skipping())
    cb.on_train_end(None, None, None)
    (step,) = fake_daemon.steps
    assert (step["micro"], step["skipped"]) == (1, True)


def test_reserved_options_are_refused():
    with pytest.raises(TypeError, match="step_source"):
        gpuprof.HFTrainerCallback("x", step_source="optimizer")
