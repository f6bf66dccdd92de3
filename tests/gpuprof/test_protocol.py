from __future__ import annotations

import os

import orjson
import pytest

from gpuprof.protocol import (
    MAX_BATCH_EVENTS,
    MAX_MEMORY_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_PID,
    MAX_WORKERS,
    PROTOCOL_VERSION,
    ProtocolError,
    clean_run_name,
    clean_text,
    decode,
    decode_events,
    encode,
)


def step(**kw):
    msg = {
        "v": PROTOCOL_VERSION,
        "type": "step",
        "run_key": "abc123",
        "i": 0,
        "t0": 10,
        "t1": 20,
        "wait": 5,
        "explicit": False,
        "micro": 1,
        "phases": {"forward": 3},
    }
    msg.update(kw)
    return msg


def reason(data: bytes, channel=None) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(data, channel)
    return info.value.reason


def test_valid_step_round_trips():
    assert decode(encode(step()), "data") == step()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x00\xffgarbage", "not_json"),
        (encode(step())[:-7], "not_json"),  # truncated
        (b"[1, 2]", "not_object"),
        (encode(step(v=2)), "bad_version"),
        (encode(step(type="kernels_v9")), "unknown_type"),
        (encode(step(i=-1)), "bad_field:i"),
        (encode(step(i=True)), "bad_field:i"),  # bool is not an int here
        (encode(step(t1=5)), "bad_field:t1"),  # ends before it starts
        (encode(step(t0=0, t1=2**63 - 1)), "bad_field:t1"),  # a 292-year step
        (encode(step(wait=8 * 86_400 * 10**9)), "bad_field:wait"),
        (encode(step(phases={"forward": 2**62})), "bad_field:phases"),
        (encode(step(run_key="../../etc")), "bad_field:run_key"),
        (encode(step(phases={"a\nb": 1})), "bad_field:phases"),
        (encode(step(phases={f"p{i}": 1 for i in range(40)})), "bad_field:phases"),
        (encode({k: v for k, v in step().items() if k != "micro"}), "bad_field:micro"),
    ],
)
def test_bad_messages_have_countable_reasons(data, expected):
    assert reason(data) == expected


def test_oversized_is_rejected_before_parsing():
    big = orjson.dumps(step(pad="x" * MAX_MESSAGE_BYTES))
    assert reason(big) == "oversized"


def test_channel_is_enforced():
    assert reason(encode(step()), "control") == "wrong_channel"
    assert reason(encode({"v": 1, "type": "ping"}), "data") == "wrong_channel"
    assert decode(encode({"v": 1, "type": "ping"}), "control")["type"] == "ping"


def test_hello_run_name_with_control_chars_rejected():
    hello = {
        "v": 1,
        "type": "hello",
        "run_key": "k",
        "run_name": "a\x1b[31mred",
        "pid": 1,
        "host": "h",
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "wall_ns": 1,
        "mono_ns": 1,
        "auto": True,
        "options": {},
    }
    assert reason(encode(hello)) == "bad_field:run_name"
    hello["run_name"] = clean_run_name(hello["run_name"])
    assert decode(encode(hello))["run_name"] == "a [31mred"


def test_undecodable_and_bidi_characters_are_cleaned_not_fatal():
    import os

    name = clean_run_name(os.fsdecode(b"exp-\xff") + "\u202egnp.exe\u2028x")
    assert name == "exp-\\xff gnp.exe x"
    name.encode("utf-8")  # orjson can send it
    hello = {
        "v": 1,
        "type": "hello",
        "run_key": "k",
        "run_name": "a\u202eb",
        "pid": 1,
        "host": "h",
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "wall_ns": 1,
        "mono_ns": 1,
        "auto": True,
        "options": {},
    }
    assert reason(encode(hello)) == "bad_field:run_name"
    hello["run_name"] = "naïve run · ümlaut 実験"
    assert decode(encode(hello))["run_name"] == "naïve run · ümlaut 実験"


