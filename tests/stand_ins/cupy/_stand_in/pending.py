"""Accesses still pending on a stream, kept in the shared header of each allocation.

The stand-in runs every kernel at once on the CPU, but the model is a GPU's: a kernel or copy
queued on a stream has not happened, as far as anyone else may assume, until that stream is
synchronised (or an event recorded after it is waited for). So each launch records, in the
header of every allocation it touches, a row: (process, stream, launch number, read or write,
byte range). The rows of a stream go when its process synchronises it.

A new access conflicts with a pending row when the ranges overlap, at least one of the two
writes, and nothing orders the row before the access: same stream, or the accessing stream
waited for an event recorded after the row's launch (a vector clock per stream, streams.py).
Rows of other processes are never ordered: only their synchronisation removes them. That is
what catches a peer reading a writer's data before the writer synchronised, and a writer
overwriting data a peer's kernel may still be reading.

Rows are exact ranges. A new row replaces older rows of the same stream that it covers (a
reader ordered after the new row is ordered after them); only when the table is full are a
stream's rows merged into one range, which can only make the check stricter.
"""
from __future__ import annotations

from .errors import violation
from .memory import HEADER_BYTES, PENDING_AT, W_PENDING, alive

READ, WRITE = 1, 2
PID, STREAM, SEQ, KIND, START, END = range(6)
WIDTH = 6
CAPACITY = (HEADER_BYTES // 8 - PENDING_AT) // WIDTH
KIND_NAMES = {READ: "read", WRITE: "write"}

# The table is a handful of rows: read it into Python lists once per lock, work on those,
# write it back once (numpy calls on tiny arrays would cost more than the work).


def load(h) -> list[list[int]]:
    n = int(h[W_PENDING])
    return h[PENDING_AT:PENDING_AT + n * WIDTH].reshape(n, WIDTH).tolist() if n else []


def store(h, rows: list) -> None:
    if rows:
        h[PENDING_AT:PENDING_AT + len(rows) * WIDTH] = [x for r in rows for x in r]
    h[W_PENDING] = len(rows)


def overlapping(rows: list, start: int, end: int, kind: int) -> list:
    """Rows that would race with a ``kind`` access to [start, end) unless ordered before it."""
    return [r for r in rows if r[START] < end and start < r[END] and (kind == WRITE or r[KIND] == WRITE)]


def drop_dead(rows: list) -> list:
    """A process that died took its queued work with it."""
    dead = {p for p in {r[PID] for r in rows} if not alive(p)}
    return [r for r in rows if r[PID] not in dead] if dead else rows


def add(rows: list, pid: int, stream: int, seq: int, kind: int, start: int, end: int) -> list:
    """``rows`` with the new row, less the rows of the same stream it covers."""
    rows = [r for r in rows if not (r[PID] == pid and r[STREAM] == stream and start <= r[START]
                                    and r[END] <= end and (r[KIND] == kind or kind == WRITE))]
    if len(rows) >= CAPACITY:
        rows = _merge_stream(rows, pid, stream, kind)
        if len(rows) >= CAPACITY:
            raise violation(f"more than {CAPACITY} unsynchronised accesses to one allocation: "
                            f"synchronise streams more often")
    rows.append([pid, stream, seq, kind, start, end])
    return rows


def _merge_stream(rows: list, pid: int, stream: int, kind: int) -> list:
    same = [r for r in rows if r[PID] == pid and r[STREAM] == stream and r[KIND] == kind]
    if len(same) < 2:
        return rows
    merged = [pid, stream, max(r[SEQ] for r in same), kind, min(r[START] for r in same), max(r[END] for r in same)]
    return [r for r in rows if r not in same] + [merged]


def clear(rows: list, pid: int, stream: int, upto: int) -> list:
    """Stream ``stream`` of ``pid`` completed every launch numbered up to ``upto``."""
    return [r for r in rows if not (r[PID] == pid and r[STREAM] == stream and r[SEQ] <= upto)]
