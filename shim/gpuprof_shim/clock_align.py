"""Clock alignment between ranks, to compare their comm timings across nodes:
each rank's monotonic clock against rank 0's, NTP-style, in a background
thread at the start of a run.

Ranks on one node share ``CLOCK_MONOTONIC``; across nodes the offsets are
what makes their timings comparable (:class:`gpuprof.comm.ClockOffset`).

How (all in one daemon thread; :meth:`ClockAligner.start` only starts it):

1. *Arrival.* Every rank counts itself in (``add("arrived", 1)``, and sets
   ``arrived/<rank>``) under the private prefix ``gpuprof/clock/<seq>/`` of
   the default process group's store, and polls the counter (``add(key,
   0)``, never ``store.wait``) until every rank is in, for at most
   ``timeout_s``. Not every rank may run gpuprof (``if rank == 0: with
   gpuprof.profile(...)``): a rank left alone gives up with a
   :attr:`~ClockAligner.note` naming the missing ranks, and counts itself
   out (so does a rank whose run ends first: a rank arriving later must not
   build the group with it). Polls back off to 50 ms (longer beyond 64 ranks: :func:`_poll_cap`).
2. *A private gloo group* over that prefix:
   ``ProcessGroupGloo(PrefixStore(...), rank, world, connect)`` (its
   rendezvous holds the store's client lock: ``connect`` is
   :func:`_connect_timeout_s`, 5 s up to 64 ranks, not ``timeout_s``). Neither the
   user's default group (a collective there would pair with the user's own)
   nor ``dist.new_group`` (its counter must match on every rank, and user
   code may call it concurrently) is touched.
3. A barrier on that group, then rank 0 makes :data:`ALIGN_ROUND_TRIPS`
   exchanges of tiny CPU int64 tensors with each peer in turn (rank 0 reads
   t1 and sends; the peer reads t2 on receipt and t3 just before replying;
   rank 0 reads t4 on receipt), computes :func:`gpuprof.comm.ntp_offset` and
   sends the peer its offset. Every rank then calls ``on_result`` once (rank
   0 with offset 0, uncertainty 0). Every wait is ``work.wait(timeout)``; a
   peer waits for its turn (rank 0's ``serving`` counter) by polling the
   store, about once per peer ahead of it, so it never sits in gloo while
   rank 0 serves the ranks before it.

Why arrival is polled (measured with torch 2.13, gloo, ``torchrun
--standalone``, 2026-11-30):

- A lone rank's ``ProcessGroupGloo`` construction does honour its timeout:
  with ``timedelta(seconds=3)`` it raised ``DistStoreError: wait timeout
  after 3000ms`` after 3.02 s, and the default store stayed usable.
- But the default store's TCP client serializes its operations: while one
  thread sat in ``store.wait`` (4 s timeout), the training thread's
  ``store.set`` took 3.5 s. Constructing the gloo group while a peer is
  missing would therefore stall the user's own store calls (``new_group``,
  checkpointing) for up to the timeout, and print a c10d timeout warning.
  ``store.add(key, 0)`` and ``store.check`` return at once, so the lock
  is held for one round trip per poll; the group is built only once every rank has arrived, when its
  rendezvous takes milliseconds.

A gloo wait cannot be sliced: a ``recv().wait()`` that times out closes the
pair (the peer's next send fails "Connection closed by peer"), and neither
``abort()`` nor ``shutdown()`` wakes this process's own waiter. So the thread
enters gloo only when the other side is known to be there, and an ``atexit``
hook stops it before the interpreter finalizes (see :func:`_stop_all_at_exit`).

Measured (``bench/clock_align.py``, 2-vCPU VM shared with other test runs,
load 5-7, 2026-11-30; offsets of +5 s / -3 ms / 0 injected): offset error
|measured - injected| 1.4-4.6 µs (median 2.9), reported uncertainty
13-17 µs (best round trip 26-35 µs); alignment 10-42 ms from ``start()`` to
the result with 2 or 4 ranks, of which the exchanges are 4-36 ms (8 ranks:
84 ms, ~10 ms per peer, error <= 3.7 µs, uncertainty <= 33 µs);
``start()`` itself 0.2-1 ms on the training thread (the thread start).
While the training thread computes (``--busy``), the aligner waits for the
GIL: 35-124 ms at load 3.7, 0.2-1.3 s at load 7, and the best round trip,
hence the uncertainty, can grow (once to 3 ms, error 1 ms: still within it).

The default store's timeout is never changed. Nothing here raises: failures
become :attr:`ClockAligner.note`; ``close()`` returns within about a second.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from gpuprof.comm import ALIGN_ROUND_TRIPS, ClockOffset, ntp_offset

log = logging.getLogger("gpuprof.shim")

#: How long a rank waits for the others (arrival), and then for each
#: exchange, seconds. Ranks enter ``gpuprof.profile`` at about the same point
#: of their script; a minute covers uneven model loading without keeping a
#: lone rank's thread polling for long (one store poll per 50 ms).
ALIGN_TIMEOUT_S = 60.0
#: Store polling: first interval and growth factor, seconds (the cap is
#: :func:`_poll_cap`).
_POLL_FIRST_S, _POLL_GROWTH = 0.001, 1.5
#: Rank 0's exchanges with one peer take about this long (4-36 ms measured
#: on a loaded 2-vCPU VM): a peer waiting for its turn polls about once per
#: peer ahead of it.
_SERVICE_GUESS_S = 0.005
#: Once a peer's turn has come, each send or receive takes well under a
#: millisecond on a healthy network: a wait this long means a peer is gone.
_OP_TIMEOUT_S = 5.0
#: ``close()`` waits at most this long for the thread, seconds; so does the
#: interpreter's exit, for all of them together.
_CLOSE_WAIT_S = 1.0
#: The protocol's limit on a clock event's ``round_trips``.
_MAX_ROUND_TRIPS = 1 << 20
#: Missing ranks named in a note.
_NOTE_RANKS = 8
#: Up to this world size a run that ends while waiting for the other ranks
#: names the missing ones (a store call per rank); beyond, it counts them.
_NOTE_NAMED_WORLD = 64
#: Store key prefix; the per-process sequence number follows.
KEY_PREFIX = "gpuprof/clock"
#: Point-to-point tags of the private group.
_TAG_PING, _TAG_RESULT = 0, 1

#: Alignments started in this process: the store prefix's ``seq``.
_seq = itertools.count()
#: Aligners whose thread was started, for the exit hook.
_live: weakref.WeakSet[ClockAligner] = weakref.WeakSet()
_exit_hook_lock = threading.Lock()
_exit_hook = False


def _stop_all_at_exit() -> None:
    """``atexit``: stop every aligner's thread and give them together up to
    ``_CLOSE_WAIT_S`` to leave torch's C++ code.

    atexit hooks run before the interpreter finalizes, while daemon threads
    still run. A daemon thread that returns from a gloo wait during
    finalization is ended by ``pthread_exit``, whose unwinding through
    pybind11's GIL guard aborts the process ("terminate called without an
    active exception", SIGABRT: measured with a rank exiting while its thread
    sat in ``recv().wait()``). Stopped, the thread leaves at its next check:
    between exchanges (a round trip: microseconds) or at once from a poll's
    pause (an ``Event.wait``).
    """
    deadline = time.monotonic() + _CLOSE_WAIT_S
    aligners = list(_live)
    for aligner in aligners:
        aligner._stop.set()
    for aligner in aligners:
        thread = aligner._thread
        if thread is not None and thread.is_alive():
            thread.join(max(0.0, deadline - time.monotonic()))


def _install_exit_hook() -> None:
    global _exit_hook
    with _exit_hook_lock:
        if not _exit_hook:
            atexit.register(_stop_all_at_exit)
            _exit_hook = True


def _writable(tensor: Any) -> Any:
    """A numpy view of *tensor* (item assignment ~0.3 µs, the tensor's own
    ~2.5 µs: between t3 and the send it would skew the offset by half), or
    the tensor itself without numpy."""
    try:
        return tensor.numpy()
    except Exception:
        return tensor


def _poll_cap(world: int) -> float:
    """Longest pause between two polls of the store, seconds: 50 ms up to 64
    ranks, longer beyond (at most 1 s), so that a whole job polls the store
    about 1,300 times a second however many ranks wait."""
    return min(1.0, 0.05 * max(1.0, world / 64))


def _connect_timeout_s(world: int, timeout_s: float) -> float:
    """How long building the private gloo group (its rendezvous on the
    store, during which the store's client lock is held) may take once every
    rank has arrived: :data:`_OP_TIMEOUT_S` up to 64 ranks, growing with the
    job's store traffic beyond (each rank reads every peer's address), at
    most *timeout_s*. A rank that counted itself in and then left (its run
    ended just as the last rank arrived) costs the others this much, not
    *timeout_s*."""
    return min(timeout_s, _OP_TIMEOUT_S * max(1.0, world / 64))


def _ranks_named(missing: list[int]) -> str:
    """``rank 3`` / ``ranks 1, 2`` / ``ranks 0, ..., 7 and 5 more``."""
    named = ", ".join(map(str, missing[:_NOTE_RANKS]))
    if len(missing) > _NOTE_RANKS:
        named += f" and {len(missing) - _NOTE_RANKS} more"
    return f"rank{'s' if len(missing) > 1 else ''} {named}"


class _Stopped(Exception):
    """close() was called while the thread was still working."""


def _reason(exc: BaseException) -> str:
    """``Type: message`` without the ``[/path/file.cc:123] `` c10d and gloo
    put in front."""
    text = str(exc).strip()
    if text.startswith("[") and "] " in text[:300]:
        text = text.split("] ", 1)[1]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _sentence(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class ClockAligner:
    """Measures this rank's clock offset against rank 0 in the background.

    Args:
        on_result: called once, from the background thread, with this rank's
            :class:`~gpuprof.comm.ClockOffset` when alignment succeeded; never
            after :meth:`close` has returned. Exceptions it raises become
            :attr:`note`.
        clock: this rank's clock, ns (``time.monotonic_ns``; tests inject an
            offset here).
        timeout_s: the longest wait for the other ranks to arrive, and for
            any one step after that.

    Attributes:
        result: the offset once measured, else None.
        note: why alignment was skipped or failed, one sentence for the run
            summary; None while it runs, when it succeeded, or when there is
            nothing to align (no process group, or a world of one).
        elapsed_ms: how long alignment took, from :meth:`start` to the result
            or the failure (None while it runs).
        wait_ms: the part of it spent waiting for the other ranks to arrive.
        connect_ms: the part spent building the private gloo group and
            passing its barrier.
    """

    def __init__(
        self,
        on_result: Callable[[ClockOffset], None],
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        timeout_s: float = ALIGN_TIMEOUT_S,
    ) -> None:
        self._on_result = on_result
        self._clock = clock
        self._timeout_s = float(timeout_s)
        self.result: ClockOffset | None = None
        self.note: str | None = None
        self.elapsed_ms: float | None = None
        self.wait_ms: float | None = None
        self.connect_ms: float | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()  # close() may come from on_result
        self._closed = False
        self._thread: threading.Thread | None = None
        self._t0_ns = 0

    # ------------------------------------------------------------------ API

    def start(self) -> bool:
        """Start the background thread when ``torch.distributed`` is
        initialized with a world of more than one rank; False otherwise (and
        when started already). Never raises, never imports torch."""
        if self._thread is not None or self._closed:
            return False
        try:
            torch = sys.modules.get("torch")
            dist = getattr(torch, "distributed", None)
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return False
            rank, world = dist.get_rank(), dist.get_world_size()
            if world <= 1 or not 0 <= rank < world:
                return False
            if getattr(dist, "ProcessGroupGloo", None) is None:
                self._set_note("clock alignment skipped: this torch has no gloo backend")
                return False
            store = dist.distributed_c10d._get_default_store()
            self.rank, self.world_size = rank, world
            thread = threading.Thread(
                target=self._run,
                args=(torch, dist, store, rank, world, next(_seq)),
                name="gpuprof-clock-align",
                daemon=True,
            )
            _install_exit_hook()
            self._t0_ns = time.monotonic_ns()
            self._thread = thread
            _live.add(self)
            thread.start()
            return True
        except Exception as exc:  # never break the run
            self._set_note(f"clock alignment skipped: {_reason(exc)}")
            log.debug("clock alignment not started", exc_info=True)
            return False

    def close(self) -> None:
        """Stop: no ``on_result`` after this returns. Waits at most about a
        second for the thread (a thread inside a gloo wait ends on its own
        timeout; it is a daemon thread)."""
        deadline = time.monotonic() + _CLOSE_WAIT_S
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_CLOSE_WAIT_S)
        got = self._lock.acquire(timeout=max(0.01, deadline - time.monotonic()))
        try:
            self._closed = True
        finally:
            if got:
                self._lock.release()
        if thread is not None and thread.is_alive() and self.result is None:
            self._set_note("clock alignment did not finish before the run ended")

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    # -------------------------------------------------------------- thread

    def _set_note(self, text: str) -> None:
        if self.note is None:
            self.note = _sentence(text)

    def _ms(self) -> float:
        """Milliseconds since :meth:`start` (the real clock, not ``clock``)."""
        return (time.monotonic_ns() - self._t0_ns) / 1e6

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Stopped

    def _run(self, torch: Any, dist: Any, store: Any, rank: int, world: int, seq: int) -> None:
        pg = None
        try:
            op_timeout = timedelta(seconds=min(self._timeout_s, _OP_TIMEOUT_S))
            store = dist.PrefixStore(f"{KEY_PREFIX}/{seq}", store)
            self._arrive(store, rank, world)
            self._check_stop()
            # every rank has arrived and builds the group within a poll or two;
            # one that left meanwhile must not hold this rank (and the store's
            # client lock, hence the user's store calls) for the whole timeout
            connect = timedelta(seconds=_connect_timeout_s(world, self._timeout_s))
            pg = dist.ProcessGroupGloo(store, rank, world, connect)
            pg.barrier().wait(connect)
            self.connect_ms = self._ms() - (self.wait_ms or 0.0)
            self._check_stop()
            if rank == 0:
                offset = self._lead(torch, pg, store, world, op_timeout)
            else:
                offset = self._follow(torch, pg, store, rank, world, op_timeout)
            self.elapsed_ms = self._ms()
            self._deliver(offset)
        except _Stopped:
            self._set_note("clock alignment did not finish before the run ended")
        except TimeoutError as exc:
            self._set_note(str(exc))
        except Exception as exc:
            self._set_note(f"clock alignment failed on rank {rank}: {_reason(exc)}")
            log.debug("clock alignment failed", exc_info=True)
        finally:
            pg = None  # drop the private group (its gloo pairs close with it)
            if self.elapsed_ms is None:
                self.elapsed_ms = self._ms()

    def _poll(self, ready: Callable[[], float | None]) -> bool:
        """Call *ready* until it returns None (True), sleeping the seconds
        it returns otherwise, or until ``timeout_s`` has passed (False).
        *ready* reads the store with calls that return at once (``add(key,
        0)``, ``check``): the store's client lock is held for one round trip
        per poll, never for the wait."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            pause = ready()
            if pause is None:
                return True
            if time.monotonic() >= deadline:
                return False
            if self._stop.wait(pause):
                raise _Stopped

    def _arrive(self, store: Any, rank: int, world: int) -> None:
        """Announce this rank and wait until every rank has, or time out.
        One counter is polled (``arrived/<rank>`` keys only name the missing
        ranks in the note)."""
        mine = f"arrived/{rank}"
        store.set(mine, b"1")
        store.add("arrived", 1)
        cap = _poll_cap(world)
        pause = _POLL_FIRST_S

        def ready() -> float | None:
            nonlocal pause
            if store.add("arrived", 0) >= world:
                return None
            pause = min(cap, pause * _POLL_GROWTH)
            return pause

        try:
            try:
                if self._poll(ready):
                    return
            except _Stopped:
                # the run ended first: a rank arriving later must not count on
                # us (it would wait in the gloo rendezvous, holding the store)
                self._count_out(store, mine)
                self._note_missing(store, rank, world)
                raise
            missing = [r for r in range(world) if not store.check([f"arrived/{r}"])]
            if not missing:  # the last one arrived just now
                return
            self._count_out(store, mine)  # a late rank must not count on us
            raise TimeoutError(
                f"clock alignment skipped: {_ranks_named(missing)} "
                f"did not start gpuprof within {self._timeout_s:g} s"
            )
        finally:
            self.wait_ms = self._ms()

    def _note_missing(self, store: Any, rank: int, world: int) -> None:
        """The run ended while waiting for the others: say which did not run
        gpuprof meanwhile (usually: only rank 0 runs it). Up to
        :data:`_NOTE_NAMED_WORLD` ranks they are named (a store call each),
        beyond only counted (one call): close() is waiting."""
        try:
            if world <= _NOTE_NAMED_WORLD:
                missing = [
                    r for r in range(world) if r != rank and not store.check([f"arrived/{r}"])
                ]
                if missing:
                    named = _ranks_named(missing)
                    self._set_note(
                        f"clock alignment skipped: {named} did not run gpuprof during this run"
                    )
                return
            n = world - 1 - int(store.add("arrived", 0))
            if n > 0:
                self._set_note(
                    f"clock alignment skipped: {n} of {world} ranks did not run gpuprof "
                    "during this run"
                )
        except Exception:
            log.debug("could not tell which ranks were missing", exc_info=True)

    @staticmethod
    def _count_out(store: Any, mine: str) -> None:
        try:
            store.add("arrived", -1)
            store.delete_key(mine)
        except Exception:
            pass

    def _lead(self, torch: Any, pg: Any, store: Any, world: int, timeout: timedelta) -> ClockOffset:
        """Rank 0: exchanges with each peer in turn, sends each its offset."""
        clock = self._clock
        ping = torch.zeros(2, dtype=torch.int64)
        reply = torch.zeros(2, dtype=torch.int64)
        made = 0
        for peer in range(1, world):
            store.add("serving", 1)  # == peer: it waits for this, not in gloo
            exchanges = []
            for i in range(ALIGN_ROUND_TRIPS):
                self._check_stop()
                ping[0] = i
                recv = pg.recv([reply], peer, _TAG_PING)  # posted before t1
                t1 = clock()
                send = pg.send([ping], peer, _TAG_PING)
                recv.wait(timeout)
                t4 = clock()
                send.wait(timeout)
                t2, t3 = reply.tolist()
                exchanges.append((t1, t2, t3, t4))
            made += len(exchanges)
            offset = ntp_offset(exchanges)
            if offset is None:
                row = [0, 0, 0, 0, len(exchanges)]
            else:
                row = [
                    1,
                    offset.offset_ns,
                    offset.uncertainty_ns,
                    offset.rtt_ns,
                    offset.round_trips,
                ]
            pg.send([torch.tensor(row, dtype=torch.int64)], peer, _TAG_RESULT).wait(timeout)
        return ClockOffset(0, 0, 0, min(made, _MAX_ROUND_TRIPS), 0)

    def _follow(
        self, torch: Any, pg: Any, store: Any, rank: int, world: int, timeout: timedelta
    ) -> ClockOffset:
        """A peer: answers rank 0's pings once its turn has come, then
        receives its offset."""
        cap = _poll_cap(world)

        def ready() -> float | None:
            ahead = rank - store.add("serving", 0)  # peers rank 0 serves before us
            if ahead <= 0:
                return None
            # about one peer's exchanges apart; the next in line polls fast
            return min(cap, max(_POLL_FIRST_S, (ahead - 1) * _SERVICE_GUESS_S))

        if not self._poll(ready):
            raise TimeoutError(
                f"clock alignment failed on rank {rank}: rank 0 did not reach it "
                f"within {self._timeout_s:g} s"
            )
        clock = self._clock
        ping = torch.zeros(2, dtype=torch.int64)
        reply = torch.zeros(2, dtype=torch.int64)
        stamps = _writable(reply)
        recv = pg.recv([ping], 0, _TAG_PING)  # posted before rank 0 sends, as it does
        for i in range(ALIGN_ROUND_TRIPS):
            self._check_stop()
            recv.wait(timeout)
            stamps[0] = clock()  # t2: on receipt
            stamps[1] = clock()  # t3: just before replying
            send = pg.send([reply], 0, _TAG_PING)
            if i + 1 < ALIGN_ROUND_TRIPS:
                recv = pg.recv([ping], 0, _TAG_PING)
            send.wait(timeout)
        row = torch.zeros(5, dtype=torch.int64)
        pg.recv([row], 0, _TAG_RESULT).wait(timeout)
        ok, offset_ns, uncertainty_ns, rtt_ns, round_trips = row.tolist()
        if not ok:
            raise RuntimeError(f"no usable exchange in {round_trips} round trips")
        return ClockOffset(offset_ns, uncertainty_ns, rtt_ns, round_trips, 0)

    def _deliver(self, offset: ClockOffset) -> None:
        with self._lock:
            if self._closed or self._stop.is_set():
                raise _Stopped
            self.result = offset
            try:
                self._on_result(offset)
            except Exception as exc:
                self._set_note(f"clock alignment result not recorded: {_reason(exc)}")
