"""``ProcessGroup.monitored_barrier`` of the "ringcomm" process groups: gloo's semantics, ringcomm's messages.

torch's ``dist.monitored_barrier`` refuses every backend but gloo by name before it reaches one;
``group.monitored_barrier(timeout, wait_all_ranks)`` on a "ringcomm" group comes here. The
protocol is gloo's (ProcessGroupGloo::monitoredBarrier):

- every rank but 0 sends rank 0 an arrival, then waits for rank 0's verdict;
- rank 0 waits for the arrivals until its deadline (``timeout``, else the group's), then sends
  each rank its verdict: released, or failed with rank 0's message, which the rank raises at
  once. Without ``wait_all_ranks`` rank 0 names the first rank, in rank order, not arrived by
  the deadline; with it, every rank not arrived by then. The arrivals are awaited together,
  so that takes the timeout once (gloo gives each missing rank a whole timeout of its own).
- Only rank 0 enforces the barrier's timeout, so that it, not a rank that merely waited for
  it, reports who is missing. The others wait for the verdict as long as the larger of the
  barrier's and the group's timeout, plus ABORT_GRACE.

The messages travel on a communicator of their own (the group's ranks, a context of their own):
an arrival left unmatched by a failure can never be taken for a user's send/recv, nor make a
later collective of the group look mismatched. It is made with the group, not on first use:
on MPI making one is collective, and a rank that never calls monitored_barrier would block it.
A failure aborts it (a rank arriving late learns rank 0's reason from the abort notice), and
later monitored barriers of the group raise that failure at once; the group's collectives go
on, as on gloo.
"""
from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Optional

import numpy as np

from ..errors import CommError, CommTimeoutError, bad_type, bad_value
from .torch_work import ABORT_GRACE

KEY = "ringcomm.monitored_barrier"   # names the communicator on every member (its context id)
VERDICT_BYTES = 2048                 # (call number, passed) then rank 0's message, zero-padded
ARRIVE, VERDICT = 0, 1               # the two messages of a call, in the low bit of their tag
CALLS_IN_TAGS = 1 << 22              # call numbers mod this go above that bit (user tags < 2**23)


class MonitoredBarrierError(CommTimeoutError, RuntimeError):
    """A monitored barrier did not pass: a rank missed rank 0's deadline, or no verdict came.
    A RuntimeError as well, as gloo's is: torch's code and tests catch that."""


def barrier_seconds(timeout, default: float) -> float:
    """The barrier's timeout in seconds: ``timeout`` (a timedelta or seconds; with 0 rank 0 does
    not wait, so the barrier passes only if every arrival is in when it looks), else the
    group's ``default``."""
    if timeout is None:
        return default
    if isinstance(timeout, timedelta):
        value = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        value = float(timeout)
    else:
        raise bad_type("monitored_barrier", "timeout", "a datetime.timedelta, seconds or None", type(timeout).__name__)
    if not (value >= 0 and math.isfinite(value)):
        raise bad_value("monitored_barrier", "timeout", "a finite timeout >= 0", timeout)
    return value


def _tag(call: int, kind: int) -> int:
    return (call % CALLS_IN_TAGS) << 1 | kind


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _ranks(ranks: list) -> str:
    return ", ".join(map(str, ranks)) or "none"


def _arrived(work, seconds: float) -> bool:
    """Whether ``work`` completed within ``seconds`` (0: already); raises the error it failed with."""
    try:
        work.wait(max(0.0, seconds))
    except CommTimeoutError:
        if work.is_completed():
            raise
        return False
    return True


