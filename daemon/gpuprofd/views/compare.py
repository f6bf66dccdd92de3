"""Run B against run A as ``gpuprofctl compare`` and the HTTP API's compare
show it: both runs read from a :class:`~gpuprofd.storage.reader.Reader` (by
id, or by name meaning the latest run of that name), compared by
:func:`gpuprof.compare.compare_runs` (the regression rule's test)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuprof.compare import compare_runs
from gpuprofd.core.errors import BadInputError, UnknownRunError
from gpuprofd.storage import reads
from gpuprofd.storage.reader import Reader

#: The largest run id (SQLite's and Postgres' BIGINT's largest integer).
MAX_RUN_ID = 2**63 - 1


def run_ref(text: str) -> int | str:
    """*text* as a run reference: an id when it is a whole number from 1
    (at most 19 digits), else a run name.

    Raises:
        BadInputError: empty, or all digits but not an id (0, too large).
    """
    text = text.strip()
    if not text:
        raise BadInputError("a run is a run id or a run name, not nothing")
    if text.isascii() and text.isdigit():
        number = int(text) if len(text.lstrip("0")) <= 19 else 0
        if not 1 <= number <= MAX_RUN_ID:
            raise BadInputError(f"{text[:40]!r} is not a run id: a whole number from 1")
        return number
    return text


async def resolve_run(db: Reader, ref: int | str) -> dict[str, Any]:
    """The run *ref* names (:func:`run_ref`): by id, or the latest of that
    name. A number is also a name (``gpuprof.profile("42")``): the run of
    that id, else the latest run of that name (a run named like another's
    id is reached by its own id).

    Raises:
        UnknownRunError: no such run, naming the database and what it holds.
    """
    if isinstance(ref, str):
        return await reads.latest_run_named(db, ref)
    try:
        return await reads.get_run(db, ref)
    except UnknownRunError:
        by_name = await reads.find_run_named(db, str(ref))
        if by_name is None:
            raise  # it names the ids the database holds
        return by_name


async def load_compare(db: Reader, ref_a: int | str, ref_b: int | str) -> dict[str, Any]:
    """Run *ref_b* against run *ref_a*: :func:`gpuprof.compare.compare_runs`
    over their contexts (:func:`gpuprofd.storage.reads.run_context`) and
    stored findings (a running run's: the daemon's latest live pass).

    Raises:
        UnknownRunError: either run is not in the database.
        BadInputError: both name the same run, or one has no timed steps.
    """
    run_a = await resolve_run(db, ref_a)
    run_b = await resolve_run(db, ref_b)
    if run_a["id"] == run_b["id"]:
        raise BadInputError(f"both name run {run_a['id']}: give two different runs")
    ctx_a = await reads.run_context(db, run_a)
    ctx_b = await reads.run_context(db, run_b)
    found_a = await reads.stored_insights(db, run_a["id"])
    found_b = await reads.stored_insights(db, run_b["id"])
    try:  # a bootstrap over two runs' steps: off the event loop
        return await asyncio.to_thread(
            compare_runs, ctx_a, ctx_b, found_a, found_b, run_a["id"], run_b["id"]
        )
    except ValueError as exc:
        raise BadInputError(str(exc)) from None