def test_a_lone_surrogate_no_decoder_made_is_escaped_not_raised():
    # profile("x", group="\ud800") raised UnicodeEncodeError into the user's code:
    # surrogateescape encodes only U+DC80..U+DCFF
    assert clean_run_name("run-\ud800") == "run-\\ud800"
    assert clean_text("\udcff\ud83d-\udfff", 100) == "\\xff\\ud83d-\\udfff"
    assert clean_text(os.fsdecode(b"a\xc3") + "\ud800", 100) == "a\\xc3\\ud800"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("  exp\t1\n", "exp 1"),
        ("", "unnamed"),
        ("\x00\x01", "unnamed"),
        ("<script>x</script>'; DROP TABLE runs;--", "<script>x</script>'; DROP TABLE runs;--"),
        ("é" * 300, "é" * 200),
    ],
)
def test_clean_run_name(raw, clean):
    assert clean_run_name(raw) == clean


def _opt(**kw):
    return {"name": "Adam#0", "updates": 1, "skipped": 0, "ns": 1000, **kw}


def test_step_with_skipped_eval_and_optimizers_is_valid():
    msg = step(skipped=True, eval=5, optimizers=[_opt(), _opt(name="SGD#1", skipped=1)])
    assert decode(encode(msg), "data") == msg


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"skipped": 1}, "skipped"),  # an int is not a bool
        ({"eval": -1}, "eval"),
        ({"eval": 8 * 86_400 * 10**9}, "eval"),
        ({"optimizers": {"Adam#0": 1}}, "optimizers"),
        ({"optimizers": [_opt()] * 17}, "optimizers"),
        ({"optimizers": [_opt(name="a\x1bb")]}, "optimizers"),
        ({"optimizers": [_opt(updates=-1)]}, "optimizers"),
        ({"optimizers": [_opt(ns=2**62)]}, "optimizers"),
        ({"optimizers": [_opt(extra=1)]}, "optimizers"),
        ({"optimizers": [{"name": "x", "updates": 1, "skipped": 0}]}, "optimizers"),
    ],
)
def test_bad_optional_step_fields_are_rejected(extra, field):
    assert reason(encode(step(**extra))) == f"bad_field:{field}"


# --- workers -----------------------------------------------------------------------


def workers(**kw):
    msg = {
        "v": PROTOCOL_VERSION,
        "type": "workers",
        "run_key": "abc123",
        "loader_seq": 0,
        "workers": [{"worker_id": 0, "pid": 4001}, {"worker_id": 1, "pid": 4002}],
        "t_ns": 10,
    }
    msg.update(kw)
    return msg


def test_valid_workers_round_trips_on_the_data_channel():
    assert decode(encode(workers()), "data") == workers()
    assert reason(encode(workers()), "control") == "wrong_channel"


def test_the_largest_worker_pool_fits_in_one_message():
    pool = [{"worker_id": i, "pid": MAX_PID - i} for i in range(MAX_WORKERS)]
    data = encode(workers(workers=pool, loader_seq=1 << 40, t_ns=2**63 - 1))
    assert len(data) <= MAX_MESSAGE_BYTES
    assert len(decode(data, "data")["workers"]) == MAX_WORKERS


def _w(worker_id, pid):
    return {"worker_id": worker_id, "pid": pid}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"loader_seq": -1}, "loader_seq"),
        ({"loader_seq": "0"}, "loader_seq"),
        ({"loader_seq": (1 << 40) + 1}, "loader_seq"),
        ({"t_ns": -5}, "t_ns"),
        ({"workers": []}, "workers"),  # a pool of no workers is not a message
        ({"workers": {"0": 4001}}, "workers"),
        ({"workers": [[0, 4001]]}, "workers"),
        ({"workers": [_w(i, 5000 + i) for i in range(MAX_WORKERS + 1)]}, "workers"),
        ({"workers": [_w(0, 0)]}, "workers"),  # pid 0 is the scheduler, not a worker
        ({"workers": [_w(0, MAX_PID + 1)]}, "workers"),
        ({"workers": [_w(0, 4001.0)]}, "workers"),
        ({"workers": [_w(True, 4001)]}, "workers"),
        ({"workers": [_w(-1, 4001)]}, "workers"),
        ({"workers": [_w(MAX_WORKERS, 4001)]}, "workers"),
        ({"workers": [_w(0, 4001), _w(0, 4002)]}, "workers"),  # worker 0 twice
        ({"workers": [_w(0, 4001), _w(1, 4001)]}, "workers"),  # one process, two ids
        ({"workers": [{"worker_id": 0}]}, "workers"),
        ({"workers": [{**_w(0, 4001), "name": "x"}]}, "workers"),
    ],
)
def test_bad_workers_fields_are_rejected(extra, field):
    assert reason(encode(workers(**extra))) == f"bad_field:{field}"


