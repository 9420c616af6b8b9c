"""The last N collectives of a communicator, printed when one times out.

When a job hangs, the question is which rank diverged and where. Each rank keeps a ring of its
recent collectives (sequence number, op, size, algorithm, state, timing); on a timeout every
rank prints its ring to stderr, and comparing the ranks' last entries shows the odd one out.
"""
from __future__ import annotations

import collections
import sys
import time
from typing import Optional

from .. import env


class Entry:
    """One collective as the recorder saw it (slotted: one is made per call)."""
    __slots__ = ("seq", "collective", "count", "dtype", "state", "algorithm", "started", "ended")

    def __init__(self, seq: int, collective: str, count: int, dtype: Optional[str]):
        self.seq, self.collective, self.count, self.dtype = seq, collective, count, dtype
        self.state, self.algorithm = "queued", None
        self.started: Optional[float] = None
        self.ended: Optional[float] = None

    def line(self, now: float) -> str:
        took = "" if self.started is None else f" {((self.ended or now) - self.started) * 1e3:.1f} ms"
        return (f"#{self.seq:<6} {self.collective:<15} {self.count:>10} x {self.dtype or '-':<9} "
                f"{self.algorithm or '-':<19} {self.state}{took}")


class FlightRecorder:
    def __init__(self, rank: int, capacity: Optional[int] = None):
        if capacity is None:
            capacity = env.get("RINGCOMM_FLIGHT_RECORDER")
        self.rank = rank
        self.entries: collections.deque = collections.deque(maxlen=max(1, capacity))

    def record(self, seq: int, collective: str, count: int, dtype: str) -> Entry:
        entry = Entry(seq, collective, count, dtype)
        self.entries.append(entry)
        return entry

    def dump(self, reason: str, stream=None) -> str:
        now = time.monotonic()
        lines = [f"ringcomm flight recorder, rank {self.rank}: {reason}",
                 f"  last {len(self.entries)} collectives (oldest first):"]
        lines += ["  " + e.line(now) for e in self.entries]
        text = "\n".join(lines)
        print(text, file=stream or sys.stderr, flush=True)
        return text
