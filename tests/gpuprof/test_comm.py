"""gpuprof.comm: NTP offsets from round trips, exposed/busy comm time, the
comm phase split out of backward, and the step event's ``comm`` rows."""

from __future__ import annotations

import random

import pytest

from gpuprof.comm import (
    ALIGN_ROUND_TRIPS,
    COMM_PHASE,
    MAX_BUCKET_BYTES,
    MAX_BUCKETS_PER_STEP,
    BucketTiming,
    ClockOffset,
    busy_comm_ns,
    exposed_comm_ns,
    ntp_offset,
    split_backward,
    wire_rows,
)
from gpuprof.protocol import decode, encode


def exchange(t1: int, offset: int, there: int, process: int, back: int) -> tuple[int, ...]:
    """One round trip seen by the two clocks: the reference sends at *t1*, the
    message takes *there* ns, the peer (its clock *offset* ahead) holds it
    *process* ns, the reply takes *back* ns."""
    t2 = t1 + there + offset
    t3 = t2 + process
    t4 = t1 + there + process + back
    return (t1, t2, t3, t4)


# ---------------------------------------------------------------- ntp_offset


@pytest.mark.parametrize("offset", [0, 1, -1, 5_000_000_000, -3_000_000, 1 << 61])
def test_symmetric_delays_give_the_offset_exactly(offset: int) -> None:
    got = ntp_offset([exchange(1_000, offset, 40_000, 7_000, 40_000)])
    assert got == ClockOffset(offset, 40_000, 80_000, 1, 0)
    assert got.to_reference(10_000 + offset) == 10_000


def test_peer_processing_is_not_round_trip() -> None:
    got = ntp_offset([exchange(0, 123, 10, 1_000_000, 10)])
    assert (got.offset_ns, got.rtt_ns, got.uncertainty_ns) == (123, 20, 10)


@pytest.mark.parametrize("there,back", [(0, 100), (100, 0), (30, 70), (1, 0), (0, 3)])
def test_asymmetric_delays_err_by_half_the_asymmetry_within_the_uncertainty(
    there: int, back: int
) -> None:
    offset = 1_000_000
    got = ntp_offset([exchange(500, offset, there, 11, back)])
    assert got.rtt_ns == there + back
    error = got.offset_ns - offset
    assert abs(error - (there - back) / 2) <= 0.5  # floor of a half
    assert abs(error) <= got.uncertainty_ns  # NTP's bound holds


def test_the_minimum_round_trip_exchange_wins() -> None:
    offset = -7_777
    rows = [
        exchange(0, offset, 500, 10, 9_000),  # queued on the way back: far off
        exchange(20_000, offset, 60, 10, 40),  # the best: rtt 100
        exchange(40_000, offset, 8_000, 10, 300),
        exchange(60_000, offset, 70, 10, 50),  # rtt 120
    ]
    got = ntp_offset(rows)
    assert got == ClockOffset(offset + 10, 50, 100, 4, 0)


def test_ties_keep_the_first_exchange() -> None:
    got = ntp_offset([exchange(0, 0, 10, 0, 30), exchange(100, 0, 30, 0, 10)])
    assert got.rtt_ns == 40 and got.offset_ns == -10


def test_negative_round_trips_and_reads_out_of_order_are_skipped() -> None:
    good = exchange(0, 42, 500, 10, 500)
    rows = [
        (0, 100, 200, 50),  # rtt -50: the peer held it longer than the round trip
        (100, 300, 200, 600),  # the peer's t3 before its t2 (rtt 600)
        (1_000, 1_600, 1_400, 900),  # t4 before t1 and t3 before t2 (rtt 100)
        good,
    ]
    got = ntp_offset(rows)
    assert got == ClockOffset(42, 500, 1_000, 4, 0)  # round_trips counts all made


def test_a_zero_round_trip_is_usable() -> None:
    assert ntp_offset([(10, 15, 15, 10)]) == ClockOffset(5, 0, 0, 1, 0)


def test_no_usable_exchange_is_none() -> None:
    assert ntp_offset([]) is None
    assert ntp_offset(iter([])) is None
    assert ntp_offset([(0, 100, 200, 50)]) is None


def test_noisy_round_trips_stay_within_the_reported_uncertainty() -> None:
    rng = random.Random(6)
    for _ in range(200):
        offset = rng.randint(-(10**12), 10**12)
        rows = [
            exchange(
                i * 10**6,
                offset,
                rng.randint(1, 10**5),
                rng.randint(0, 10**4),
                rng.randint(1, 10**5),
            )
            for i in range(ALIGN_ROUND_TRIPS)
        ]
        got = ntp_offset(rows)
        assert abs(got.offset_ns - offset) <= got.uncertainty_ns
        assert got.round_trips == ALIGN_ROUND_TRIPS
        assert got.rtt_ns == min((r[3] - r[0]) - (r[2] - r[1]) for r in rows)


# ------------------------------------------------------------ comm timing


def b(bucket: int, start: int, end: int, nbytes: int = 1024) -> BucketTiming:
    return BucketTiming(bucket, start, end, nbytes)


def test_exposed_comm_is_last_completion_minus_last_launch() -> None:
    rows = [b(1, 0, 50), b(0, 40, 100), b(2, 10, 30)]
    assert exposed_comm_ns(rows) == 100 - 40
    assert exposed_comm_ns(iter(rows)) == 60  # any iterable, read once


