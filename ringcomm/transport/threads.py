"""In-process transport: ranks are threads of one process, messages are copies in a mailbox.

Exists so that every algorithm can be unit-tested on a laptop CPU at world sizes up to 16 without
launching processes. Sends are eager (the payload is copied at post time, so a send completes at
once); receives match per (source, tag) in posting order, like MPI.
"""
from __future__ import annotations

import ctypes
import threading
import time
from collections import defaultdict, deque
from typing import Optional

import numpy as np

from ..errors import MismatchError, PeerAbortedError
from .base import DoneRequest, Request, Transport
from .view import CONTEXT_SHIFT, TransportView
from .window import JOB_CAPACITY, Window, close_window_owner, region_bytes, watching_closes


class _Recv(Request):
    __slots__ = ("buf", "done", "error", "_box")

    def __init__(self, buf: np.ndarray, box: "_Mailbox"):
        self.buf, self.done, self.error, self._box = buf, False, None, box

    def wait(self, timeout: Optional[float]) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._box.cond:
            while not self.done:
                if self._box.world.aborted is not None:
                    raise PeerAbortedError(f"job aborted: {self._box.world.aborted}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._box.cond.wait(left)
        if self.error is not None:
            raise self.error
        return True

    def test(self) -> bool:
        if self.done and self.error is not None:
            raise self.error
        return self.done

    def cancel(self) -> None:
        with self._box.cond:
            for queue in self._box.posted.values():
                if self in queue:
                    queue.remove(self)


class _Mailbox:
    def __init__(self, world: "ThreadsWorld"):
        self.world = world
        self.cond = threading.Condition()
        self.arrived = defaultdict(deque)   # (src, tag) -> (arrival number, payload copy) not yet matched
        self.arrivals = 0
        self.posted = defaultdict(deque)    # (src, tag) -> receives not yet matched


class ThreadsWorld:
    """The shared state of one in-process job: a mailbox per rank."""

    def __init__(self, size: int):
        self.size = size
        self.boxes = [_Mailbox(self) for _ in range(size)]
        self.aborted: Optional[str] = None
        self.window_regions = [np.zeros(region_bytes(JOB_CAPACITY), np.uint8) for _ in range(size)]
        self._sub_windows: dict = {}
        self._lock = threading.Lock()

    def windows(self, context: int, members: list) -> list:
        """The window regions of a sub-communicator's members (made by whichever member asks first)."""
        with self._lock:
            regions = self._sub_windows.setdefault(context, {})
            return [regions.setdefault(r, np.zeros(region_bytes(), np.uint8)) for r in members]

    def abort(self, reason: str) -> None:
        self.aborted = reason
        for box in self.boxes:
            with box.cond:
                box.cond.notify_all()


def read_memory(rank: int, addr: int, dst: np.ndarray) -> None:
    """A window's direct read between threads: every rank's memory is this process's."""
    ctypes.memmove(dst.ctypes.data, addr, dst.nbytes)


def write_memory(rank: int, addr: int, src: np.ndarray) -> None:
    """A window's direct write between threads."""
    ctypes.memmove(addr, src.ctypes.data, src.nbytes)


class ThreadsTransport(Transport):
    name = "threads"

    def __init__(self, world: ThreadsWorld, rank: int):
        self.world, self.rank, self.size = world, rank, world.size
        # spin=0: a polling thread would only hold the GIL its peers need to post
        self.window = Window(rank, world.window_regions, capacity=JOB_CAPACITY, aborted=self._aborted_reason,
                             spin=0.0, reader=read_memory, writer=write_memory)

    def _aborted_reason(self, peer: int) -> Optional[str]:
        return None if self.world.aborted is None else f"job aborted: {self.world.aborted}"

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        if self.world.aborted is not None:
            raise PeerAbortedError(f"job aborted: {self.world.aborted}")
        payload = np.array(buf, copy=True).view(np.uint8).reshape(-1)
        box = self.world.boxes[peer]
        key = (self.rank, tag)
        with box.cond:
            if box.posted[key]:
                recv = box.posted[key].popleft()
                self._deliver(recv, payload, src=self.rank)
                box.cond.notify_all()
            else:
                box.arrivals += 1
                box.arrived[key].append((box.arrivals, payload))
        return DoneRequest()

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        box = self.world.boxes[self.rank]
        recv = _Recv(buf, box)
        key = (peer, tag)
        with box.cond:
            if box.arrived[key]:
                self._deliver(recv, box.arrived[key].popleft()[1], src=peer)
            else:
                box.posted[key].append(recv)
        return recv

    @staticmethod
    def _deliver(recv: _Recv, payload: np.ndarray, src: int) -> None:
        target = recv.buf.view(np.uint8).reshape(-1)
        if payload.nbytes != target.nbytes:
            # Raised on the receiver when it waits; the wrong bytes are never written.
            recv.error = MismatchError(f"message from rank {src} has {payload.nbytes} bytes, "
                                       f"the receive expected {target.nbytes}")
        else:
            target[...] = payload
        recv.done = True

    def probe(self, source, tag=None, context=0, skip=0):
        box = self.world.boxes[self.rank]
        with box.cond:
            waiting = [(queue[0][0], src, t, queue[0][1].nbytes) for (src, t), queue in box.arrived.items()
                       if queue and (source is None or src == source)
                       and (t == tag if tag is not None else t >> CONTEXT_SHIFT == context and not t & skip)]
        if not waiting:
            return None
        _, src, t, nbytes = min(waiting)
        return src, t, nbytes

    def split(self, members, color, key, context, slot=None):
        if members is None:
            return None
        regions = self.world.windows(context, members)
        return TransportView(self, members, context, Window(members.index(self.rank), regions, spin=0.0,
                                                             aborted=watching_closes(regions, context, members,
                                                                                     self._aborted_reason),
                                                             reader=read_memory, writer=write_memory))

    def release_window(self, context: int) -> None:
        """The view ``context`` closed: its peers waiting in its window learn it (window.py)."""
        region = self.world.windows(context, [self.rank])[0]
        close_window_owner(region, context)

    def abort(self, reason: BaseException) -> None:
        self.world.abort(f"rank {self.rank}: {reason}")
