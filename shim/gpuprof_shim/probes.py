"""What auto mode learns about the model itself: the compute dtype (read in
the first training forward, decided at the first step's end) and one step's
FLOP count (``count_flops``), for MFU. Runs on the training thread, between
steps; never raises into training."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuprof.gpus import peak_tflops
from gpuprof_shim import identity, messages
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.flops import DtypeProbe, StepFlopCounter, cuda_in_use, on_mfu_device

log = logging.getLogger("gpuprof.shim")


class ModelProbes:
    """The dtype probe and the one-step FLOP counter of one profile.

    Args:
        options: the profile's normalized options (``dtype``,
            ``flops_per_step``, ``count_flops``).
        is_open: whether the profile still records (a count starts only then).
    """

    def __init__(self, options: Mapping[str, Any], is_open: Callable[[], bool]) -> None:
        self.options = options
        self.is_open = is_open
        self.dtype_probe: DtypeProbe | None = None
        self.flop_counter: StepFlopCounter | None = None
        #: Step indices whose FLOPs were counted (their time is not representative).
        self.traced: set[int] = set()
        self._machine: StepMachine | None = None
        self._sent_dtype = self._sent_flops = False

    def start(self, machine: StepMachine) -> None:
        """The dtype probe (unless the user gave a dtype) and the FLOP
        counter (see ``count_flops``), fed by *machine*."""
        opts = self.options
        self._machine = machine
        if opts.get("dtype") is None:
            self.dtype_probe = DtypeProbe()
        count = opts.get("count_flops")
        if count or (count is None and opts.get("flops_per_step") is None):
            self.flop_counter = StepFlopCounter()
        if self.dtype_probe is not None or self.flop_counter is not None:
            machine.on_forward_probe = self.on_forward_probe
        if count:  # asked for: on any device, from the first step boundary
            machine.on_boundary = self.on_boundary

    def on_forward_probe(self) -> None:
        """The first training forward starts: read autocast, then stop
        probing. Without CUDA in use, the automatic probes end here (no
        peak, no MFU): nothing more runs between steps."""
        machine = self._machine
        if machine is None:
            return
        machine.on_forward_probe = None
        if not cuda_in_use() and not self.options.get("count_flops"):
            self.dtype_probe = self.flop_counter = None
            return
        if self.dtype_probe is not None:
            self.dtype_probe.on_forward()
        machine.on_boundary = self.on_boundary

    def on_boundary(self, next_step: int, optimizer: Any) -> None:
        """A step ended (training thread): decide the dtype; start or stop
        the FLOP count."""
        try:
            on_gpu = on_mfu_device(optimizer)
            probe = self.dtype_probe
            if probe is not None and probe.result is None and probe.forward_seen:
                if on_gpu:
                    probe.on_step_end(optimizer)
                else:  # no peak to compare with: the dtype says nothing
                    self.dtype_probe = None
            counter = self.flop_counter
            if counter is not None and not on_gpu and not counter.active:
                if self.options.get("count_flops") is None:
                    self.flop_counter = counter = None  # automatic: GPUs only
            if counter is not None and self.is_open() and counter.on_boundary(next_step):
                self.traced.add(next_step)
        except Exception:
            log.debug("gpuprof: dtype or FLOP probe failed", exc_info=True)

    def model_info(self, run_key: str) -> dict[str, Any] | None:
        """A ``model_info`` event with what was learnt and not yet sent."""
        fields: dict[str, Any] = {}
        probe = self.dtype_probe
        if probe is not None and probe.result is not None and not self._sent_dtype:
            self._sent_dtype = True
            fields["dtype"], fields["dtype_source"] = probe.result
        counter = self.flop_counter
        if counter is not None and counter.flops is not None and not self._sent_flops:
            self._sent_flops = True
            fields["flops_counted"], fields["flops_step"] = counter.flops, counter.step
        return messages.model_info(run_key, **fields) if fields else None

    def mfu_inputs(self) -> tuple[float, float] | None:
        """(FLOP per step, the GPU's dense peak FLOP/s for the training
        dtype, :func:`gpuprof.gpus.peak_tflops`) once both are known: the
        FLOP declared or counted, the dtype given or probed, a CUDA device
        in the peak table. None before, and on a CPU."""
        flops = self.options.get("flops_per_step")
        counter = self.flop_counter
        if flops is None and counter is not None:
            flops = counter.flops
        dtype = self.options.get("dtype")
        probe = self.dtype_probe
        if dtype is None and probe is not None and probe.result is not None:
            dtype = probe.result[0]
        if not flops or dtype is None:
            return None
        peak = peak_tflops(identity.cuda_name(), dtype)
        return (float(flops), peak * 1e12) if peak else None

    def abandon(self) -> None:
        """Profile exit: a FLOP count still running is given up."""
        if self.flop_counter is not None and self.flop_counter.active:
            self.flop_counter.abandon()

    def note(self) -> str | None:
        """The FLOP counter's line for the summary, if it has one."""
        counter = self.flop_counter
        return counter.note if counter is not None and counter.note else None
