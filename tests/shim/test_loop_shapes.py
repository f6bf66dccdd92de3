"""The loop shapes people really write, run for real (CPU torch) under auto
mode against the fake daemon: exact steps, micro-batches and phases."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import gpuprof

from .training import MLP


def profile(socket_dir: Path, name: str = "shape", **kw):
    return gpuprof.profile(name, socket_dir=socket_dir, autostart=False, print_summary=False, **kw)


def batch(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 8), torch.randint(0, 3, (n,))


def summary(steps: list[dict]) -> list[tuple[int, int]]:
    return [(s["i"], s["micro"]) for s in steps]


# --- gradient accumulation -----------------------------------------------------


def test_accumulation_with_an_uneven_last_window(socket_dir, fake_daemon):
    model, loss_fn = MLP(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches, accum = 10, 4  # windows of 4, 4 and a last one of 2
    with profile(socket_dir):
        for i in range(batches):
            x, y = batch()
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0 or i == batches - 1:
                opt.step()
                opt.zero_grad()
    assert summary(fake_daemon.steps) == [(0, 4), (1, 4), (2, 2)]
    for s in fake_daemon.steps:
        assert s["phases"]["forward"] > 0 and s["phases"]["backward"] > 0
        assert s["optimizers"][0]["updates"] == 1


def test_accumulation_windows_that_cross_an_epoch_end(socket_dir, fake_daemon):
    model, loss_fn = MLP(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [batch() for _ in range(5)]  # 5 batches per epoch, windows of 3
    seen = 0
    with profile(socket_dir):
        for _epoch in range(3):
            for x, y in data:
                loss_fn(model(x), y).backward()
                seen += 1
                if seen % 3 == 0:
                    opt.step()
                    opt.zero_grad()
        # 15 micro-batches: 5 full windows, none left over
    assert summary(fake_daemon.steps) == [(i, 3) for i in range(5)]


def test_micro_batches_left_without_an_update_at_exit_are_not_a_step(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir) as prof:
        for i in range(5):
            model(batch()[0]).sum().backward()
            if i == 1:
                opt.step()
    assert summary(fake_daemon.steps) == [(0, 2)]  # one step per real update
    assert prof.machine.unfinished_micro == 3
    assert "3 micro-batches after the last optimizer update" in " ".join(prof.summary["notes"])


def test_a_step_whose_closure_raises_is_not_counted(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    calls = []

    def closure():
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("boom in the closure")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="boom"), profile(socket_dir):
        for _ in range(10):
            opt.step(closure)
    assert summary(fake_daemon.steps) == [(0, 1), (1, 1), (2, 1)]  # three completed updates
    (bye,) = fake_daemon.of_type("bye")
    assert bye["status"] == "failed"


# --- mixed precision -------------------------------------------------------------


def test_grad_scaler_skipped_update_is_its_own_step_marked_skipped(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    with profile(socket_dir):
        for i in range(4):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(batch()[0]).float().square().mean()
            if i in (1, 2):
                loss = loss * float("inf")  # inf gradients: the scaler skips the update
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    steps = fake_daemon.steps
    assert summary(steps) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert [s.get("skipped", False) for s in steps] == [False, True, True, False]
    assert [(o["updates"], o["skipped"]) for s in steps for o in s["optimizers"]] == [
        (1, 0),
        (0, 1),
        (0, 1),
        (1, 0),
    ]
    assert scaler.get_scale() == 2.0**6  # halved twice: the scaler itself did its job
    assert fake_daemon.errors == []  # every frame passed the daemon's validation


# --- several optimizers ------------------------------------------------------------


def test_gan_discriminator_and_generator_make_one_step_per_iteration(socket_dir, fake_daemon):
    gen = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
    disc = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(disc.parameters(), lr=1e-2)
    bce = nn.BCEWithLogitsLoss()
    with profile(socket_dir):
        for _ in range(4):
            real, z = torch.randn(6, 8), torch.randn(6, 4)
            fake = gen(z)
            d_loss = bce(disc(real), torch.ones(6, 1)) + bce(disc(fake.detach()), torch.zeros(6, 1))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = bce(disc(fake), torch.ones(6, 1))
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(4)]
    for s in steps:
        assert [(o["name"], o["updates"]) for o in s["optimizers"]] == [("SGD#0", 1), ("Adam#1", 1)]
        opt_ns = sum(o["ns"] for o in s["optimizers"])
        assert s["phases"]["optimizer"] == opt_ns
        # the generator's backward belongs to the step too
        assert s["phases"]["backward"] > 0
    for a, b in zip(steps, steps[1:], strict=False):
        assert b["t0"] >= a["t1"]
    assert fake_daemon.errors == []


# --- closures ----------------------------------------------------------------------------


def test_lbfgs_closure_forward_backward_are_not_optimizer_time(socket_dir, fake_daemon):
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    calls = []
    x, y = torch.randn(32, 8), torch.randn(32, 1)

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with profile(socket_dir):
        for _ in range(3):
            opt.step(closure)
    steps = fake_daemon.steps
    assert len(calls) > 3  # LBFGS evaluated the closure several times per step
    assert summary(steps) == [(0, 1), (1, 1), (2, 1)]
    for s in steps:
        ph = s["phases"]
        assert ph["forward"] > 0 and ph["backward"] > 0
        # the three phases partition step(): optimizer time excludes the closures
        assert ph["forward"] + ph["backward"] + ph["optimizer"] <= s["t1"] - s["t0"]
        assert s["optimizers"][0]["ns"] == ph["optimizer"]


# --- LR schedulers -------------------------------------------------------------------------


def _scheduled_run(socket_dir: Path | None, attach: str) -> list[float]:
    """Train 6 steps with a StepLR; gpuprof attached before the scheduler is
    created, after it, or not at all. Returns the LR seen at each step."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lrs = []
    prof = profile(socket_dir) if socket_dir is not None else None
    if prof is not None and attach == "before":
        prof.start()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    if prof is not None and attach == "after":
        prof.start()
    try:
        for _ in range(6):
            model(batch()[0]).sum().backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            lrs.append(opt.param_groups[0]["lr"])
    finally:
        if prof is not None:
            prof.stop()
    return lrs


