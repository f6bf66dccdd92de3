"""Per-bucket collective timings: the contract between the shim's DDP comm
hook, the wire, the daemon's storage and the group rules. Pure: no torch.

One :class:`BucketTiming` is one DDP gradient bucket's all-reduce in one
optimizer step on one rank: when its gradients were ready and the collective
was launched (the comm hook ran), when it completed on this rank, and its
size. Times are ``time.monotonic_ns()`` of the rank's node; across nodes a
rank's clock offset (:class:`ClockOffset`) puts them on rank 0's clock.

The *exposed* comm time of a step (:func:`exposed_comm_ns`) is the part of
the collectives that compute did not hide: from the moment the last bucket
was launched (backward had produced every gradient) to the moment the last
bucket completed. It is the step breakdown's ``comm`` phase (taken out of
``backward``, in which DDP waits for the buckets), and the group rules'
``comm_ms``: a rank that waits for a slower rank waits here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The step phase holding the exposed comm time, ns (a key of ``phases``).
COMM_PHASE = "comm"
#: Buckets listed per step on the wire. DDP's default ``bucket_cap_mb=25``
#: gives one bucket per 25 MB of gradients: ~280 for a 7B-parameter model in
#: fp32 gradients; 1024 leaves room for small caps on large models.
MAX_BUCKETS_PER_STEP = 1024
#: Largest bucket accepted (bytes): 1 TiB, far above any gradient bucket.
MAX_BUCKET_BYTES = 1 << 40
#: Round trips the clock alignment makes with each peer: the least-RTT one of
#: 64 gives a few µs of error on a loaded VM.
ALIGN_ROUND_TRIPS = 64


@dataclass(frozen=True, slots=True)
class BucketTiming:
    """One gradient bucket's collective in one step on one rank.

    Attributes:
        bucket: DDP's bucket index (``GradBucket.index()``; 0 holds the
            parameters whose gradients are ready last, DDP buckets in
            reverse order of registration).
        start_ns: the comm hook ran (gradients ready, collective launched),
            monotonic ns.
        end_ns: the collective completed on this rank, monotonic ns
            (``>= start_ns``).
        nbytes: the bucket's flattened gradient buffer, bytes.
    """

    bucket: int
    start_ns: int
    end_ns: int
    nbytes: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_wire(self) -> list[int]:
        """``[bucket, start_ns, end_ns, nbytes]``: the step event's ``comm`` row."""
        return [self.bucket, self.start_ns, self.end_ns, self.nbytes]

    @classmethod
    def from_wire(cls, row: Sequence[int]) -> BucketTiming:
        """Inverse of :meth:`to_wire` (the row must have passed
        :func:`gpuprof.protocol.decode`)."""
        bucket, start, end, nbytes = row
        return cls(int(bucket), int(start), int(end), int(nbytes))


def exposed_comm_ns(buckets: Iterable[BucketTiming]) -> int:
    """Comm time not hidden under compute in one step, ns: the last bucket's
    completion minus the last bucket's launch (0 for no buckets).

    While backward still runs, earlier buckets' all-reduces overlap with it;
    once the last bucket is launched, backward has nothing left to compute and
    DDP waits for the collectives to finish (its ``finalize_backward``).
    A rank waiting for a slower rank's gradients waits in this span.
    """
    rows = list(buckets)
    if not rows:
        return 0
    return max(0, max(b.end_ns for b in rows) - max(b.start_ns for b in rows))


def busy_comm_ns(buckets: Iterable[BucketTiming]) -> int:
    """Time during which at least one bucket's collective was in flight, ns
    (the union of the buckets' ``[start, end]`` spans; a span ending before
    it starts is empty, it never subtracts)."""
    spans = sorted((b.start_ns, max(b.start_ns, b.end_ns)) for b in buckets)
    total, cur_s, cur_e = 0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def split_backward(phases: Mapping[str, int], buckets: Sequence[BucketTiming]) -> dict[str, int]:
    """*phases* with the step's exposed comm moved from ``backward`` into
    :data:`COMM_PHASE` (never more than ``backward`` held: phases still sum
    to what they did; a negative ``backward`` gives up nothing). Unchanged
    without buckets or a ``backward`` phase."""
    out = dict(phases)
    backward = out.get("backward")
    if not buckets or backward is None:
        return out
    comm = max(0, min(exposed_comm_ns(buckets), backward))
    out["backward"] = backward - comm
    out[COMM_PHASE] = out.get(COMM_PHASE, 0) + comm
    return out


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """A rank's monotonic clock against the reference rank's (rank 0), from
    NTP-style round trips (the exchange with the smallest round-trip time).

    Attributes:
        offset_ns: this rank's clock minus the reference's, ns: a time ``t``
            on this rank is ``t - offset_ns`` on the reference clock.
        uncertainty_ns: half the best exchange's round-trip time, ns: the true
            offset lies within ``offset_ns ± uncertainty_ns`` (NTP's bound).
        rtt_ns: the best exchange's round-trip time (peer processing excluded), ns.
        round_trips: exchanges made.
        reference_rank: the rank whose clock is the reference.
    """

    offset_ns: int
    uncertainty_ns: int
    rtt_ns: int
    round_trips: int
    reference_rank: int = 0

    def to_reference(self, t_ns: int) -> int:
        """*t_ns* of this rank's clock on the reference rank's clock."""
        return t_ns - self.offset_ns


def ntp_offset(exchanges: Iterable[tuple[int, int, int, int]]) -> ClockOffset | None:
    """The clock offset from NTP-style exchanges ``(t1, t2, t3, t4)``: the
    reference sends at ``t1`` (its clock), the peer receives at ``t2`` and
    replies at ``t3`` (its clock), the reference receives at ``t4``.

    Per exchange, offset ``((t2 - t1) + (t3 - t4)) / 2`` and round trip
    ``(t4 - t1) - (t3 - t2)`` (RFC 5905, section 8); the exchange with the
    smallest round trip wins (its queuing delays are smallest, so its
    asymmetry is too), and its uncertainty is half that round trip.
    Exchanges with a negative round trip (a clock read out of order) are
    skipped. Returns None when no exchange is usable.
    """
    best: tuple[int, int] | None = None
    n = 0
    for t1, t2, t3, t4 in exchanges:
        n += 1
        rtt = (t4 - t1) - (t3 - t2)
        if rtt < 0 or t3 < t2 or t4 < t1:
            continue
        offset = ((t2 - t1) + (t3 - t4)) // 2
        if best is None or rtt < best[0]:
            best = (rtt, offset)
    if best is None:
        return None
    rtt, offset = best
    return ClockOffset(offset, (rtt + 1) // 2, rtt, n)


def wire_rows(x: Any) -> bool:
    """Whether *x* is a valid step ``comm`` field: at most
    :data:`MAX_BUCKETS_PER_STEP` rows ``[bucket, start_ns, end_ns, nbytes]``
    of ints, ``0 <= bucket < MAX_BUCKETS_PER_STEP``, ``0 <= start_ns <=
    end_ns < 2**63``, ``0 <= nbytes <= MAX_BUCKET_BYTES``."""
    if type(x) is not list or len(x) > MAX_BUCKETS_PER_STEP:
        return False
    for row in x:
        if type(row) is not list or len(row) != 4 or any(type(v) is not int for v in row):
            return False
        bucket, start, end, nbytes = row
        if not (0 <= bucket < MAX_BUCKETS_PER_STEP and 0 <= start <= end < 2**63):
            return False
        if not 0 <= nbytes <= MAX_BUCKET_BYTES:
            return False
    return True