def test_workers_without_run_key_is_rejected():
    msg = {k: v for k, v in workers().items() if k != "run_key"}
    assert reason(encode(msg), "data") == "bad_field:run_key"


GiB = 2**30


def test_step_with_torch_memory_is_valid():
    # allocated < reserved, and peak above allocated: the normal picture
    msg = step(mem=[3 * GiB, 4 * GiB, 5 * GiB])
    assert decode(encode(msg), "data")["mem"] == [3 * GiB, 4 * GiB, 5 * GiB]
    # the bounds themselves, and an order the non-atomic reads can produce
    for mem in ([0, 0, 0], [MAX_MEMORY_BYTES] * 3, [5, 4, 3]):
        assert decode(encode(step(mem=mem)), "data")["mem"] == mem


@pytest.mark.parametrize(
    "mem",
    [
        [1, 2],  # too few
        [1, 2, 3, 4],  # too many
        [-1, 2, 3],  # negative
        [1, MAX_MEMORY_BYTES + 1, 3],  # beyond any device
        [1.0, 2, 3],  # a float is not a byte count
        [True, 2, 3],  # nor is a bool
        ["1", 2, 3],
        {"allocated": 1, "reserved": 2, "peak": 3},
        None,
    ],
)
def test_bad_torch_memory_is_rejected(mem):
    assert reason(encode(step(mem=mem))) == "bad_field:mem"


# --- kernels -----------------------------------------------------------------------

from gpuprof.kernels import MAX_NAME_CHARS, MAX_ROWS, KernelAgg  # noqa: E402
from gpuprof.protocol import MAX_DURATION_NS, MAX_WINDOW_STEPS  # noqa: E402


def _row(**kw):
    row = {
        "name": "ampere_sgemm_128x64_tn",
        "kind": "kernel",
        "cls": "compute",
        "count": 12,
        "total_ns": 3_000_000,
        "self_ns": 3_000_000,
        "flops": None,
    }
    row.update(kw)
    return list(row.values())


def kernels(**kw):
    msg = {
        "v": PROTOCOL_VERSION,
        "type": "kernels",
        "run_key": "abc123",
        "t0": 100,
        "t1": 200_000_100,
        "source": "snapshot",
        "steps": [5],
        "rows": [
            _row(),
            _row(name="aten::mm", kind="op", total_ns=4_000_000, self_ns=0, flops=1.5e12),
        ],
        "rows_dropped": 0,
    }
    msg.update(kw)
    return msg


def test_valid_kernels_round_trips_on_the_data_channel():
    msg = kernels()
    assert decode(encode(msg), "data") == msg
    assert reason(encode(msg), "control") == "wrong_channel"
    rows = [KernelAgg.from_wire(r) for r in decode(encode(msg), "data")["rows"]]
    assert rows[1] == KernelAgg("aten::mm", "op", "compute", 12, 4_000_000, 0, 1.5e12)


def test_kernels_edge_values_are_valid():
    for extra in (
        {"rows": []},  # a window where nothing ran on the device
        {"steps": []},  # a continuous window between steps
        {"t1": 100},  # an empty window
        {"source": "continuous"},
        {"source": "nsys"},
        {"rows": [_row(cls=c) for c in ("comm", "memcpy", "memset", "other")]},
        {"rows": [_row(flops=0)]},
        {"rows": [_row(name="x" * MAX_NAME_CHARS)]},
        {"steps": list(range(MAX_WINDOW_STEPS))},
    ):
        msg = kernels(**extra)
        assert decode(encode(msg), "data") == msg
    msg = kernels()
    del msg["rows_dropped"]  # optional
    assert decode(encode(msg), "data") == msg


