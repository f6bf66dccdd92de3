"""gpuprof: why your PyTorch training run is slow, in one sentence per finding.

    import gpuprof
    with gpuprof.profile("my-run"):
        ...  # your training loop

:func:`profile` returns a :class:`Profiler`; ``help(gpuprof.profile)``
lists every option. This package stays light: the in-process profiler is
imported only when :func:`profile` is called (or :class:`Profiler` looked
up), and a framework adapter (``LightningCallback``, ``HFTrainerCallback``,
``wrap_deepspeed_engine``) with its framework only when that name is first
looked up. :class:`TransformerArch` (analytic FLOPs for MFU) is pure Python
and imported here.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from gpuprof.flops import TransformerArch
from gpuprof.keywords import check_keywords

__version__ = "0.1.0"

if TYPE_CHECKING:
    import torch  # noqa: TID251 - for dtype's type only, never imported here

    from gpuprof_shim.adapters.deepspeed import wrap_deepspeed_engine  # noqa: TID251
    from gpuprof_shim.adapters.hf import HFTrainerCallback  # noqa: TID251
    from gpuprof_shim.adapters.lightning import LightningCallback  # noqa: TID251
    from gpuprof_shim.session import Profiler  # noqa: TID251 - the one lazy import

#: Public name -> the shim module defining it, imported on first lookup.
_LAZY = {
    "Profiler": "gpuprof_shim.session",
    "LightningCallback": "gpuprof_shim.adapters.lightning",
    "HFTrainerCallback": "gpuprof_shim.adapters.hf",
    "wrap_deepspeed_engine": "gpuprof_shim.adapters.deepspeed",
}


@check_keywords("gpuprof.profile")
def profile(
    run_name: str,
    *,
    auto: bool = True,
    flops_per_step: float | None = None,
    dtype: torch.dtype | str | None = None,
    print_summary: bool | None = None,
    socket_dir: str | os.PathLike[str] | None = None,
    db: str | os.PathLike[str] | None = None,
    autostart: bool = True,
    step_source: Literal["optimizer", "external"] = "optimizer",
    arch: TransformerArch | None = None,
    tokens_per_step: int | None = None,
    samples_per_step: int | None = None,
    count_flops: bool | None = None,
    trace_every_n_steps: int | None = None,
    trace_range: tuple[int, int] | None = None,
    continuous_traces_hz: float | None = None,
    trace_dir: str | os.PathLike[str] | None = None,
    trace_dir_max_mb: float = 1024.0,
    group: str | None = None,
    time_comm: bool = True,
    stacks: bool = True,
    dashboard: bool = False,
    wandb: bool = False,
    webhook: str | None = None,
    webhook_format: Literal["slack", "json"] = "slack",
    server: str | None = None,
    project: str | None = None,
    tags: Mapping[str, str] | None = None,
    auto_evidence: bool = True,
) -> Profiler:
    """Profile the training loop inside ``with gpuprof.profile(run_name):``.

    When the block ends the run's summary prints (its findings, each with a
    severity) and the run stays in the database for ``gpuprofctl``. Nothing
    here raises into training once the block is entered: if no gpuprofd can
    be reached, events are dropped and counted. Every option is a keyword;
    a misspelled one raises TypeError naming the closest valid option.

    Args:
        run_name: the run's name everywhere (summary, ``gpuprofctl runs``);
            control characters removed, cut to 200 characters.
        auto: True (default): find steps, micro-batches and the forward /
            backward / optimizer phases by patching torch (needs torch;
            about 15 µs of CPU per step). False: the manual API
            (``prof.step(i)``, ``s.phase(name)``; about 15 µs per step), for
            loops without an optimizer, or without torch.
        flops_per_step: model FLOP per optimizer step on this rank, for MFU
            (a float, FLOP). Default None: from ``arch``, else counted once
            (see ``count_flops``). Costs nothing.
        dtype: the training dtype for MFU's peak, a name (``"bf16"``,
            ``"float16"``) or a ``torch.dtype``. Default None: read in the
            first training forward (autocast's dtype, else the parameters').
            Costs nothing (that read is once).
        print_summary: print the summary block at exit. Default None: on
            global rank 0 only (every process outside torchrun), so a job of
            8 ranks prints one block; every rank's run is stored. Costs
            nothing: the summary is made either way.
        socket_dir: the socket directory of the gpuprofd to use (a path).
            Default None: ``GPUPROF_SOCKET``, else the database's own per-user
            daemon (under ``$XDG_RUNTIME_DIR/gpuprof/`` or
            ``/tmp/gpuprof-$UID/``). Costs nothing.
        db: the database an auto-started gpuprofd stores to (a path).
            Default None: ``GPUPROF_DB``, else ``./gpuprof.db``. Costs nothing.
        autostart: start a gpuprofd when none answers (default True; the
            run waits up to 5 s for it to answer; it exits after 5 idle
            minutes). False: with no daemon answering, the run is not
            recorded and its summary says so.
        step_source: ``"optimizer"`` (default): a step is one cycle of the
            first optimizer that steps. ``"external"``: the caller ends each
            step with :meth:`Profiler.mark_step_end` (framework adapters).
            Costs nothing beyond ``auto``'s per step.
        arch: a :class:`TransformerArch`: ``flops_per_step`` becomes its
            analytic training FLOP for ``tokens_per_step``. Default None.
            Costs nothing (computed once, at start).
        tokens_per_step: tokens per optimizer step on this rank (batch ×
            seq_len × micro-batches), with ``arch``; without it too, so that
            ``gpuprofctl compare`` compares runs of other shapes per token.
            Default None. Costs nothing.
        samples_per_step: samples per optimizer step on this rank (batch ×
            micro-batches): ``gpuprofctl compare`` then compares runs of
            other batch sizes, micro-batches or world sizes per sample.
            Default None. Costs nothing.
        count_flops: count one step's FLOP with torch's FlopCounterMode
            (step 3, marked traced and left out of step statistics; that
            step runs about 1.3× slower). Default None: only when neither
            ``flops_per_step`` nor ``arch`` is given and a GPU is in use;
            True: always; False: never.
        trace_every_n_steps: a ``torch.profiler`` window of one step every N
            steps, plus steps 0, 1 and 5 (an int). Default None: no windows.
            Each window costs about 25-45 ms; every 100 steps about 3 % of
            a 17 ms CPU step's loop.
        trace_range: ``(a, b)``: a window over every step a..b inclusive
            (steps). Default None. 20 steps cost about 9 % of that loop.
        continuous_traces_hz: one sampled one-step window every 1/f seconds
            for the whole run (Hz, at most 10; at least 10 steps apart).
            Default None. 1 Hz costs about 4 %, 10 Hz about 13 %.
        trace_dir: also write each window's chrome trace, gzipped, here (a
            directory). Default None: traces are never written. Each costs
            disk (about 26 kB for a 19-layer model's CPU step; more with GPU
            kernels) and, at the window's end, about 50 ms of the training
            thread's CPU.
        trace_dir_max_mb: the most ``trace_dir`` may hold, earlier runs'
            traces included (MB, default 1024); past it no more are written.
            Costs one listing of ``trace_dir`` at the first trace.
        group: the distributed job this rank belongs to (``gpuprofctl
            insights --group NAME``). Default None: torchrun's
            ``TORCHELASTIC_RUN_ID``; outside torchrun a run is its own group.
            Costs nothing.
        time_comm: time each DDP gradient bucket's all-reduce (a comm hook
            on every ``DistributedDataParallel``; default True): steps gain
            an exposed ``comm`` phase. About 300-600 µs per bucket on 2 CPU
            ranks with gloo. False: no comm hook.
        stacks: sample the training thread's Python stack about every 10 ms
            while it is outside forward, backward and the optimizer (between
            steps, between micro-batches, evaluation), so the findings on
            the time between steps name your code behind it (default True).
            Only file paths, line numbers and function names are kept (no
            locals, no arguments), at most 4096 (frame, step) counts per
            process, then each frame's steps merged (1024 frames more).
            About 3 µs per sample, taken on a background thread; nothing is
            sampled while the phases run. False: no sampling.
        dashboard: print the URL of this run on gpuprofd's live dashboard
            when it starts, where the summary prints (every run is on the
            dashboard; see docs/dashboard.md). Default False. Costs nothing
            (one line).
        wandb: log to the active ``wandb.run``: each step's time, loader
            wait, phases and MFU under gpuprof's own step axis
            (``gpuprof/step``), the findings as a table and the summary's
            figures in the run summary at the end. Default False. Costs the
            training thread under 1 µs a step (a queue append); a background
            thread logs the queue once a second (about 0.1 ms of CPU per
            step logged); exit waits at most 10 s for what is left. A
            failure is one logged line. No ``wandb.run``: a no-op with one
            notice.
        webhook: post the summary to this ``http(s)://`` URL when the run
            ends (a Slack incoming webhook, or any endpoint with
            ``webhook_format="json"``). Default None. Exit waits at most 5
            seconds for it; a failure is one logged line.
        webhook_format: ``"slack"`` (default): Slack's incoming-webhook body
            (``text`` and blocks: the header, each finding with its
            severity, the full-report command). ``"json"``: the summary
            itself (``{"event": "gpuprof.run_end", "summary": {...}}``).
            Costs nothing beyond ``webhook``'s.
        server: the team server to forward this run to (``https://host:8000``,
            what ``gpuprofd serve`` prints), with the key in
            ``GPUPROF_API_KEY`` or ``GPUPROF_API_KEY_FILE``. Default None:
            ``GPUPROF_SERVER``, else none. An auto-started gpuprofd forwards
            there; the summary ends with the run's URL on it, or says why
            the running gpuprofd of this database does not forward there.
            Costs training nothing: the gpuprofd sends, and while the server
            is down it keeps in its database what it sends later.
        project: the project this run's GPU-hours count to on the team
            server's "GPU-hours" page and rollups (a name, at most 64
            characters, control characters removed). Default None:
            ``GPUPROF_PROJECT``, else none. Costs nothing.
        tags: labels for the run (a dict of str to str; at most 16, keys of
            at most 32 characters, values of at most 64), merged over
            ``GPUPROF_TAGS`` (``key=value,key=value``). Default None: those
            of ``GPUPROF_TAGS`` only. Costs nothing.
        auto_evidence: take the one-off ``torch.profiler`` windows gpuprofd
            asks for when a live finding is one an op/kernel view explains
            (slow bursts, launch overhead, low MFU, kernel drift, a straggler);
            their top ops are attached to that finding. Default True; at most
            one window per rule per run; they cost at most 1 % of the run's
            time (the windows' steps are left out of step statistics), and
            nothing when none is asked for. False: none is taken.

    Returns:
        A :class:`Profiler`: use it as the ``with`` block's context manager
        (``with gpuprof.profile("x") as prof:``), or call ``start()`` and
        ``stop()``.

    Raises:
        TypeError: an unknown option (naming the closest valid one).
        ValueError: an invalid value (``flops_per_step``, ``dtype``,
            ``arch``, ``tokens_per_step``, ``samples_per_step``,
            ``count_flops``, ``step_source``, a trace option, ``webhook``,
            ``webhook_format`` or ``server``).
        RuntimeError: on entering, another profile is active in this process.
        ImportError: on entering with ``auto=True``, torch is not installed.
    """
    options = dict(locals())
    from gpuprof_shim.session import Profiler  # noqa: TID251 - the one lazy import

    return Profiler(**options)


def __getattr__(name: str) -> Any:
    """:class:`Profiler` and the framework adapters, imported lazily (an
    adapter with its framework) on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuprof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (``__all__``), sorted: not the imports behind them."""
    return sorted(set(__all__))


#: The public API: what ``from gpuprof import *`` and ``dir(gpuprof)`` give.
__all__ = [
    "HFTrainerCallback",
    "LightningCallback",
    "Profiler",
    "TransformerArch",
    "__version__",
    "profile",
    "wrap_deepspeed_engine",
]
