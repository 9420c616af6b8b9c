"""The last N calls of a communicator (collectives, sends, receives), printed when one times out.

When a job hangs, the question is which rank diverged and where. Each rank keeps a ring of its
recent calls in issue order: collectives (sequence number, op, size, algorithm, state, timing)
and point-to-point sends and receives (their own p2p number, peer, user tag, size, state,
timing). On a timeout every rank prints its ring to stderr; comparing the ranks' last entries
shows the odd one out, and a rank stuck in a pipeline's receive shows that receive, posted and
still waiting, whichever call ran out of time.

Collectives and send/recv are numbered apart (send/recv match by peer and tag, not by a
sequence all ranks share), so a p2p entry prints ``p2p#n`` where a collective prints ``#n``.
"""
from __future__ import annotations

import collections
import sys
import time
from typing import Optional

from .. import env


class Entry:
    """One collective as the recorder saw it (slotted: one is made per call).
    ``state``: queued, running, done or "failed: <error class>"."""
    __slots__ = ("seq", "name", "count", "dtype", "state", "algorithm", "started", "ended")

    def __init__(self, seq: int, name: str, count: int, dtype: Optional[str], algorithm: Optional[str] = None,
                 started: Optional[float] = None):
        self.seq, self.name, self.count, self.dtype = seq, name, count, dtype
        self.state, self.algorithm = "queued" if started is None else "running", algorithm
        self.started: Optional[float] = started
        self.ended: Optional[float] = None

    def line(self, now: float) -> str:
        return self._line(f"#{self.seq}", self.algorithm or "-", now)

    def _line(self, number: str, detail: str, now: float) -> str:
        took = "" if self.started is None else f" {((self.ended or now) - self.started) * 1e3:.1f} ms"
        return (f"{number:<7} {self.name:<15} {self.count:>10} x {self.dtype or '-':<9} "
                f"{detail:<19} {self.state}{took}")


class P2PEntry(Entry):
    """One send or receive: numbered apart from the collectives, with its peer and user tag.
    ``peer`` None is a receive from any rank; ``source`` is then the sender, once known.
    ``state``: queued (issued, not yet handed to the transport), posted, done, cancelled (the
    communicator closed first) or "failed: <error class>"; the time counts from the posting."""
    __slots__ = ("peer", "tag", "source")

    def __init__(self, seq: int, name: str, peer: Optional[int], tag: int, count: int, dtype: str):
        self.seq, self.name, self.count, self.dtype = seq, name, count, dtype
        self.state, self.algorithm = "queued", None
        self.started = self.ended = None
        self.peer, self.tag, self.source = peer, tag, None

    def line(self, now: float) -> str:
        if self.peer is not None:
            whom = f"rank {self.peer}"
        else:
            whom = "any" if self.source is None else f"any (rank {self.source})"
        return self._line(f"p2p#{self.seq}", f"{'to' if self.name == 'send' else 'from'} {whom} tag {self.tag}",
                          now)


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

    def running(self, seq: int, collective: str, count: int, dtype: str, algorithm: str) -> Entry:
        """The entry of a call that starts running now, with the algorithm it runs (the fast road)."""
        entry = Entry(seq, collective, count, dtype, algorithm, time.monotonic())
        self.entries.append(entry)
        return entry

    def record_p2p(self, seq: int, name: str, peer: Optional[int], tag: int, count: int, dtype: str) -> P2PEntry:
        entry = P2PEntry(seq, name, peer, tag, count, dtype)
        self.entries.append(entry)
        return entry

    def dump(self, reason: str, stream=None) -> str:
        now = time.monotonic()
        # A snapshot: the caller's thread may record a new call while the progress thread dumps.
        # list() of a deque runs without releasing the GIL, so it never sees one half-appended.
        entries = list(self.entries)
        lines = [f"ringcomm flight recorder, rank {self.rank}: {reason}",
                 f"  last {len(entries)} calls, oldest first (#n: collective sequence number; "
                 f"p2p#n: send/recv, numbered apart):"]
        lines += ["  " + e.line(now) for e in entries]
        text = "\n".join(lines)
        print(text, file=stream or sys.stderr, flush=True)
        return text