def test_the_largest_kernels_window_fits_in_one_message():
    rows = [
        _row(
            name=f"{i:04d}" + "k" * (MAX_NAME_CHARS - 4),
            count=1 << 40,
            total_ns=MAX_DURATION_NS,
            self_ns=MAX_DURATION_NS,
            flops=1e30,
        )
        for i in range(MAX_ROWS)
    ]
    data = encode(kernels(rows=rows, rows_dropped=10**6, t0=0, t1=MAX_DURATION_NS))
    assert len(data) <= MAX_MESSAGE_BYTES
    assert len(decode(data, "data")["rows"]) == MAX_ROWS


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"t0": -1}, "t0"),
        ({"t1": 99}, "t1"),  # ends before it starts
        ({"t0": 0, "t1": MAX_DURATION_NS + 1}, "t1"),
        ({"source": "trace"}, "source"),
        ({"source": ["snapshot"]}, "source"),
        ({"steps": 5}, "steps"),
        ({"steps": [-1]}, "steps"),
        ({"steps": [1.0]}, "steps"),
        ({"steps": list(range(MAX_WINDOW_STEPS + 1))}, "steps"),
        ({"rows": {"k": 1}}, "rows"),
        ({"rows": [_row()] * (MAX_ROWS + 1)}, "rows"),
        ({"rows": [_row()[:6]]}, "rows"),  # flops missing
        ({"rows": [[*_row(), 1]]}, "rows"),
        ({"rows": [_row(name="")]}, "rows"),
        ({"rows": [_row(name="x" * (MAX_NAME_CHARS + 1))]}, "rows"),
        ({"rows": [_row(name="a\x1b[31mb")]}, "rows"),
        ({"rows": [_row(name=7)]}, "rows"),
        ({"rows": [_row(kind="kernels")]}, "rows"),
        ({"rows": [_row(cls="nccl")]}, "rows"),
        ({"rows": [_row(count=-1)]}, "rows"),
        ({"rows": [_row(count=True)]}, "rows"),
        ({"rows": [_row(count=2.0)]}, "rows"),
        ({"rows": [_row(total_ns=-5, self_ns=-5)]}, "rows"),
        ({"rows": [_row(total_ns=MAX_DURATION_NS + 1, self_ns=0)]}, "rows"),
        ({"rows": [_row(total_ns=10, self_ns=11)]}, "rows"),  # self beyond total
        ({"rows": [_row(flops=-1.0)]}, "rows"),
        ({"rows": [_row(flops=1e31)]}, "rows"),
        ({"rows": [_row(flops="1e12")]}, "rows"),
        ({"rows_dropped": -1}, "rows_dropped"),
    ],
)
def test_bad_kernels_fields_are_rejected(extra, field):
    assert reason(encode(kernels(**extra)), "data") == f"bad_field:{field}"


@pytest.mark.parametrize("field", ["run_key", "t0", "t1", "source", "steps", "rows"])
def test_kernels_required_fields(field):
    msg = {k: v for k, v in kernels().items() if k != field}
    assert reason(encode(msg), "data") == f"bad_field:{field}"


def test_step_traced_is_an_optional_bool():
    assert decode(encode(step(traced=True)), "data")["traced"] is True
    assert decode(encode(step(traced=False)), "data")["traced"] is False
    assert reason(encode(step(traced=1))) == "bad_field:traced"
    assert reason(encode(step(traced="yes"))) == "bad_field:traced"


# --- batch ------------------------------------------------------------------


def inner(**kw):
    """A step as it goes inside a batch: no v, no run_key (the envelope's apply)."""
    return {k: v for k, v in step(**kw).items() if k not in ("v", "run_key")}


def batch_of(events, **kw):
    msg = {"v": PROTOCOL_VERSION, "type": "batch", "run_key": "abc123", "events": events}
    msg.update(kw)
    return encode(msg)


def test_a_batch_expands_into_events_that_carry_its_version_and_run():
    events, bad = decode_events(batch_of([inner(i=0), inner(i=1), step(i=2)]))
    assert bad == []
    assert events == [step(i=0), step(i=1), step(i=2)]


