"""The ingest batch: what a node sends a team server (``POST /api/v1/ingest``).

Pure: no I/O. :func:`validate` checks a decoded batch and raises
:class:`BatchError` naming the first bad field (``events[3].rows[0].t0_ns``);
:mod:`gpuprofd.storage.writes.ingest` applies a valid one. The format is documented
for users in ``docs/team-server.md`` (version :data:`BATCH_VERSION`).

A batch is ``{"v": 1, "node": NODE_ID, "host": HOST, "events": [EVENT, ...]}``.
Each event has a per-node sequence number ``seq`` (strictly increasing
within the batch, gaps allowed), a ``kind`` and, for the kinds about one
run, ``run``: the run's UUID (made at ``hello``, ``runs.run_uuid``). Field
names are the ``gpuprofd.storage.schema`` column names; times are the
node's nanoseconds as stored there (monotonic ones with the ``boot_id``
they belong to). Fields a kind does not know are ignored (a newer node
talking to an older server), as in :mod:`gpuprof.protocol`.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuprof.evidence import tag_problem as _evidence_tag_problem
from gpuprof.kernels import SOURCES
from gpuprof.labels import MAX_PROJECT_CHARS
from gpuprof.protocol import (
    _GOOD_PHASE_NAMES,
    MAX_DURATION_NS,
    MAX_MEMORY_BYTES,
    MAX_PHASES,
    STACK_SOURCES,
    _kernel_row,
    _optimizers,
    _phases,
    _stack_row,
    _window_steps,
)
from gpuprof.protocol import MAX_RUN_NAME_CHARS as _NAME_CHARS
from gpuprofd.sampling.rollup import ROLLUP_COLUMNS

BATCH_VERSION = 1
#: Most events in one batch. The forwarder sends about a second of a node's
#: events per batch (an 8-GPU node at 100 ms steps: ~90 rows), more while it
#: catches up a backlog; 10,000 events keep one transaction short.
MAX_EVENTS = 10_000
#: Most rows in one event, and in the whole batch (one ``steps`` event of a
#: catching-up node carries many steps; the batch bound keeps one
#: transaction's work bounded whatever the event count).
MAX_EVENT_ROWS = 10_000
MAX_BATCH_ROWS = 100_000
#: Longest free text kept (a run name, an error, an insight's detail), characters.
MAX_TEXT_CHARS = 4000
#: Largest JSON object field (``options``, ``summary``, an insight's ``evidence``), in keys.
MAX_OBJECT_KEYS = 256
#: Insights per ``insights`` event (the rule set has a few dozen rules).
MAX_INSIGHTS = 200
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)

RUN_STATUSES = ("running", "finished", "failed", "lost")
ENDED_STATUSES = ("finished", "failed", "lost")
#: Kinds about one run (they carry ``run``) and kinds about the node
#: (host samples, GPU rollups: keyed by ``boot_id`` and GPU UUID).
RUN_KINDS = (
    "run",
    "end",
    "steps",
    "run_cpu",
    "worker_cpu",
    "kernels",
    "comm",
    "insights",
    "stacks",
)
NODE_KINDS = ("host_samples", "gpu_rollups")
KINDS = RUN_KINDS + NODE_KINDS

_NODE_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class BatchError(ValueError):
    """A batch that breaks the format: *field* names the first bad field
    (``events[2].rows[7].t0_ns``, or ``v``/``node``/``events`` of the
    envelope); the whole batch is refused."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


Check = Callable[[Any], bool]