class MonitoredBarrier:
    """The monitored barrier of the process groups of one communicator (torch_groups.Shared)."""

    def __init__(self, comm):
        self.rank, self.size = comm.rank, comm.size
        self.comm = None if comm.size == 1 else comm._group(list(range(comm.size)), KEY, agree=False)
        self.calls = 0
        self.failed: Optional[MonitoredBarrierError] = None

    def run(self, timeout: float, wait_all: bool, group_timeout: float, group: str) -> None:
        """One monitored barrier with ``timeout`` seconds (rank 0's); ``group`` names it."""
        if not isinstance(wait_all, bool):
            raise bad_type("monitored_barrier", "wait_all_ranks", "a bool", type(wait_all).__name__)
        call = self.calls
        self.calls += 1
        label = f"monitored_barrier #{call} of {group}"
        if self.failed is not None:
            raise MonitoredBarrierError(f"{label} on rank {self.rank}: not run: an earlier monitored_barrier of "
                                        f"this group failed: {self.failed}") from self.failed
        if self.comm is None:
            return
        follower_wait = max(timeout, group_timeout) + ABORT_GRACE
        # The messages' own deadline, past every wait below: those waits decide the outcome; this
        # only guarantees that nothing stays posted for ever.
        self.comm.timeout = follower_wait + 2 * ABORT_GRACE
        try:
            if self.rank == 0:
                self._lead(call, timeout, wait_all, label)
            else:
                self._follow(call, follower_wait, label)
        except CommError as err:
            failed = err if isinstance(err, MonitoredBarrierError) else \
                MonitoredBarrierError(f"{label} on rank {self.rank}: {err}")
            self.failed = failed
            self.comm.abort(str(failed))
            if failed is err:
                raise
            raise failed from err

    # ---- rank 0 -----------------------------------------------------------------------------------
    def _lead(self, call: int, timeout: float, wait_all: bool, label: str) -> None:
        deadline = time.monotonic() + timeout
        arrivals = {r: np.full(2, -1, np.int64) for r in range(1, self.size)}
        works = {r: self.comm.recv(arrivals[r], r, _tag(call, ARRIVE), async_op=True) for r in arrivals}
        missing = []
        for r, work in works.items():
            left = deadline - time.monotonic()
            try:
                if _arrived(work, left):
                    continue
            except CommError as err:
                self._fail_all(call, works, f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {_ms(timeout)} "
                                            f"ms ({label}: {err}", err)
            missing.append(r)
            if not wait_all:
                # gloo's words when its time ran out before it came to this rank, kept for those
                # who look for them; the rank had not arrived either way.
                ran_out = f"; Rank 0 timed out in monitoredBarrier after {_ms(timeout)} ms" if left <= 0 else ""
                self._fail_all(call, works, f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {_ms(timeout)} "
                                            f"ms ({label}: no arrival from rank {r} within {timeout:g} s{ran_out}")
        if missing:
            self._fail_all(call, works, f"[Rank 0]: Ranks {_ranks(missing)} failed to pass monitoredBarrier in "
                                        f"{_ms(timeout)} ms ({label}: no arrival from them within {timeout:g} s")
        odd = [r for r, a in arrivals.items() if a.tolist() != [call, r]]
        if odd:
            self._fail_all(call, works, f"[Rank 0]: Ranks {_ranks(odd)} failed to pass monitoredBarrier ({label}: "
                                        f"their arrivals name other calls or ranks: "
                                        f"{[arrivals[r].tolist() for r in odd]}, expected [{call}, rank]")
        sends = {r: self._send_verdict(call, r, True, "") for r in works}
        grace = max(deadline - time.monotonic(), ABORT_GRACE)
        end = time.monotonic() + grace
        for r, work in sends.items():
            try:
                if _arrived(work, end - time.monotonic()):
                    continue
                problem = f"not taken within {grace:g} s"
            except CommError as err:
                problem = str(err)
            raise MonitoredBarrierError(f"[Rank 0]: Rank {r} failed to pass monitoredBarrier ({label}: it arrived, "
                                        f"but its release was {problem})")

    def _send_verdict(self, call: int, peer: int, passed: bool, text: str):
        verdict = np.zeros(VERDICT_BYTES, np.uint8)
        verdict[:16].view(np.int64)[:] = (call, int(passed))
        body = text.encode()[:VERDICT_BYTES - 16]
        verdict[16:16 + len(body)] = np.frombuffer(body, np.uint8)
        return self.comm.send(verdict, peer, _tag(call, VERDICT), async_op=True)

    def _fail_all(self, call: int, works: dict, text: str, cause: Optional[BaseException] = None) -> None:
        """Tell every rank that arrived why the barrier failed (``text``, closed here with the
        ranks that did arrive), then raise it here."""
        arrived = [r for r, w in works.items() if w.is_completed() and w.exception() is None]
        text = f"{text}; ranks that arrived: {_ranks(arrived)})"
        told = [self._send_verdict(call, r, False, text) for r in arrived]
        end = time.monotonic() + ABORT_GRACE
        for work in told:   # before the abort, which would withdraw them
            try:
                work.wait(max(0.0, end - time.monotonic()))
            except CommError:
                pass   # that rank learns it from the abort notice instead
        raise MonitoredBarrierError(text) from cause

    # ---- every other rank -------------------------------------------------------------------------
    def _follow(self, call: int, wait: float, label: str) -> None:
        verdict = np.zeros(VERDICT_BYTES, np.uint8)
        sent = self.comm.send(np.array([call, self.rank], np.int64), 0, _tag(call, ARRIVE), async_op=True)
        got = self.comm.recv(verdict, 0, _tag(call, VERDICT), async_op=True)
        try:
            if not _arrived(got, wait):
                problem = (f"no verdict from rank 0 within {wait:g} s (the larger of the barrier's and the group's "
                           f"timeout, plus {ABORT_GRACE:g} s): rank 0 has not reached this monitored barrier, or is "
                           f"still waiting in it")
            else:
                problem = self._read(verdict, call)
                if problem is None and not _arrived(sent, ABORT_GRACE):
                    problem = f"its arrival was not taken by rank 0 within {ABORT_GRACE:g} s of the release"
        except CommError as err:
            problem = str(err)
        if problem is not None:
            raise MonitoredBarrierError(f"Rank {self.rank} successfully reached monitoredBarrier, but received "
                                        f"errors while waiting for send/recv from rank 0 ({label}): {problem}")

    @staticmethod
    def _read(verdict: np.ndarray, call: int) -> Optional[str]:
        """None for a release of this call, else what went wrong."""
        theirs, passed = verdict[:16].view(np.int64).tolist()
        if theirs != call:
            return f"rank 0's verdict is for monitored_barrier #{theirs}, this rank is at #{call}"
        if passed:
            return None
        return "rank 0 reports: " + verdict[16:].tobytes().rstrip(b"\0").decode(errors="replace")

    def close(self) -> None:
        """Withdraw whatever a failed barrier left posted and free the communicator's context."""
        if self.comm is not None:
            self.comm.close()
            self.comm.transport.close()