def test_a_single_event_frame_is_a_list_of_one():
    assert decode_events(encode(step(i=4))) == ([step(i=4)], [])


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (inner(i=-1), "bad_field:i"),
        (inner(t1=5), "bad_field:t1"),
        (inner(phases={"a\nb": 1}), "bad_field:phases"),
        ({**inner(), "v": 2}, "bad_version"),
        ({**inner(), "run_key": "someone-else"}, "bad_field:run_key"),
        ({**inner(), "type": "teleport"}, "unknown_type"),
        ({**inner(), "type": "bye"}, "wrong_channel"),  # a control request inside a batch
        ({**inner(), "type": "batch"}, "wrong_channel"),  # no batch inside a batch
        ([1, 2], "not_object"),
        ({k: v for k, v in inner().items() if k != "micro"}, "bad_field:micro"),
    ],
)
def test_one_bad_event_in_a_batch_is_dropped_with_its_reason_the_rest_kept(event, expected):
    events, bad = decode_events(batch_of([inner(i=0), event, inner(i=2)]))
    assert [e["i"] for e in events] == [0, 2]
    assert [e.reason for e in bad] == [expected]


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (batch_of([]), "bad_field:events"),  # empty
        (batch_of([inner(i=k) for k in range(MAX_BATCH_EVENTS + 1)]), "bad_field:events"),
        (batch_of({"0": inner()}), "bad_field:events"),  # not a list
        (batch_of([inner()], run_key="../etc"), "bad_field:run_key"),
        (batch_of([inner()], v=2), "bad_version"),
        (batch_of(None), "bad_field:events"),
        (batch_of([inner(phases={"p": 1, "pad": 0}) for _ in range(2000)])[:-3], "not_json"),
    ],
)
def test_a_malformed_batch_envelope_is_one_drop(frame, expected):
    with pytest.raises(ProtocolError) as info:
        decode_events(frame)
    assert info.value.reason == expected


def test_a_batch_over_the_byte_bound_is_one_oversized_drop():
    big = {"phases": {f"p{k}": 1 for k in range(30)}}
    n = MAX_MESSAGE_BYTES // len(encode(inner(**big))) + 2
    assert n <= MAX_BATCH_EVENTS
    with pytest.raises(ProtocolError) as info:
        decode_events(batch_of([inner(i=k, **big) for k in range(n)]))
    assert info.value.reason == "oversized"


def test_a_batch_belongs_on_the_data_channel_only():
    assert reason(batch_of([inner()]), "control") == "wrong_channel"
    msg = decode(batch_of([inner()]), "data")  # the envelope alone passes decode
    assert msg["type"] == "batch" and len(msg["events"]) == 1


# --- loaders -----------------------------------------------------------------------


def _cfg(**kw):
    cfg = {"num_workers": 2, "persistent_workers": True, "pin_memory": False, "prefetch_factor": 2}
    cfg.update(kw)
    return cfg


def loaders(**kw):
    msg = {"v": PROTOCOL_VERSION, "type": "loaders", "run_key": "abc123", "loaders": [_cfg()]}
    msg.update(kw)
    return msg


def test_valid_loaders_round_trip_on_the_data_channel():
    assert decode(encode(loaders()), "data") == loaders()
    in_process = _cfg(num_workers=0, persistent_workers=False, prefetch_factor=None)
    assert decode(encode(loaders(loaders=[in_process] * 8)), "data")["loaders"][0] == in_process
    assert reason(encode(loaders()), "control") == "wrong_channel"


@pytest.mark.parametrize(
    "bad",
    [
        [],  # no loader is not a message
        [_cfg()] * 9,  # more than MAX_LOADERS
        {"num_workers": 2},
        [_cfg(num_workers=-1)],
        [_cfg(num_workers=MAX_WORKERS + 1)],
        [_cfg(num_workers=True)],
        [_cfg(num_workers=2.0)],
        [_cfg(persistent_workers=1)],
        [_cfg(pin_memory="yes")],
        [_cfg(prefetch_factor=0)],
        [_cfg(prefetch_factor=None)],  # workers prefetch: torch always has a factor
        [_cfg(num_workers=0, prefetch_factor=2)],  # no workers: no factor
        [_cfg(prefetch_factor=(1 << 16) + 1)],
        [{**_cfg(), "batch_size": 32}],  # unknown key
        [{k: v for k, v in _cfg().items() if k != "pin_memory"}],
    ],
)
def test_bad_loaders_are_rejected(bad):
    assert reason(encode(loaders(loaders=bad))) == "bad_field:loaders"


