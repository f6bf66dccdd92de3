"""One step's accumulators in the auto-mode step machine
(:class:`~gpuprof_shim.auto.machine.StepMachine`): the phases' summed
durations, loader and eval time, micro-batches and each optimizer's share,
all in ns, for a step in progress or for activity that may become one (an
optimizer's turn that may join the open step). Pure; the machine reuses an
emitted segment, reset, for the next one."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof_shim.steps import OptimizerUse


@dataclass(slots=True)
class Segment:
    """Accumulators of one step, or of activity that may become one (ns)."""

    t0: int = 0
    last_ns: int = 0
    end_ns: int = 0
    forward_ns: int = 0
    backward_ns: int = 0
    optimizer_ns: int = 0
    between_ns: int = 0
    loader_ns: int = 0
    loader_in_forward_ns: int = 0
    own_ns: int = 0  # gpuprof's own work (sending events) inside the step
    gap_own_ns: int = 0  # ... and in the gap before it (not loader wait)
    wait_ns: int = 0
    eval_ns: int = 0
    micro: int = 0
    closure_micro: int = 0
    primary_done: bool = False
    skipped: bool = False
    # optimizer index -> its share of the step, as the event carries it
    optim: dict[int, OptimizerUse] = field(default_factory=dict)

    @property
    def started(self) -> bool:
        return self.t0 != 0

    def absorb(self, tail: Segment) -> None:
        """Take *tail*'s work into this step (another optimizer's turn):
        its backward calls are not micro-batches, its loader time is
        in-step loading."""
        self.forward_ns += tail.forward_ns
        self.backward_ns += tail.backward_ns
        self.optimizer_ns += tail.optimizer_ns
        self.between_ns += tail.between_ns
        self.loader_ns += tail.loader_ns + tail.wait_ns
        self.loader_in_forward_ns += tail.loader_in_forward_ns
        self.own_ns += tail.own_ns + tail.gap_own_ns
        self.eval_ns += tail.eval_ns
        self.last_ns = max(self.last_ns, tail.last_ns)
        optim = self.optim
        for idx, use in tail.optim.items():
            mine = optim.get(idx)
            if mine is None:
                optim[idx] = use  # the tail is dropped after: its entry moves here
            else:
                mine["updates"] += use["updates"]
                mine["skipped"] += use["skipped"]
                mine["ns"] += use["ns"]
