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

import numpy as np

from .errors import violation
from .memory import HEADER_BYTES, PENDING_AT, W_PENDING, alive

READ, WRITE = 1, 2
PID, STREAM, SEQ, KIND, START, END = range(6)
WIDTH = 6
CAPACITY = (HEADER_BYTES // 8 - PENDING_AT) // WIDTH
KIND_NAMES = {READ: "read", WRITE: "write"}


def rows(h) -> np.ndarray:
    n = int(h[W_PENDING])
    return h[PENDING_AT:PENDING_AT + n * WIDTH].reshape(n, WIDTH)


def _store(h, kept: np.ndarray) -> None:
    n = len(kept)
    h[PENDING_AT:PENDING_AT + n * WIDTH] = kept.reshape(-1)
    h[W_PENDING] = n


def overlapping(h, start: int, end: int, kind: int) -> np.ndarray:
    """Rows that would race with a ``kind`` access to [start, end) unless ordered before it."""
    r = rows(h)
    if not len(r):
        return r
    hit = (r[:, START] < end) & (start < r[:, END])
    if kind == READ:
        hit &= r[:, KIND] == WRITE
    return r[hit].copy()


def drop_dead(h) -> None:
    """A process that died took its queued work with it."""
    r = rows(h)
    dead = {int(p) for p in set(r[:, PID].tolist()) if not alive(int(p))}
    if dead:
        _store(h, r[~np.isin(r[:, PID], list(dead))].copy())


def add(h, pid: int, stream: int, seq: int, kind: int, start: int, end: int) -> None:
    r = rows(h)
    if len(r):
        mine = (r[:, PID] == pid) & (r[:, STREAM] == stream)
        covered = mine & (r[:, START] >= start) & (r[:, END] <= end) & ((r[:, KIND] == kind) | (kind == WRITE))
        if covered.any():
            r = r[~covered].copy()
            _store(h, r)
    if len(r) >= CAPACITY:
        r = _merge_stream(r, pid, stream, kind)
        if len(r) >= CAPACITY:
            raise violation(f"more than {CAPACITY} unsynchronised accesses to one allocation: "
                            f"synchronise streams more often")
        _store(h, r)
    n = len(r)
    h[PENDING_AT + n * WIDTH:PENDING_AT + (n + 1) * WIDTH] = (pid, stream, seq, kind, start, end)
    h[W_PENDING] = n + 1


def _merge_stream(r: np.ndarray, pid: int, stream: int, kind: int) -> np.ndarray:
    same = (r[:, PID] == pid) & (r[:, STREAM] == stream) & (r[:, KIND] == kind)
    if same.sum() < 2:
        return r
    merged = r[same][0].copy()
    merged[SEQ], merged[START], merged[END] = r[same, SEQ].max(), r[same, START].min(), r[same, END].max()
    return np.vstack([r[~same], merged[None, :]])


def clear(h, pid: int, stream: int, upto: int) -> None:
    """Stream ``stream`` of ``pid`` completed every launch numbered up to ``upto``."""
    r = rows(h)
    if len(r):
        done = (r[:, PID] == pid) & (r[:, STREAM] == stream) & (r[:, SEQ] <= upto)
        if done.any():
            _store(h, r[~done].copy())