# --- stacks -------------------------------------------------------------------

from gpuprof.protocol import (  # noqa: E402
    MAX_STACK_COUNT,
    MAX_STACK_NAME_CHARS,
    MAX_STACK_PATH_CHARS,
    MAX_STACK_ROWS,
    batch,
    decode_frame,
)


def stacks(**kw):
    msg = {
        "v": PROTOCOL_VERSION,
        "type": "stacks",
        "run_key": "abc123",
        "source": "main",
        "rows": [["/home/u/train.py", 212, "save_checkpoint", "torch.save", 20, 4]],
    }
    msg.update(kw)
    return msg


def test_valid_stacks_round_trips_on_the_data_channel_and_in_a_batch():
    assert decode(encode(stacks()), "data")["rows"][0][3] == "torch.save"
    rows = [["/x/a.py", 1, "f", "", 0, 1]]  # call "": the sample was in the user frame
    events, errors, _ = decode_frame(encode(batch("abc123", [stacks(source="loader", rows=rows)])))
    assert errors == [] and events[0]["source"] == "loader" and events[0]["rows"] == rows


def test_the_largest_stacks_event_fits_in_one_message():
    row = ["/" + "p" * (MAX_STACK_PATH_CHARS - 1), 1 << 24, "f" * MAX_STACK_NAME_CHARS]
    row += ["c" * MAX_STACK_NAME_CHARS, 1 << 40, MAX_STACK_COUNT]
    data = encode(batch("abc123", [stacks(rows=[row] * MAX_STACK_ROWS)], seq=1))
    assert len(data) <= MAX_MESSAGE_BYTES
    assert len(decode_events(data)[0][0]["rows"]) == MAX_STACK_ROWS


def _srow(**kw):
    row = {"path": "/x/t.py", "line": 3, "function": "f", "call": "", "step": 1, "count": 1}
    row.update(kw)
    return list(row.values())


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"source": "worker"}, "source"),
        ({"source": None}, "source"),
        ({"rows": []}, "rows"),
        ({"rows": [_srow()] * (MAX_STACK_ROWS + 1)}, "rows"),
        ({"rows": [_srow()[:5]]}, "rows"),
        ({"rows": [_srow(path="")]}, "rows"),
        ({"rows": [_srow(path="a\x00b")]}, "rows"),
        ({"rows": [_srow(path="p" * (MAX_STACK_PATH_CHARS + 1))]}, "rows"),
        ({"rows": [_srow(line=-1)]}, "rows"),
        ({"rows": [_srow(line=True)]}, "rows"),
        ({"rows": [_srow(function="")]}, "rows"),
        ({"rows": [_srow(function="f" * (MAX_STACK_NAME_CHARS + 1))]}, "rows"),
        ({"rows": [_srow(call=None)]}, "rows"),
        ({"rows": [_srow(call="a\nb")]}, "rows"),
        ({"rows": [_srow(step=-1)]}, "rows"),
        ({"rows": [_srow(count=0)]}, "rows"),
        ({"rows": [_srow(count=MAX_STACK_COUNT + 1)]}, "rows"),
        ({"rows": [_srow(count=1.0)]}, "rows"),
        ({"rows": "x"}, "rows"),
    ],
)
def test_bad_stacks_fields_are_rejected(extra, field):
    assert reason(encode(stacks(**extra)), "data") == f"bad_field:{field}"


def test_a_bad_stacks_event_in_a_batch_is_one_counted_drop_the_rest_kept():
    bad = stacks(rows=[_srow(count=-3)])
    events, errors, _ = decode_frame(encode(batch("abc123", [stacks(), bad])))
    assert len(events) == 1 and [e.reason for e in errors] == ["bad_field:rows"]
