"""The gate that every piece of device work passes: kernels, device copies, host transfers.

A launch names the byte ranges it reads and writes. Before anything runs the gate checks, as
real cupy and CUDA would: there is a device; memory is neither freed nor closed; for kernels,
every array is on the current device (cupy's ``_check_peer_access``); and, the stand-in's own
rule (pending.py), no pending access of another stream races with this one. Then it records
the launch's accesses as pending on the stream. The caller does the arithmetic afterwards, on
the CPU, at once.

Host transfers are counted here too (per process), so a test can assert that a device
collective moved no byte through host memory.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import NamedTuple

from . import config, memory, pending, streams
from .errors import NO_DEVICE, CUDARuntimeError, violation


class PerformanceWarning(RuntimeWarning):
    """cupy._util.PerformanceWarning"""


class Access(NamedTuple):
    mapping: memory.Mapping
    start: int           # byte range inside the allocation
    end: int
    kind: int            # pending.READ or pending.WRITE
    device: int          # the device the array says it lives on (cupy's data.device_id)


def current_device() -> int:
    if config.DEVICES == 0:
        raise CUDARuntimeError(NO_DEVICE, f"{config.DEVICES_VARIABLE}=0")
    return streams.thread.device


def current_stream(device: int) -> streams.StreamState:
    current = streams.thread.current.get(device)
    return streams.legacy(device) if current is None else current._resolve(device)


def check_device(array_device: int, device: int) -> None:
    """cupy's _check_peer_access, with the stand-in's peer-access setting."""
    if array_device == device:
        return
    msg = (f"The device where the array resides ({array_device}) is different from the current "
           f"device ({device}).")
    if not config.PEER_ACCESS:
        raise ValueError(f"{msg} Peer access is unavailable between these devices.")
    warnings.warn(f"{msg} Peer access has been activated automatically.", PerformanceWarning, stacklevel=4)


def run(what: str, accesses, *, stream=None, kernel: bool = True) -> streams.StreamState:
    """Check and record one launch on ``stream`` (a cupy stream object; default: the current
    stream of the current device); return the stream's state. ``kernel``: check that every
    array is on the current device, as cupy does for kernels but not for copies."""
    device = current_device()
    state = current_stream(device) if stream is None else stream._resolve(device)
    for a in accesses:
        if a.mapping.dead:
            raise violation(f"{what} touches {a.mapping!r}. On a GPU this reads or writes memory "
                            f"that may belong to someone else by now (an illegal address, or "
                            f"silently wrong data)")
        if kernel:
            check_device(a.device, device)
    by_file: dict = {}                         # one lock per allocation, not per access
    for a in accesses:
        by_file.setdefault(a.mapping.file, []).append(a)
    me = os.getpid()
    with memory.LOCK:
        streams.barrier(state)
        for f, group in by_file.items():       # check everything before recording anything
            _check(what, f, group, state, me)
        state.seq += 1
        for f, group in by_file.items():
            with f.locked() as h:
                rows = pending.load(h)
                for a in group:
                    rows = pending.add(rows, me, state.key, state.seq, a.kind, a.start, a.end)
                pending.store(h, rows)
            state.touched[f] = None
    return state


def _racing(rows: list, a: Access, state: streams.StreamState) -> list:
    return [r for r in pending.overlapping(rows, a.start, a.end, a.kind)
            if not streams.ordered(state, r[pending.PID], r[pending.STREAM], r[pending.SEQ])]


def _check(what: str, f: memory.SharedFile, group: list, state: streams.StreamState, me: int) -> None:
    with f.locked() as h:
        if h[memory.W_FREED] and group[0].mapping.kind == "ipc":
            raise violation(f"{what}: {f.describe()} was freed by its owner while this process "
                            f"still had it open through IPC")
        rows = pending.load(h)
        if not rows:
            return
        if any(r[pending.PID] != me for r in rows):
            live = pending.drop_dead(rows)
            if live is not rows:
                pending.store(h, live)
                rows = live
    for a in group:
        racing = _racing(rows, a, state)
        if racing:
            raise violation(_race_message(what, a, state, racing[0], me))


def _race_message(what: str, a: Access, state: streams.StreamState, row, me: int) -> str:
    pid, key, seq = row[pending.PID], row[pending.STREAM], row[pending.SEQ]
    other = pending.KIND_NAMES[row[pending.KIND]]
    mine = pending.KIND_NAMES[a.kind]
    text = (f"{what} on {state.describe()} would {mine} bytes [{a.start}, {a.end}) of "
            f"{a.mapping.file.describe()}, but {streams.describe(pid, key)} has a pending {other} of "
            f"bytes [{row[pending.START]}, {row[pending.END]}) there (its launch #{seq}) "
            f"that nothing orders before this {mine}: on a GPU the two race. ")
    if pid != me:
        return text + ("The other process must synchronise that stream before it lets this one "
                       "use the memory (e.g. before publishing it or acknowledging a read)")
    return text + ("Record an Event on that stream after its launch and make this stream "
                   "wait_event() it, or synchronise that stream first")


_counts_lock = threading.Lock()
_counts = {"to_host_bytes": 0, "to_host_calls": 0, "to_device_bytes": 0, "to_device_calls": 0}


def count(direction: str, nbytes: int) -> None:
    """``direction`` is "to_host" or "to_device"."""
    with _counts_lock:
        _counts[f"{direction}_bytes"] += nbytes
        _counts[f"{direction}_calls"] += 1


def host_copies() -> dict:
    with _counts_lock:
        return dict(_counts)


def reset_host_copies() -> None:
    with _counts_lock:
        for k in _counts:
            _counts[k] = 0
