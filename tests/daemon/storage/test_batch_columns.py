"""The batch check a column at a time (gpuprofd.storage.writes.batch): it
accepts exactly what the check row by row accepts, keeps the same values,
and a refused batch names the same first bad field."""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import pytest

from gpuprofd.storage.writes import batch as bmod
from gpuprofd.storage.writes.batch import BatchError, validate
from tests.daemon.batches import batch, new_uuid, run_event, steps_event

#: Values a field may be sent with: good ones for some checks, bad for others.
VALUES: list[Any] = [
    None, 0, 1, 2, -1, 7, 10**6, 2**40, 2**41, 2**62, 2**63 - 1, -(2**63),
    True, False, 0.0, 1.5, -2.5, 97.0, 1e29, 1e31, math.nan, math.inf, -math.inf,
    "", "a", "x" * 200, "a\x00b", "main", "running", "finished",
    {}, {"forward": 5}, {"forward": -1}, {"forward": True}, {"new phase": 3}, {1: 2},
    [], [1, 2], [{"name": "adam", "updates": 1, "skipped": 0, "ns": 10}],
]  # fmt: skip


def _rows(rng: random.Random, schema: bmod.Schema, n: int, base: dict[str, Any]) -> list[Any]:
    """*n* rows of *base*, each with a few fields set to any of :data:`VALUES`."""
    rows: list[Any] = []
    names = [*schema, "not_a_field"]
    for _ in range(n):
        row = dict(base)
        for _ in range(rng.randrange(3)):
            name = rng.choice(names)
            if rng.random() < 0.3:
                row.pop(name, None)
            else:
                row[name] = rng.choice(VALUES)
        rows.append(row)
    if rng.random() < 0.05:
        rows[rng.randrange(n)] = rng.choice([[1, 2], "row", None])
    return rows


GOOD_ROWS = {
    "steps": {"step": 3, "t0_ns": 10, "t1_ns": 20, "wait_ns": 1, "phases": {"forward": 4}},
    "comm": {"step": 1, "bucket": 0, "start_ns": 5, "end_ns": 9, "bytes": 4096},
    "host_samples": {"mono_ns": 5, "boot_id": "b", "cpu_pct": 12.5, "cpu_count": 8},
    "gpu_rollups": {"sec_ns": 1, "uuid": "GPU-1", "boot_id": "b", "n": 10, "util_mean": 97.0},
    "run_cpu": {"mono_ns": 5, "cores": 1.5},
    "worker_cpu": {"loader_seq": 1, "pid": 10, "worker_id": 0, "cpu_s": 0.5},
}


def _outcome(events: list[Any]) -> tuple[str, Any]:
    """The check row by row: its events (rows as dicts), or the field it names."""
    try:
        out = bmod._events_one_by_one(copy.deepcopy(events))
    except BatchError as exc:
        return "refused", exc.field
    return "ok", _plain(out)


def _plain(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for ev in events:
        ev = dict(ev)
        rows = ev.get("rows")
        if isinstance(rows, bmod.Columns):
            ev["rows"] = rows.rows(list(bmod._ROW_SCHEMAS[ev["kind"]]))
        out.append(ev)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_columns_accept_what_rows_accept(seed: int) -> None:
    rng = random.Random(seed)
    runs = [new_uuid() for _ in range(3)]
    events: list[Any] = []
    for seq in range(1, 12):
        kind = rng.choice(sorted(bmod._ROW_SCHEMAS))
        schema = bmod._ROW_SCHEMAS[kind]
        ev: dict[str, Any] = {"seq": seq, "kind": kind, "run": rng.choice(runs)}
        ev["rows"] = _rows(rng, schema, rng.randrange(1, 12), GOOD_ROWS[kind])
        events.append(ev)
    kept, named = 0, 0
    for _ in range(30):  # ever fewer mutations: the last rounds are mostly good batches
        expected = _outcome(events)
        fast = bmod._events_at_once(copy.deepcopy(events))
        if expected[0] == "refused":
            named += 1
            assert fast is None
            with pytest.raises(BatchError) as err:
                validate({"v": 1, "node": "n1", "events": copy.deepcopy(events)})
            assert err.value.field == expected[1]
            # mend the first bad event: the next round looks further on
            i = int(expected[1].split("]")[0].split("[")[1])
            kind = events[i]["kind"]
            events[i]["rows"] = [dict(GOOD_ROWS[kind]) for _ in events[i]["rows"]]
        else:
            kept += 1
            assert fast is not None and _plain(fast) == expected[1]
            break
    assert kept == 1  # every batch is mended at last, and then taken at once


def test_a_good_batch_is_checked_at_once_and_keeps_its_values() -> None:
    run = new_uuid()
    events = [run_event(1, run), steps_event(2, run, 0, n=4), steps_event(3, run, 4, n=3)]
    events[1]["rows"][2]["traced"] = True
    checked = validate(batch("n1", events))
    fast = bmod._events_at_once(copy.deepcopy(batch("n1", events)["events"]))
    assert fast is not None
    steps = checked["events"][2]["rows"]
    assert isinstance(steps, bmod.Columns) and steps.n == 3
    assert steps.column("step") == [4, 5, 6]
    first = checked["events"][1]["rows"]
    assert first.column("traced") == [None, None, True, None]
    assert first.column("eval_ns", 0) == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("t1_ns", 5), ("phases", {"forward": -1}), ("phases", {"a\x00": 1}), ("wait_ns", 1.0)],
)
def test_a_bad_row_in_the_second_event_of_a_kind_is_named(field: str, value: Any) -> None:
    run = new_uuid()
    events = [run_event(1, run), steps_event(2, run, 0, n=4), steps_event(3, run, 4, n=3)]
    events[2]["rows"][1][field] = value
    with pytest.raises(BatchError) as err:
        validate(batch("n1", events))
    assert err.value.field == f"events[2].rows[1].{field}"