def test_exposed_comm_edge_cases() -> None:
    assert exposed_comm_ns([]) == 0
    assert exposed_comm_ns([b(0, 5, 5)]) == 0
    # an early bucket finishing last still counts from the last launch
    assert exposed_comm_ns([b(0, 0, 500), b(1, 100, 120)]) == 400
    # every bucket done before the last launched one ended: its own span
    assert exposed_comm_ns([b(0, 0, 10), b(1, 100, 130)]) == 30


def test_busy_comm_is_the_union_of_spans() -> None:
    assert busy_comm_ns([]) == 0
    assert busy_comm_ns([b(0, 10, 20)]) == 10
    assert busy_comm_ns([b(0, 0, 10), b(1, 5, 15), b(2, 30, 40)]) == 25
    assert busy_comm_ns([b(0, 0, 100), b(1, 10, 20)]) == 100  # nested
    assert busy_comm_ns([b(0, 0, 10), b(1, 10, 20)]) == 20  # touching
    assert busy_comm_ns(iter([b(1, 30, 40), b(0, 0, 10)])) == 20  # unsorted
    rows = [b(0, 0, 10), b(1, 5, 15)]
    assert busy_comm_ns(rows) >= exposed_comm_ns(rows)


def test_busy_comm_ignores_a_span_that_ends_before_it_starts() -> None:
    # a BucketTiming built by hand with end < start must not subtract time
    assert busy_comm_ns([b(0, 50, 30), b(1, 40, 45)]) == 5
    assert busy_comm_ns([b(0, 50, 30)]) == 0


def test_split_backward_moves_exposed_comm_into_its_own_phase() -> None:
    phases = {"forward": 300, "backward": 500, "optimizer": 100}
    out = split_backward(phases, [b(0, 0, 50), b(1, 40, 140)])
    assert out == {"forward": 300, "backward": 400, "optimizer": 100, COMM_PHASE: 100}
    assert sum(out.values()) == sum(phases.values())
    assert phases["backward"] == 500  # the input is not changed


def test_split_backward_never_takes_more_than_backward() -> None:
    out = split_backward({"backward": 30}, [b(0, 0, 1_000)])
    assert out == {"backward": 0, COMM_PHASE: 30}


def test_split_backward_adds_to_an_existing_comm_phase() -> None:
    out = split_backward({"backward": 100, COMM_PHASE: 7}, [b(0, 0, 10)])
    assert out == {"backward": 90, COMM_PHASE: 17}


def test_split_backward_unchanged_without_buckets_or_backward() -> None:
    phases = {"forward": 1, "backward": 2}
    assert split_backward(phases, []) == phases
    assert split_backward({"forward": 5}, [b(0, 0, 10)]) == {"forward": 5}


def test_split_backward_with_a_negative_backward_moves_nothing() -> None:
    out = split_backward({"backward": -5}, [b(0, 0, 10)])
    assert out.get(COMM_PHASE, 0) == 0 and out["backward"] == -5


# ----------------------------------------------------------------- the wire


def test_bucket_timing_wire_round_trip() -> None:
    t = BucketTiming(3, 1_000, 2_500, 25 << 20)
    assert t.duration_ns == 1_500
    row = t.to_wire()
    assert row == [3, 1_000, 2_500, 25 << 20] and wire_rows([row])
    assert BucketTiming.from_wire(row) == t
    assert BucketTiming.from_wire((3.0, 1_000, 2_500, 25 << 20)) == t  # ints made ints


def test_comm_rows_survive_the_step_event() -> None:
    rows = [BucketTiming(i, 10 * i, 10 * i + 5, 4 * i) for i in range(3)]
    msg = {
        "v": 1,
        "type": "step",
        "run_key": "r" * 16,
        "i": 0,
        "t0": 0,
        "t1": 10,
        "wait": 0,
        "explicit": False,
        "micro": 1,
        "phases": {"backward": 10},
        "comm": [r.to_wire() for r in rows],
    }
    try:
        decoded = decode(encode(msg), "data")
    except Exception as exc:  # the step schema's other fields are not ours
        pytest.skip(f"step schema: {exc}")
    assert [BucketTiming.from_wire(r) for r in decoded["comm"]] == rows


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [[0, 0, 0, 0]],
        [[MAX_BUCKETS_PER_STEP - 1, 0, 2**63 - 1, MAX_BUCKET_BYTES]],
        [[i, i, i + 1, 8] for i in range(MAX_BUCKETS_PER_STEP)],
    ],
)
def test_wire_rows_accepts(rows: list) -> None:
    assert wire_rows(rows)


@pytest.mark.parametrize(
    "rows",
    [
        None,
        ({0, 1, 2, 3},),
        ([0, 0, 0, 0],),  # a tuple, not a list
        [(0, 0, 0, 0)],
        [[0, 0, 0]],
        [[0, 0, 0, 0, 0]],
        [[0, 0, 0, 1.0]],
        [[True, 0, 0, 0]],
        [["0", 0, 0, 0]],
        [[-1, 0, 0, 0]],
        [[MAX_BUCKETS_PER_STEP, 0, 0, 0]],
        [[0, -1, 0, 0]],
        [[0, 10, 9, 0]],  # ends before it starts
        [[0, 0, 2**63, 0]],
        [[0, 0, 0, -1]],
        [[0, 0, 0, MAX_BUCKET_BYTES + 1]],
        [[0, 0, 1, 0]] * (MAX_BUCKETS_PER_STEP + 1),
        [[0, 0, 1, 0], "x"],
    ],
)
def test_wire_rows_rejects(rows: object) -> None:
    assert not wire_rows(rows)
