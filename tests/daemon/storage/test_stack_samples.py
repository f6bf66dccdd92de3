"""Sampled stacks (``stacks`` events) on each backend: a frame's samples add
up across events, are read back into the run's context, and go with the run."""

from __future__ import annotations

from gpuprof.insights.frames import StackFrame
from gpuprofd.storage.reads import run_context, stack_samples
from gpuprofd.storage.upkeep.retention import delete_runs_pass
from gpuprofd.storage.writes import runsdb
from tests.daemon.helpers import open_store
from tests.daemon.storage.test_backends import run_row

SAVE = ["/home/u/train.py", 212, "save_checkpoint", "torch.save"]


def msg(source: str, rows: list[list[object]]) -> dict[str, object]:
    return {"type": "stacks", "source": source, "rows": rows}


async def test_stack_samples_add_up_and_read_back_on_each_backend(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        run = await runsdb.insert_run(store, run_row())
        other = await runsdb.insert_run(store, run_row("k2", "other"))
        first = msg("main", [[*SAVE, 20, 3], ["/home/u/train.py", 230, "log", "", 21, 1]])
        later = msg("main", [[*SAVE, 20, 4]])  # the same frame and step again: 3 + 4
        loader = msg("loader", [["/home/u/data.py", 41, "augment", "PIL.Image.Image.resize", 0, 9]])
        for m in (first, later, loader):
            assert store.submit_all_nowait(runsdb.stacks_ops(run, m))
        assert store.submit_all_nowait(runsdb.stacks_ops(other, msg("main", [[*SAVE, 20, 1]])))
        await store.flush()
        rows = await stack_samples(store, run)
        assert [(r["source"], r["step"], r["line"], r["callee"], r["samples"]) for r in rows] == [
            ("loader", 0, 41, "PIL.Image.Image.resize", 9),
            ("main", 20, 212, "torch.save", 7),
            ("main", 21, 230, "", 1),
        ]
        row = await store.fetchone("SELECT * FROM runs WHERE id = ?", (run,))
        ctx = await run_context(store, {**row, "options": {}})
        assert StackFrame("main", 20, *SAVE, 7) in ctx.stack_frames
        assert len(ctx.stack_frames) == 3

        await runsdb.update_run(store, run, status="finished", end_wall_ns=5)
        assert (await delete_runs_pass(store, before_wall_ns=10))[0] == 1
        assert await stack_samples(store, run) == []
        assert len(await stack_samples(store, other)) == 1  # another run's rows stay
