"""Current device and stream per thread, and what orders one stream's work after another's.

CUDA's rules, as modelled:
- The current device is per host thread, and a new thread starts on device 0.
- cupy's current stream is per thread and per device; by default it is ``Stream.null``, the
  legacy default stream of the current device, one per device and process (all threads share it).
- Work on one stream runs in launch order. Nothing orders two streams except: an event recorded
  on one and waited for by the other (``wait_event``), a host synchronisation (stream, event or
  device), and the legacy default stream's implicit barrier: a launch on it waits for all work
  queued so far on the device's *blocking* streams (``Stream()``), and a launch on a blocking
  stream waits for the legacy stream's work. Non-blocking streams (``Stream(non_blocking=True)``,
  and torch's streams) take no part in that barrier.

Each stream keeps a launch counter and a vector clock: for every other stream, the last launch
of it that this stream's future work is ordered after. An event is a snapshot of a clock.
"""
from __future__ import annotations

import os
import threading
import time

from . import config, memory, pending

STREAM_BASE = 0x7E57 << 32        # pointers of created streams: 0x7e5700000010, ...


class StreamState:
    __slots__ = ("blocking", "clock", "device", "key", "legacy", "ptr", "seq", "touched")

    def __init__(self, key: int, ptr: int, device: int, blocking: bool, legacy: bool):
        self.key, self.ptr, self.device, self.blocking, self.legacy = key, ptr, device, blocking, legacy
        self.seq = 0                          # launches so far
        self.clock: dict[int, int] = {}       # other stream key -> its launch we are ordered after
        self.touched: dict = {}               # SharedFile -> None: files holding our pending rows

    def describe(self) -> str:
        if self.legacy:
            return f"the legacy default stream (Stream.null) of device {self.device}"
        kind = "blocking" if self.blocking else "non-blocking"
        return f"stream {self.ptr:#x} ({kind}, device {self.device})"

    def snapshot(self) -> dict[int, int]:
        clock = dict(self.clock)
        clock[self.key] = self.seq
        return clock


_streams: dict[int, StreamState] = {}
_legacy: dict[int, StreamState] = {}
_next_ptr = [STREAM_BASE]


class _Thread(threading.local):
    def __init__(self):
        self.device = 0                       # a new thread starts on device 0, as in CUDA
        self.current: dict[int, object] = {}  # device -> current cupy stream (absent: Stream.null)
        self.saved: list[tuple] = []          # (device, previous stream) per `with stream:`
        self.devices: list[int] = []          # `with Device(k)` saves the previous device here


thread = _Thread()


def legacy(device: int) -> StreamState:
    with memory.LOCK:
        s = _legacy.get(device)
        if s is None:
            s = _legacy[device] = _streams[-(device + 1)] = StreamState(-(device + 1), 0, device, True, True)
        return s


def create(device: int, blocking: bool) -> StreamState:
    with memory.LOCK:
        _next_ptr[0] += 0x10
        s = StreamState(_next_ptr[0], _next_ptr[0], device, blocking, False)
        _streams[s.key] = s
        return s


def by_ptr(ptr: int) -> StreamState | None:
    s = _streams.get(ptr)
    return s if s is not None and not s.legacy else None


def describe(pid: int, key: int) -> str:
    if pid == os.getpid() and key in _streams:
        return f"{_streams[key].describe()} of this process ({pid})"
    if key < 0:
        return f"the legacy default stream of device {-key - 1} of process {pid}"
    return f"stream {key:#x} of process {pid}"


def _merge(state: StreamState, clock: dict[int, int]) -> None:
    mine = state.clock
    for key, seq in clock.items():
        if key != state.key and seq > mine.get(key, 0):
            mine[key] = seq


def barrier(state: StreamState) -> None:
    """The legacy default stream's implicit barrier, applied to ``state``'s next launch."""
    if state.legacy:
        for s in list(_streams.values()):
            if s.device == state.device and s.blocking and not s.legacy and s.seq:
                _merge(state, s.snapshot())
    elif state.blocking:
        _merge(state, legacy(state.device).snapshot())


def ordered(state: StreamState, pid: int, key: int, seq: int) -> bool:
    """Is launch ``seq`` of stream ``key`` in process ``pid`` ordered before ``state``'s next work?"""
    return pid == os.getpid() and (key == state.key or state.clock.get(key, 0) >= seq)


def wait(state: StreamState, clock: dict[int, int]) -> None:
    with memory.LOCK:
        _merge(state, clock)


def _complete(state: StreamState, upto: int) -> None:
    """The host knows launches up to ``upto`` of ``state`` finished: drop their pending rows."""
    pid = os.getpid()
    for f in list(state.touched):
        if f.fd < 0:           # freed or closed here: no one reads our rows there any more
            del state.touched[f]
            continue
        with f.locked() as h:
            pending.store(h, pending.clear(pending.load(h), pid, state.key, upto))
        if upto >= state.seq:
            del state.touched[f]


def synchronize(state: StreamState) -> None:
    """The stream's work is complete, and so is all work it was ordered after."""
    with memory.LOCK:
        clock = state.snapshot()
    synchronize_clock(clock)


def synchronize_clock(clock: dict[int, int]) -> None:
    """Everything a stream's (or an event's) clock covers is complete."""
    if config.SYNC_DELAY:
        time.sleep(config.SYNC_DELAY)
    with memory.LOCK:
        for key, seq in clock.items():
            if key in _streams:
                _complete(_streams[key], seq)


def synchronize_device(device: int) -> None:
    if config.SYNC_DELAY:
        time.sleep(config.SYNC_DELAY)
    with memory.LOCK:
        for s in list(_streams.values()):
            if s.device == device:
                _complete(s, s.seq)
