"""What the shim learns about the model by itself: its compute dtype and,
once, the FLOP of one training step.

**FLOPs** (:class:`StepFlopCounter`): when the user declared neither
``flops_per_step`` nor ``arch`` and trains on a GPU (:data:`MFU_DEVICES`;
on the CPU there is no peak, so no MFU to give), or passed
``count_flops=True``, one step (:data:`COUNT_STEP`, the fourth:
past the cold first steps and the profiler's own warm-up snapshots at 0
and 1) runs under ``torch.utils.flop_counter.FlopCounterMode``. The mode
starts when the step before it ends and stops when the step ends, on the
training thread, so it sees the step's forward, backward (with any
checkpointing recompute) and optimizer. It counts matmuls, convolutions
and attention by their shapes, not elementwise ops. It slows that one step
(``bench/flop_counter_cost.py``, 2-vCPU VM, one torch thread, 2026-11-30:
a 4-layer d=256 GPT's 556–666 ms CPU step took 1.24–1.35 × as long,
+130–235 ms; a toy d=64 model's 10–16 ms step 5–6 ×, +50–70 ms: the mode's
Python work per op, which on a GPU is host time the step waits for), so
the step is sent with ``traced`` for the statistics to leave out. A model
compiled with ``torch.compile`` is not counted: the mode would make dynamo
recompile it (seconds), and the compiled kernels bypass the counter.

**dtype** (:class:`DtypeProbe`): at the first training forward the step
machine reads the autocast state (no hook of its own: a global module hook
would make dynamo recompile a compiled model); when that step ends, the
dtype is autocast's for the trained parameters' device if it was on, else
the parameters' own (``float32`` on CUDA with TF32 matmuls allowed is
``tf32``). Like the automatic count, only on a GPU. Everything here is
best effort: it never raises into training.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("gpuprof.shim")

#: The step counted by FlopCounterMode (0-based). Not 0 (lazy init, compile,
#: cuDNN autotuning) and not 1 or 5 (the profiler's automatic snapshots).
COUNT_STEP = 3


def torch_dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``."""
    text = str(dtype)
    return text[len("torch.") :] if text.startswith("torch.") else text


#: Device types whose autocast state the probe reads.
AUTOCAST_DEVICES = ("cuda", "cpu", "xpu", "mps")


def autocast_dtypes() -> dict[str, str]:
    """Device type → autocast dtype name, for each device with autocast on
    now (empty when none is, or on torch < 2.4). Never raises."""
    out: dict[str, str] = {}
    try:
        import torch

        for device in AUTOCAST_DEVICES:
            try:
                if torch.is_autocast_enabled(device):
                    out[device] = torch_dtype_name(torch.get_autocast_dtype(device))
            except Exception:  # torch < 2.4, or a device type this build lacks
                continue
    except Exception:
        log.debug("gpuprof: could not read autocast", exc_info=True)
    return out


#: Devices where the automatic probes run: MFU needs a datasheet peak, and
#: the peak table (gpuprof.gpus) has GPUs only. ``count_flops=True`` counts
#: on any device.
MFU_DEVICES = ("cuda",)


def cuda_in_use() -> bool:
    """Has this process initialized CUDA? (Cheap; never initializes it.)"""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:
        return False


def on_mfu_device(optimizer: Any) -> bool:
    """Are the optimizer's parameters on a device in :data:`MFU_DEVICES`?"""
    param = _first_param(optimizer) if optimizer is not None else None
    try:
        return param is not None and param.device.type in MFU_DEVICES
    except Exception:
        return False


def _first_param(optimizer: Any) -> Any:
    try:
        for group in optimizer.param_groups:
            for p in group["params"]:
                return p
    except Exception:
        return None
    return None


def compute_dtype(autocast: dict[str, str], optimizer: Any) -> tuple[str, str] | None:
    """(dtype name, ``"autocast"`` or ``"params"``): the autocast dtype for the
    trained parameters' device if autocast was on in the forward (*autocast*
    from :func:`autocast_dtypes`), else their dtype (``float32`` on CUDA with
    TF32 matmuls allowed is ``"tf32"``). None when nothing tells. Never raises."""
    try:
        param = _first_param(optimizer) if optimizer is not None else None
        device = param.device.type if param is not None else None
        if autocast:
            if device in autocast:
                return autocast[device], "autocast"
            if device is None or len(autocast) == 1:
                return next(iter(autocast.values())), "autocast"
        if param is None:
            return None
        import torch

        name = torch_dtype_name(param.dtype)
        if name == "float32" and device == "cuda" and _tf32_matmuls(torch):
            name = "tf32"
        return name, "params"
    except Exception:
        log.debug("gpuprof: could not read the compute dtype", exc_info=True)
        return None


