"""RINGCOMM_TIMELINE=path: a Chrome-trace JSON per rank of forward, backward and every bucket.

Open the file in Perfetto (ui.perfetto.dev) or chrome://tracing. Track "compute" holds forward
and backward; track "comm" holds one slice per bucket from launch to finish, and instant events
mark when each bucket's last gradient became ready and when its all-reduce was launched, so the
overlap of communication with the rest of backward is visible at a glance.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Optional

from ringcomm import env
from ringcomm.errors import UsageError

COMPUTE, COMM, EVENTS = 0, 1, 2
_TRACKS = {COMPUTE: "compute", COMM: "comm", EVENTS: "bucket events"}


def rank_path(path: str, rank: int) -> str:
    """trace.json -> trace.rank0.json; a path without .json gets .rank0.json appended."""
    stem = path[:-5] if path.endswith(".json") else path
    return f"{stem}.rank{rank}.json"


def from_env(rank: int) -> Optional["Timeline"]:
    path = env.get("RINGCOMM_TIMELINE")
    return Timeline(rank_path(path, rank), rank) if path else None


class Timeline:
    """Collects events in memory; ``write()`` (also run at exit) rewrites the whole file."""

    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank
        self._events: list = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        for tid, name in _TRACKS.items():
            self._events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                                 "args": {"name": name}})
        self._events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                             "args": {"name": f"rank {rank}"}})
        # Written now, empty: a path that cannot be written is said at construction, naming the
        # variable, instead of in a traceback at exit that left the trace lost and exit code 0.
        try:
            self.write()
        except OSError as err:
            raise UsageError(f"RINGCOMM_TIMELINE: cannot write the timeline to {path!r} ({err.strerror}); "
                             f"set it to a writable file path or unset it") from None
        atexit.register(self.write)

    def us(self, t: float) -> float:
        return round((t - self._t0) * 1e6, 3)

    def span(self, name: str, start: float, end: float, tid: int = COMPUTE, **args) -> None:
        self._add({"name": name, "ph": "X", "ts": self.us(start), "dur": round((end - start) * 1e6, 3),
                   "pid": self.rank, "tid": tid, "args": args})

    def instant(self, name: str, t: float, tid: int = EVENTS, **args) -> None:
        self._add({"name": name, "ph": "i", "s": "t", "ts": self.us(t), "pid": self.rank,
                   "tid": tid, "args": args})

    def _add(self, event: dict) -> None:
        with self._lock:
            self._events.append(event)

    def write(self) -> None:
        with self._lock:
            events = list(self._events)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        os.replace(tmp, self.path)