class _Int:
    """An int (not a bool) in [lo, hi]; :meth:`column` checks many at once."""

    __slots__ = ("hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def __call__(self, x: Any) -> bool:
        return type(x) is int and self.lo <= x <= self.hi

    def column(self, values: list[Any]) -> bool:
        """Every one of *values* (not empty, no None) passes: C loops only."""
        return _types(values) == _INT_TYPE and self.lo <= min(values) and max(values) <= self.hi


class _Num:
    """A finite number in [lo, hi] (int or float; ``NaN`` fails both bounds)."""

    __slots__ = ("hi", "lo")

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def __call__(self, x: Any) -> bool:
        return type(x) in (int, float) and math.isfinite(x) and self.lo <= x <= self.hi

    def column(self, values: list[Any]) -> bool:
        return (
            _types(values) <= _NUM_TYPES
            and all(map(math.isfinite, values))
            and self.lo <= min(values)
            and max(values) <= self.hi
        )


class _Text:
    """Any string up to *max_chars*, stored as sent (SQL, HTML and bidi
    characters included: they are parameters and JSON text, never code);
    only NUL is refused (Postgres text cannot hold it)."""

    __slots__ = ("max_chars",)

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def __call__(self, x: Any) -> bool:
        return type(x) is str and len(x) <= self.max_chars and "\x00" not in x

    def column(self, values: list[Any]) -> bool:
        return (
            _types(values) == _STR_TYPE
            and max(map(len, values)) <= self.max_chars
            and "\x00" not in "".join(values)
        )


class _OneOf:
    __slots__ = ("values",)

    def __init__(self, *values: str) -> None:
        self.values = frozenset(values)

    def __call__(self, x: Any) -> bool:
        return type(x) is str and x in self.values

    def column(self, values: list[Any]) -> bool:
        return _types(values) == _STR_TYPE and self.values.issuperset(values)


class _Flag:
    """A boolean as JSON or as SQLite stores one (0/1)."""

    def __call__(self, x: Any) -> bool:
        return type(x) is bool or (type(x) is int and x in (0, 1))

    def column(self, values: list[Any]) -> bool:
        # True == 1 and False == 0: the set holds only those when all are flags
        return _types(values) <= _FLAG_TYPES and _FLAG_VALUES.issuperset(values)


def _types(values: list[Any]) -> set[type]:
    return set(map(type, values))


_INT_TYPE = {int}
_STR_TYPE = {str}
_NUM_TYPES = frozenset({int, float})
_FLAG_TYPES = frozenset({bool, int})
_FLAG_VALUES = frozenset({0, 1})


def _int(lo: int = 0, hi: int = _INT64_MAX) -> Check:
    return _Int(lo, hi)


def _num(lo: float = 0.0, hi: float = 1e30) -> Check:
    """A finite number in [lo, hi] (int or float; ``NaN`` fails both bounds)."""
    return _Num(lo, hi)


def _text(max_chars: int = MAX_TEXT_CHARS) -> Check:
    """Any string up to *max_chars* but NUL (see :class:`_Text`)."""
    return _Text(max_chars)


_flag = _Flag()


def _object(x: Any) -> bool:
    return type(x) is dict and len(x) <= MAX_OBJECT_KEYS and all(type(k) is str for k in x)


def _one_of(*values: str) -> Check:
    return _OneOf(*values)


class _Each:
    """A check of one value and, for a whole column, *column* (C loops)."""

    __slots__ = ("column", "one")

    def __init__(self, one: Check, column: Callable[[list[Any]], bool]) -> None:
        self.one, self.column = one, column

    def __call__(self, x: Any) -> bool:
        return self.one(x)


def _phases_column(values: list[Any]) -> bool:
    """:func:`gpuprof.protocol._phases` of every one of *values* (the steps'
    phase dicts), in C loops: names seen before, durations in range."""
    if _types(values) != {dict} or max(map(len, values)) > MAX_PHASES:
        return False
    names = set().union(*values)
    if not names <= _GOOD_PHASE_NAMES:
        return all(map(_phases, values))  # a new name: checked (and remembered) one by one
    durations = list(itertools.chain.from_iterable(map(dict.values, values)))
    return not durations or (
        _types(durations) == _INT_TYPE and min(durations) >= 0 and max(durations) <= MAX_DURATION_NS
    )


_NS = _int(0)
_COUNT = _int(0)
_SMALL = _int(0, 1 << 20)
_ID = _text(128)

#: field -> (required, check). ``None`` is accepted for every field not required.
Schema = Mapping[str, tuple[bool, Check]]

RUN_FIELDS: Schema = {
    "run_name": (True, _text(_NAME_CHARS)),
    "status": (True, _one_of(*RUN_STATUSES)),
    "start_wall_ns": (True, _NS),
    "start_mono_ns": (True, _NS),
    "host": (False, _text(255)),
    "user_name": (False, _text(64)),
    "project": (False, _text(MAX_PROJECT_CHARS)),
    # the run's tags as JSON text (gpuprof.labels), stored as sent
    "tags": (False, _text(4096)),
    "pid": (False, _int(1, 2**31)),
    "pid_ns": (False, _text(64)),
    "rank": (False, _SMALL),
    "local_rank": (False, _SMALL),
    "world_size": (False, _int(1, 1 << 20)),
    "local_world_size": (False, _int(1, 1 << 20)),
    "auto": (False, _flag),
    "options": (False, _object),
    "cuda_uuid": (False, _ID),
    "gpu_model": (False, _ID),
    "gpu_count": (False, _SMALL),
    "cpu_count": (False, _SMALL),
    "boot_id": (False, _ID),
    "group_id": (False, _ID),
    "clock_offset_ns": (False, _int(-(1 << 62), 1 << 62)),
    "clock_uncertainty_ns": (False, _int(0, MAX_DURATION_NS)),
    "clock_rtt_ns": (False, _int(0, MAX_DURATION_NS)),
    "clock_round_trips": (False, _SMALL),
    "clock_reference_rank": (False, _SMALL),
    "dropped_events": (False, _COUNT),
    "received_events": (False, _COUNT),
    "sent_events": (False, _COUNT),
    "store_dropped_events": (False, _COUNT),
}
END_FIELDS: Schema = {
    "status": (True, _one_of(*ENDED_STATUSES)),
    "end_wall_ns": (False, _NS),
    "end_mono_ns": (False, _NS),
    "error": (False, _text()),
    "trailing_eval_ns": (False, _int(0, MAX_DURATION_NS)),
    "dropped_events": (False, _COUNT),
    "received_events": (False, _COUNT),
    "sent_events": (False, _COUNT),
    "store_dropped_events": (False, _COUNT),
    # the node's own end of the run (a gpuprofd node sends them): stored as
    # sent, and the server then keeps the node's insights instead of its own
    "summary": (False, _object),
    "median_step_ms": (False, _num(0, 1e12)),
    "mfu": (False, _num(0, 1e3)),
    "achieved_tflops": (False, _num(0, 1e9)),
}
_MEM = _int(0, MAX_MEMORY_BYTES)
STEP_FIELDS: Schema = {
    "step": (True, _int(0, 1 << 40)),
    "t0_ns": (True, _NS),
    "t1_ns": (True, _NS),
    "wait_ns": (False, _int(0, MAX_DURATION_NS)),
    "explicit": (False, _flag),
    "micro": (False, _SMALL),
    "phases": (False, _Each(_phases, _phases_column)),
    "skipped": (False, _flag),
    "eval_ns": (False, _int(0, MAX_DURATION_NS)),
    "optimizers": (False, _optimizers),
    "mem_allocated_bytes": (False, _MEM),
    "mem_reserved_bytes": (False, _MEM),
    "mem_peak_bytes": (False, _MEM),
    "traced": (False, _flag),
}
RUN_CPU_FIELDS: Schema = {"mono_ns": (True, _NS), "cores": (False, _num(0, 1 << 20))}
WORKER_CPU_FIELDS: Schema = {
    "loader_seq": (True, _int(0, 1 << 40)),
    "pid": (True, _int(1, 2**31)),
    "worker_id": (False, _int(0, 1 << 20)),
    "first_mono_ns": (False, _NS),
    "last_mono_ns": (False, _NS),
    "cpu_s": (False, _num(0, 1e12)),
    "ctx_voluntary": (False, _COUNT),
    "ctx_involuntary": (False, _COUNT),
}
COMM_FIELDS: Schema = {
    "step": (True, _int(0, 1 << 40)),
    "bucket": (False, _int(0, 1 << 20)),
    "start_ns": (False, _NS),
    "end_ns": (False, _NS),
    "bytes": (False, _int(0, 1 << 50)),
}
HOST_FIELDS: Schema = {
    "mono_ns": (True, _NS),
    "boot_id": (False, _ID),
    "cpu_pct": (False, _num(0, 1e6)),
    "cpu_count": (False, _SMALL),
    "disk_read_bps": (False, _num()),
    "disk_read_iops": (False, _num()),
    "page_cache_bytes": (False, _int(0, 1 << 60)),
    "mem_total_bytes": (False, _int(0, 1 << 60)),
    "swap_in_bps": (False, _num()),
}
#: gpu_rollups: every column numeric but the GPU's UUID and the boot.
ROLLUP_FIELDS: Schema = {
    c: (
        (True, _NS)
        if c == "sec_ns"
        else (True, _ID)
        if c == "uuid"
        else (False, _ID)
        if c == "boot_id"
        else (False, _num(-1e30, 1e30))
    )
    for c in ROLLUP_COLUMNS
}
KERNEL_WINDOW_FIELDS: Schema = {
    "t0_ns": (True, _NS),
    "t1_ns": (True, _NS),
    "source": (True, _one_of(*SOURCES)),
    # the step indices it covered, or (a window merged past its list limit,
    # gpuprofd.storage.upkeep.kcompact) {"n": count, "first": i, "last": j}
    "steps": (False, lambda x: _window_steps(x) or _object(x)),
    "rows_dropped": (False, _int(0, 1 << 40)),
    # source "evidence": the request it answers, {"id", "rule", "time"?} (gpuprof.evidence)
    "evidence": (False, lambda x: _evidence_tag_problem(x) is None),
}
_WINDOW_KEY_FIELDS: Schema = {k: KERNEL_WINDOW_FIELDS[k] for k in ("t0_ns", "t1_ns", "source")}
INSIGHT_FIELDS: Schema = {
    "rule": (True, _text(128)),
    "severity": (True, _text(16)),
    "title": (True, _text()),
    "detail": (False, _text()),
    "fix": (False, _text()),
    "evidence": (False, _object),
}


#: Per schema (by id: they are module constants), its required fields.
_REQUIRED: dict[int, tuple[str, ...]] = {}


def _fields(obj: Any, schema: Schema, where: str) -> dict[str, Any]:
    """*obj* checked against *schema*: the known fields (None where absent).

    Only the fields *obj* has are looked at (a row sends a few of its
    kind's fields); on a bad one, :func:`_first_bad` names the first in
    *schema*'s order.
    """
    if type(obj) is not dict:
        raise BatchError(where, "not a JSON object")
    out = dict.fromkeys(schema)
    for name, value in obj.items():
        spec = schema.get(name)
        if spec is None or value is None:
            continue
        if not spec[1](value):
            _first_bad(obj, schema, where)
        out[name] = value
    required = _REQUIRED.get(id(schema))
    if required is None:
        required = _REQUIRED[id(schema)] = tuple(n for n, (req, _) in schema.items() if req)
    for name in required:
        if out[name] is None:
            _first_bad(obj, schema, where)
    return out


def _first_bad(obj: dict[str, Any], schema: Schema, where: str) -> None:
    """Raise :class:`BatchError` for *obj*'s first bad field in *schema*'s order."""
    for name, (required, check) in schema.items():
        value = obj.get(name)
        if value is None:
            if required:
                raise BatchError(f"{where}.{name}", "missing")
            continue
        if not check(value):
            raise BatchError(f"{where}.{name}", f"bad value {_show(value)}")
    raise AssertionError("no bad field")  # pragma: no cover - called on a bad one only


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Columns:
    """An event's rows, checked, as columns: :attr:`n` rows; per field some
    row has, its values in row order (None where a row has none).

    Columns are checked and turned into the tuples a bulk insert takes
    (:meth:`tuples`) in C loops (``map``, ``zip``, ``set``): a second of an
    8-GPU node is ~90 rows, a thousand nodes' a second ~90,000.

    The events of a kind in one batch are checked together: each event's
    rows are then a :meth:`slice` of the batch's (:attr:`parent`, from
    :attr:`start`), copied out only when read, so rows that stay together
    up to the insert are built into tuples together.
    """

    __slots__ = ("_cols", "n", "parent", "start")

    def __init__(
        self,
        n: int,
        cols: dict[str, list[Any]] | None,
        parent: Columns | None = None,
        start: int = 0,
    ) -> None:
        self.n = n
        self._cols = cols
        self.parent = parent
        self.start = start

    @property
    def cols(self) -> dict[str, list[Any]]:
        """Per field some row has, its values."""
        if self._cols is None:
            assert self.parent is not None
            a, b = self.start, self.start + self.n
            self._cols = {k: v[a:b] for k, v in self.parent.cols.items()}
        return self._cols

    def __len__(self) -> int:
        return self.n

    def get(self, name: str) -> list[Any] | None:
        """The field's values (None: no row has it)."""
        if self._cols is None and self.parent is not None:  # one column of a slice
            col = self.parent.get(name)
            return None if col is None else col[self.start : self.start + self.n]
        return self.cols.get(name)

    def column(self, name: str, default: Any = None) -> Sequence[Any]:
        """The field's values, *default* for a row without it."""
        col = self.get(name)
        if col is None:
            return [default] * self.n
        if default is not None and None in col:
            return [default if v is None else v for v in col]
        return col

    def tuples(
        self, head: Sequence[Any], columns: Sequence[Sequence[Any]]
    ) -> list[tuple[Any, ...]]:
        """One tuple per row: *head* (values the same in every row), then
        the row's value in each of *columns* (each :attr:`n` long)."""
        return list(zip(*(itertools.repeat(h, self.n) for h in head), *columns, strict=True))

    def slice(self, start: int, stop: int) -> Columns:
        """Rows *start* to *stop* (not included), copied out when read."""
        if self.parent is not None:  # always of the batch's own columns
            return self.parent.slice(self.start + start, self.start + stop)
        if start == 0 and stop == self.n:
            return self
        return Columns(stop - start, None, self, start)

    def follows(self, other: Columns) -> bool:
        """These rows come right after *other*'s in one batch's columns."""
        return self.parent is not None and (
            self.parent is other.parent and self.start == other.start + other.n
        )

    def rows(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The rows as dicts of *names* (None where absent): for the slow paths."""
        return [
            dict(zip(names, vals, strict=True))
            for vals in self.tuples((), [self.column(n) for n in names])
        ]


def _rows(ev: Mapping[str, Any], where: str, schema: Schema) -> Columns:
    """*ev*'s ``rows`` checked against *schema*, as :class:`Columns`.

    Raises:
        BatchError: not a list of at most :data:`MAX_EVENT_ROWS` objects, or
            the first bad field.
    """
    rows = ev.get("rows")
    if type(rows) is not list or len(rows) > MAX_EVENT_ROWS:
        raise BatchError(f"{where}.rows", f"not a list of at most {MAX_EVENT_ROWS} rows")
    return _columns(rows, schema) or _row_by_row(rows, schema, where)


def _columns(rows: list[Any], schema: Schema) -> Columns | None:
    """*rows* as :class:`Columns` if every row is good, each field checked a
    column at a time; None if any is not (:func:`_row_by_row` names it)."""
    n = len(rows)
    cols: dict[str, list[Any]] = {}
    if n == 0:
        return Columns(0, cols)
    if _types(rows) != _DICT_TYPE:
        return None
    present = set().union(*rows)
    if not _required(schema) <= present:
        return None
    for name in present:
        spec = schema.get(name)
        if spec is None:  # a field this server does not know: ignored
            continue
        col = list(map(dict.get, rows, itertools.repeat(name)))
        values = col if None not in col else list(filter(_NOT_NONE, col))
        if not values:
            continue
        if spec[0] and len(values) != n:
            return None
        check = spec[1]
        column = getattr(check, "column", None)
        if not (column(values) if column is not None else all(map(check, values))):
            return None
        cols[name] = col
    return Columns(n, cols)


def _required(schema: Schema) -> frozenset[str]:
    required = _REQUIRED_SET.get(id(schema))
    if required is None:
        required = _REQUIRED_SET[id(schema)] = frozenset(n for n, (r, _) in schema.items() if r)
    return required


_REQUIRED_SET: dict[int, frozenset[str]] = {}
_DICT_TYPE = {dict}
_NOT_NONE = functools.partial(operator.is_not, None)


def _row_by_row(rows: list[Any], schema: Schema, where: str) -> Columns:
    """*rows* checked one by one (:func:`_fields`: raises on the first bad
    field), as :class:`Columns`."""
    checked = [_fields(r, schema, f"{where}.rows[{j}]") for j, r in enumerate(rows)]
    cols: dict[str, list[Any]] = {}
    for name in schema:
        col = [r[name] for r in checked]
        if any(v is not None for v in col):
            cols[name] = col
    return Columns(len(checked), cols)


def _checked_rows(ev: Mapping[str, Any], where: str, ok: Check, shape: str) -> list[Any]:
    """*ev*'s ``rows``: a list of at most :data:`MAX_EVENT_ROWS`, each *ok*.

    Raises:
        BatchError: naming the rows, or the first row that is not *shape*.
    """
    rows = ev.get("rows")
    if type(rows) is not list or len(rows) > MAX_EVENT_ROWS:
        raise BatchError(f"{where}.rows", f"not a list of at most {MAX_EVENT_ROWS} rows")
    for j, r in enumerate(rows):
        if not ok(r):
            raise BatchError(f"{where}.rows[{j}]", f"not {shape}: {_show(r)}")
    return rows


def _check_span(row: Mapping[str, Any], t0: str, t1: str, where: str) -> None:
    if not 0 <= row[t1] - row[t0] <= MAX_DURATION_NS:
        raise BatchError(f"{where}.{t1}", f"before {t0} or more than 7 days after it")


def _spans_ok(rows: Columns, t0: str, t1: str) -> bool:
    """Every row's *t1* is within 7 days after its *t0* (both required)."""
    if not rows.n:
        return True
    spans = list(map(operator.sub, rows.column(t1), rows.column(t0)))
    return min(spans) >= 0 and max(spans) <= MAX_DURATION_NS


def _check_spans(rows: Columns, t0: str, t1: str, where: str) -> None:
    """:func:`_check_span` of every row (both columns required).

    Raises:
        BatchError: naming the first row whose span is bad.
    """
    if not _spans_ok(rows, t0, t1):
        spans = map(operator.sub, rows.column(t1), rows.column(t0))
        j = next(j for j, d in enumerate(spans) if not 0 <= d <= MAX_DURATION_NS)
        raise BatchError(f"{where}[{j}].{t1}", f"before {t0} or more than 7 days after it")


def _event_head(ev: Any, where: str) -> dict[str, Any]:
    """An event's ``seq``, ``kind`` and (kinds about a run) ``run``, checked."""
    if type(ev) is not dict:
        raise BatchError(where, "not a JSON object")
    seq = ev.get("seq")
    if not _int(1)(seq):
        raise BatchError(f"{where}.seq", f"not a positive integer: {_show(seq)}")
    kind = ev.get("kind")
    if kind not in KINDS:
        raise BatchError(f"{where}.kind", f"{_show(kind)} is not one of {', '.join(KINDS)}")
    out: dict[str, Any] = {"seq": seq, "kind": kind}
    if kind in RUN_KINDS:
        run = ev.get("run")
        if type(run) is not str or not _UUID_RE.match(run):
            raise BatchError(f"{where}.run", f"not a run UUID (lower-case hex): {_show(run)}")
        out["run"] = run
    return out


def _event(ev: Any, where: str) -> dict[str, Any]:
    """One event checked; returns it normalized (known fields only)."""
    out = _event_head(ev, where)
    kind = out["kind"]
    if kind == "run":
        out["fields"] = _fields(ev.get("fields"), RUN_FIELDS, f"{where}.fields")
    elif kind == "end":
        out["fields"] = _fields(ev.get("fields"), END_FIELDS, f"{where}.fields")
    elif kind == "steps":
        out["rows"] = steps = _rows(ev, where, STEP_FIELDS)
        _check_spans(steps, "t0_ns", "t1_ns", f"{where}.rows")
    elif kind == "comm":
        out["rows"] = _rows(ev, where, COMM_FIELDS)
    elif kind == "run_cpu":
        out["rows"] = _rows(ev, where, RUN_CPU_FIELDS)
    elif kind == "worker_cpu":
        out["rows"] = _rows(ev, where, WORKER_CPU_FIELDS)
    elif kind == "host_samples":
        out["rows"] = _rows(ev, where, HOST_FIELDS)
    elif kind == "gpu_rollups":
        out["rows"] = _rows(ev, where, ROLLUP_FIELDS)
    elif kind == "stacks":
        source = ev.get("source")
        if source not in STACK_SOURCES:
            raise BatchError(f"{where}.source", f"not main or loader: {_show(source)}")
        rows = _checked_rows(ev, where, _stack_row, "[path, line, function, call, step, count]")
        out["source"], out["rows"] = source, rows
    elif kind == "kernels":
        out["window"] = _fields(ev.get("window"), KERNEL_WINDOW_FIELDS, f"{where}.window")
        _check_span(out["window"], "t0_ns", "t1_ns", f"{where}.window")
        rows = _checked_rows(
            ev,
            where,
            _kernel_row,
            "[name, kind, cls, count, total_ns, self_ns, flops] (see gpuprof.kernels)",
        )
        out["rows"] = rows
        replaces = ev.get("replaces") or []
        if type(replaces) is not list or len(replaces) > MAX_EVENT_ROWS:
            raise BatchError(f"{where}.replaces", "not a list of windows")
        out["replaces"] = [
            _fields(w, _WINDOW_KEY_FIELDS, f"{where}.replaces[{j}]") for j, w in enumerate(replaces)
        ]
    elif kind == "insights":
        items = ev.get("insights")
        if type(items) is not list or len(items) > MAX_INSIGHTS:
            raise BatchError(f"{where}.insights", f"not a list of at most {MAX_INSIGHTS}")
        out["insights"] = [
            _fields(i, INSIGHT_FIELDS, f"{where}.insights[{j}]") for j, i in enumerate(items)
        ]
    return out


def validate(batch: Any) -> dict[str, Any]:
    """Check a decoded batch; return it normalized: ``v``, ``node``, ``host``
    and ``events`` (each with only the fields its kind knows, None where absent).

    Raises:
        BatchError: the first bad field, by its path in the batch.
    """
    if type(batch) is not dict:
        raise BatchError("batch", "not a JSON object")
    if batch.get("v") != BATCH_VERSION:
        raise BatchError("v", f"version {_show(batch.get('v'))}; this server reads {BATCH_VERSION}")
    node = batch.get("node")
    if type(node) is not str or not _NODE_RE.match(node):
        raise BatchError("node", f"not a node id (1-64 of A-Z a-z 0-9 . _ : -): {_show(node)}")
    host = batch.get("host")
    if host is not None and not _text(255)(host):
        raise BatchError("host", f"bad value {_show(host)}")
    events = batch.get("events")
    if type(events) is not list or not 0 < len(events) <= MAX_EVENTS:
        raise BatchError("events", f"not a list of 1-{MAX_EVENTS} events")
    out = _events_at_once(events)
    if out is None:  # something is bad: found again event by event, and named
        out = _events_one_by_one(events)
    return {"v": BATCH_VERSION, "node": node, "host": host, "events": out}


#: The kinds whose rows have a schema, checked a column at a time.
_ROW_SCHEMAS: dict[str, Schema] = {
    "steps": STEP_FIELDS,
    "comm": COMM_FIELDS,
    "run_cpu": RUN_CPU_FIELDS,
    "worker_cpu": WORKER_CPU_FIELDS,
    "host_samples": HOST_FIELDS,
    "gpu_rollups": ROLLUP_FIELDS,
}


def _events_at_once(events: list[Any]) -> list[dict[str, Any]] | None:
    """*events* checked, the rows of all events of a kind together (a
    second of a node has eight ``steps`` events of ten rows: one check of
    each column for the 80); None if anything is bad
    (:func:`_events_one_by_one` then names the first bad field)."""
    out: list[dict[str, Any]] = []
    per_kind: dict[str, list[tuple[dict[str, Any], list[Any]]]] = {}
    last = rows = 0
    try:
        for i, ev in enumerate(events):
            kind = ev.get("kind") if type(ev) is dict else None
            if kind in _ROW_SCHEMAS:
                checked = _event_head(ev, "")
                listed = ev.get("rows")
                if type(listed) is not list or len(listed) > MAX_EVENT_ROWS:
                    return None
                per_kind.setdefault(kind, []).append((checked, listed))
                rows += len(listed)
            else:
                checked = _event(ev, f"events[{i}]")
                rows += len(checked.get("rows") or ())
            if checked["seq"] <= last or rows > MAX_BATCH_ROWS:
                return None
            last = checked["seq"]
            out.append(checked)
    except BatchError:
        return None
    for kind, parts in per_kind.items():
        listed = parts[0][1] if len(parts) == 1 else list(itertools.chain(*(p[1] for p in parts)))
        cols = _columns(listed, _ROW_SCHEMAS[kind])
        if cols is None or (kind == "steps" and not _spans_ok(cols, "t0_ns", "t1_ns")):
            return None
        first = 0
        for checked, part in parts:
            checked["rows"] = cols.slice(first, first + len(part))
            first += len(part)
    return out


def _events_one_by_one(events: list[Any]) -> list[dict[str, Any]]:
    """*events* checked in order.

    Raises:
        BatchError: the first bad field.
    """
    out: list[dict[str, Any]] = []
    rows = 0
    for i, ev in enumerate(events):
        checked = _event(ev, f"events[{i}]")
        if out and checked["seq"] <= out[-1]["seq"]:
            raise BatchError(
                f"events[{i}].seq",
                f"{checked['seq']} does not follow {out[-1]['seq']}: sequence numbers "
                "increase within a batch",
            )
        rows += len(checked.get("rows") or ())
        if rows > MAX_BATCH_ROWS:
            raise BatchError(f"events[{i}].rows", f"more than {MAX_BATCH_ROWS} rows in the batch")
        out.append(checked)
    return out