@pytest.mark.parametrize("attach", ["before", "after"])
def test_lr_scheduler_unchanged_and_warning_free(socket_dir, fake_daemon, attach):
    baseline = _scheduled_run(None, "none")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lrs = _scheduled_run(socket_dir, attach)
    assert lrs == baseline == [0.1, 0.05, 0.05, 0.025, 0.025, 0.0125]
    assert [str(w.message) for w in caught] == []
    assert len(fake_daemon.steps) == 6


def test_scheduler_stepped_before_optimizer_still_warns_as_without_gpuprof(socket_dir, fake_daemon):
    """gpuprof must not hide torch's own warning about a real misuse either."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        misuse = r"lr_scheduler\.step\(\)` before `optimizer\.step\(\)"
        with pytest.warns(UserWarning, match=misuse):
            sched.step()
            model(batch()[0]).sum().backward()
            opt.step()


# --- what is not a forward, what is not a training step ------------------------------------


def test_loss_module_and_teacher_under_no_grad_are_not_forwards(socket_dir, fake_daemon):
    student, teacher = MLP(), MLP()
    loss_fn = nn.KLDivLoss(reduction="batchmean")
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    teacher_spans = []
    with profile(socket_dir):
        for _ in range(5):
            x = batch()[0]
            with torch.no_grad():
                ta = time.monotonic_ns()
                logits = teacher(x)
                teacher_spans.append((ta, time.monotonic_ns()))
                target = logits.softmax(-1)
            loss = loss_fn(student(x).log_softmax(-1), target)
            loss.backward()
            opt.step()
            opt.zero_grad()
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(5)]
    for s, (ta, tb) in zip(steps, teacher_spans, strict=True):
        # the teacher's forward is never loader wait: normally it starts the
        # step (it ran right before the student); if another thread held the
        # GIL for over 1 ms in between, it is the step's eval time instead
        assert s["t0"] <= tb or s.get("eval", 0) >= (tb - ta) // 2, (s, ta, tb)


def test_an_ema_forward_after_the_update_is_eval_not_wait(socket_dir, fake_daemon):
    model, ema = MLP(), MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        for _ in range(5):
            time.sleep(0.01)  # loading the batch
            model(batch()[0]).sum().backward()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():  # EMA update and its forward, after the step
                for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                    pe.mul_(0.9).add_(pm, alpha=0.1)
                ema(batch(256)[0])
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(5)]
    assert [("eval" in s) for s in steps] == [False] + [True] * 4
    for s in steps[1:]:
        assert s["wait"] >= 9_000_000  # the 10 ms sleep is wait; the EMA forward is not


@pytest.mark.parametrize("no_grad", [torch.no_grad, torch.inference_mode])
def test_eval_loop_between_epochs_is_eval_time_not_loader_stall(socket_dir, fake_daemon, no_grad):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_data = [batch() for _ in range(3)]
    val_data = [batch(64) for _ in range(40)]
    eval_loop_ns = []
    with profile(socket_dir) as prof:
        for _epoch in range(2):
            model.train()
            for x, y in train_data:
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            model.eval()
            t = time.monotonic_ns()
            with no_grad():
                for x, _ in val_data:
                    model(x)
            eval_loop_ns.append(time.monotonic_ns() - t)
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(6)]
    # the first epoch's validation sits in the gap before step 3
    assert [("eval" in s) for s in steps] == [False, False, False, True, False, False]
    gap = steps[3]["t0"] - steps[2]["t1"]
    assert 0.8 * eval_loop_ns[0] <= steps[3]["eval"] <= eval_loop_ns[0]
    assert steps[3]["wait"] == gap - steps[3]["eval"]
    # the second validation comes after the last step: counted at exit
    assert prof.machine.trailing_eval_ns > 0
    (bye,) = fake_daemon.of_type("bye")
    assert bye["eval_ns"] == prof.machine.trailing_eval_ns


def test_lazily_constructed_optimizer_is_observed(socket_dir, fake_daemon):
    model = MLP()
    with profile(socket_dir):
        opt = None
        for _ in range(4):
            model(batch()[0]).sum().backward()
            if opt is None:  # as HF Trainer and DeepSpeed do: built after the first batch
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            opt.step()
            opt.zero_grad()
    assert summary(fake_daemon.steps) == [(i, 1) for i in range(4)]
    assert {o["name"] for s in fake_daemon.steps for o in s["optimizers"]} == {"AdamW#0"}


def test_rebuilt_optimizer_takes_over_as_the_step_source(socket_dir, fake_daemon):
    model = MLP()
    with profile(socket_dir):
        for phase_lr in (0.1, 0.01):  # e.g. a fine-tuning stage with a new optimizer
            opt = torch.optim.SGD(model.parameters(), lr=phase_lr)
            for _ in range(3):
                model(batch()[0]).sum().backward()
                opt.step()
                opt.zero_grad()
            del opt
    assert summary(fake_daemon.steps) == [(i, 1) for i in range(6)]


def test_an_eval_only_model_first_used_late_is_still_eval_time(socket_dir, fake_daemon):
    """The forward detector hooks the models it saw in its first window; an
    EMA copy evaluated only at epoch end is found when eval()/the val loader
    starts, so its time is eval, not loader wait."""
    model, ema = MLP(), MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    val = torch.utils.data.DataLoader(torch.randn(40, 8), batch_size=2)
    eval_forward_ns = []
    with profile(socket_dir) as prof:
        for _epoch in range(2):
            for _ in range(4):
                nn.functional.cross_entropy(model(batch()[0]), batch()[1]).backward()
                opt.step()
                opt.zero_grad()
            ema.eval()
            spent = 0
            with torch.no_grad():
                for x in val:
                    t = time.monotonic_ns()
                    ema(x)
                    spent += time.monotonic_ns() - t
            eval_forward_ns.append(spent)
            ema.train()
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(8)]
    assert [("eval" in s) for s in steps] == [False] * 4 + [True] + [False] * 3
    # the eval span covers the EMA forwards (and the val loading between them) ...
    assert steps[4]["eval"] >= 0.9 * eval_forward_ns[0]
    # ... and is taken out of the gap, not counted as loader wait
    assert steps[4]["wait"] == steps[4]["t0"] - steps[3]["t1"] - steps[4]["eval"]
    assert prof.machine.trailing_eval_ns >= 0.9 * eval_forward_ns[1]


def test_two_training_stages_with_both_optimizers_alive(socket_dir, fake_daemon):
    backbone, head = nn.Linear(8, 8), nn.Linear(8, 3)
    model = nn.Sequential(backbone, nn.ReLU(), head)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.1)  # stage 1: linear probe
    opt_full = torch.optim.Adam(model.parameters(), lr=1e-3)  # stage 2: fine-tune
    with profile(socket_dir):
        for opt in (opt_head, opt_full):
            for _ in range(5):
                model(batch()[0]).sum().backward()
                opt.step()
                opt.zero_grad()
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(10)]
    assert [[o["name"] for o in s["optimizers"]] for s in steps] == [["SGD#0"]] * 5 + [
        ["Adam#1"]
    ] * 5


def test_a_failing_step_caught_by_the_loop_does_not_stall_counting(socket_dir, fake_daemon):
    model = MLP()

    class Flaky(torch.optim.SGD):
        calls = 0

        def step(self, closure=None):
            Flaky.calls += 1
            if Flaky.calls == 3:
                raise RuntimeError("out of memory (simulated)")
            return super().step(closure)

    opt = Flaky(model.parameters(), lr=0.1)
    with profile(socket_dir):
        for _ in range(8):
            model(batch()[0]).sum().backward()
            try:
                opt.step()
            except RuntimeError:
                pass  # an OOM-skip loop
            opt.zero_grad()
    # 7 updates: 7 steps; the failed iteration's micro-batch joins the next one
    assert summary(fake_daemon.steps) == [(0, 1), (1, 1), (2, 2)] + [(i, 1) for i in range(3, 7)]


# --- loader wait is loading --------------------------------------------------------------


class _Sleepy(torch.utils.data.Dataset):
    """A dataset whose items take *sleep_s* to load."""

    def __init__(self, n: int, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.randn(8), i % 3


def test_work_between_steps_is_not_loader_wait_with_a_dataloader(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_Sleepy(24, sleep_s=0.001), batch_size=4)
    with profile(socket_dir):
        for x, y in loader:  # 4 ms of loading per batch
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)  # logging / checkpointing after the update: not loading
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(6)]
    for a, b in zip(steps, steps[1:], strict=False):
        gap = b["t0"] - a["t1"]
        assert b["explicit"] is True
        assert gap >= 20_000_000  # the sleep is in the gap ...
        assert 3_500_000 <= b["wait"] < 15_000_000  # ... but only the loading is wait


def test_a_model_gpuprof_cannot_see_still_gets_true_loader_wait(socket_dir, fake_daemon):
    weight = torch.randn(8, 3, requires_grad=True)

    def model(x):  # a plain function of tensors: no nn.Module forward to find
        return (x @ weight).tanh()

    opt = torch.optim.SGD([weight], lr=0.1)
    loader = torch.utils.data.DataLoader(_Sleepy(16), batch_size=4)
    with profile(socket_dir):
        for x, _ in loader:
            for _ in range(200):  # a slow forward (~ms)
                out = model(x)
            out.sum().backward()
            opt.step()
            opt.zero_grad()
    steps = fake_daemon.steps
    assert len(steps) == 4
    for a, b in zip(steps, steps[1:], strict=False):
        assert b["explicit"] is True
        # the unseen forward sits in the gap, but it is not loader wait
        assert b["wait"] < (b["t0"] - a["t1"]) / 2


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_validation_loader_with_workers_is_eval_time_from_its_start(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = [batch() for _ in range(3)]
    val = torch.utils.data.DataLoader(
        _Sleepy(24, sleep_s=0.002), batch_size=4, num_workers=2, multiprocessing_context="fork"
    )
    eval_loop_ns = []
    with profile(socket_dir):
        for _epoch in range(2):
            for x, y in train:
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            t = time.monotonic_ns()
            with torch.no_grad():
                for x, _ in val:  # workers start here: part of evaluating
                    model(x)
            eval_loop_ns.append(time.monotonic_ns() - t)
    steps = fake_daemon.steps
    assert summary(steps) == [(i, 1) for i in range(6)]
    assert 0.9 * eval_loop_ns[0] <= steps[3]["eval"] <= eval_loop_ns[0]
    assert steps[3]["wait"] < 0.1 * steps[3]["eval"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_torchscript_model_trains_without_internal_errors(socket_dir, fake_daemon, caplog):
    model = torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        for _ in range(6):
            model(batch()[0]).sum().backward()
            opt.step()
            opt.zero_grad()
    assert summary(fake_daemon.steps) == [(i, 1) for i in range(6)]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