def _tf32_matmuls(torch: Any) -> bool:
    """fp32 matmuls on CUDA run as TF32 (``torch.backends.cuda.matmul.allow_tf32``
    or ``set_float32_matmul_precision("high" | "medium")``)."""
    try:
        if torch.backends.cuda.matmul.allow_tf32:
            return True
        return torch.get_float32_matmul_precision() != "highest"
    except Exception:
        return False


class DtypeProbe:
    """Finds the compute dtype without hooks of its own: :meth:`on_forward`
    runs at the start of training forwards (the step machine's probe slot)
    and reads the autocast state; :meth:`on_step_end` then decides with the
    optimizer's parameters. ``result`` is None until decided."""

    def __init__(self) -> None:
        self.result: tuple[str, str] | None = None
        self._autocast: dict[str, str] | None = None

    def on_forward(self) -> None:
        if self._autocast is None:
            self._autocast = autocast_dtypes()

    @property
    def forward_seen(self) -> bool:
        return self._autocast is not None

    def on_step_end(self, optimizer: Any) -> None:
        if self.result is None and self._autocast is not None:
            self.result = compute_dtype(self._autocast, optimizer)


def _compiled_anything() -> bool:
    """Has torch.compile produced a graph in this process? (Cheap: dynamo's
    own counters; False when dynamo was never imported.)"""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:
        return False
    try:
        return bool(dynamo_utils.counters["stats"]["unique_graphs"])
    except Exception:
        return False


def _guarded_counter() -> Any:
    """A ``FlopCounterMode`` whose per-operator counting never raises into
    training: a formula that fails marks the count failed (``gpuprof_failed``)
    and the operator's result goes back to the model untouched."""
    from torch.utils.flop_counter import FlopCounterMode

    class GuardedFlopCounter(FlopCounterMode):
        gpuprof_failed = False

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            try:
                return super()._count_flops(func_packet, out, args, kwargs)
            except Exception:
                self.gpuprof_failed = True
                return out

    return GuardedFlopCounter(display=False)


class StepFlopCounter:
    """Counts the FLOP of step :attr:`step` with FlopCounterMode.

    :meth:`on_boundary` is called when a step ends with the index of the
    next one; it enters the mode before :attr:`step` and leaves it after.
    ``flops`` is the count (None until done, or if nothing was counted);
    ``note`` says why it was not counted.
    """

    def __init__(self, step: int = COUNT_STEP) -> None:
        self.step = step
        self.flops: float | None = None
        self.note: str | None = None
        self.done = False
        self._mode: Any = None

    @property
    def active(self) -> bool:
        return self._mode is not None

    def on_boundary(self, next_step: int) -> bool:
        """The step before *next_step* just ended (training thread). Returns
        True when *next_step* is the counted one (it will be ``traced``)."""
        if self.done:
            return False
        if self._mode is not None:
            self._stop()
            return False
        if next_step != self.step:
            if next_step > self.step:  # attached late (external steps): count this one
                self.step = next_step
            else:
                return False
        if _compiled_anything():
            self.done = True
            self.note = (
                "FLOPs not counted: the model is torch.compile'd (FlopCounterMode would "
                "recompile it); pass arch= or flops_per_step= for MFU"
            )
            return False
        try:
            mode = _guarded_counter()
            mode.__enter__()
            self._mode = mode
            return True
        except Exception:
            log.debug("gpuprof: FlopCounterMode did not start", exc_info=True)
            self.done = True
            return False

    def _stop(self) -> None:
        mode, self._mode = self._mode, None
        self.done = True
        try:
            mode.__exit__(None, None, None)
            total = mode.get_total_flops()
        except Exception:
            log.debug("gpuprof: FlopCounterMode did not stop cleanly", exc_info=True)
            return
        if getattr(mode, "gpuprof_failed", False):
            self.note = "FLOPs not counted: FlopCounterMode failed on an operator of the model"
        elif total > 0:
            self.flops = float(total)
        else:
            self.note = "FLOPs not counted: FlopCounterMode saw no matmul in the counted step"

    def abandon(self) -> None:
        """The run ends with the mode still on (fewer steps than counted):
        leave it, keep no count. Never raises."""
        mode, self._mode = self._mode, None
        self.done = True
        if mode is not None:
            try:
                mode.__exit__(None, None, None)
            except Exception:
                log.debug("gpuprof: FlopCounterMode did not stop cleanly", exc_info=True)
