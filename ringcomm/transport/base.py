"""The point-to-point interface every algorithm runs over.

Deliberately tiny, in the spirit of gloo's pair: nonblocking send and receive of a flat buffer
to or from one peer, under a tag, and a request to wait on. Messages between the same pair under
the same tag are matched in posting order (MPI's non-overtaking rule); algorithms rely on that.

Two optional hooks let a transport go faster without algorithms knowing:
- ``irecv_reduce`` receives and reduces in one go; a shared-memory transport reduces straight
  out of the sender's memory instead of copying into scratch first.
- ``stage`` may move the work buffer into memory peers can read (and back) around a collective.

And one optional capability: ``window`` (transport/window.py), a mailbox per rank that every rank
reads in place, offered only where all ranks of the job share memory; one-shot algorithms need it.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Callable, Iterator, Optional

import numpy as np

Reducer = Callable[[np.ndarray, np.ndarray], None]


class Request(ABC):
    @abstractmethod
    def wait(self, timeout: Optional[float]) -> bool:
        """Block until complete; False if ``timeout`` seconds passed first (None: no limit).

        Raises PeerAbortedError if the transport was aborted while waiting."""

    @abstractmethod
    def test(self) -> bool:
        """True if complete, without blocking."""


class DoneRequest(Request):
    def wait(self, timeout):
        return True

    def test(self):
        return True


class ReduceOnWait(Request):
    """A receive into scratch whose completion also reduces scratch into the destination once."""

    def __init__(self, inner: Request, dst: np.ndarray, scratch: np.ndarray, reduce: Reducer):
        self._inner, self._dst, self._scratch, self._reduce = inner, dst, scratch, reduce
        self._reduced = False

    def wait(self, timeout):
        if not self._inner.wait(timeout):
            return False
        if not self._reduced:
            self._reduce(self._dst, self._scratch)
            self._reduced = True
        return True

    def test(self):
        return self._reduced or self._inner.test()


class Transport(ABC):
    name = "abstract"
    rank: int
    size: int
    window = None   # a Window over every rank of the job, where they all share memory

    @abstractmethod
    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        """Start sending ``buf``; it must not change until the request completes."""

    @abstractmethod
    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        """Start receiving exactly ``buf.nbytes`` bytes into ``buf``."""

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reduce: Reducer,
                     scratch: np.ndarray) -> Request:
        """Receive a message of ``buf``'s shape and reduce it into ``buf`` (buf = buf OP msg)."""
        return ReduceOnWait(self.irecv(scratch, peer, tag), buf, scratch, reduce)

    @contextlib.contextmanager
    def stage(self, flat: np.ndarray) -> Iterator[np.ndarray]:
        """Yield the array a collective should work on; results must end up in ``flat``."""
        yield flat

    def probe(self, source: Optional[int], tag: Optional[int] = None) -> Optional[tuple]:
        """(source, tag, nbytes) of the earliest unmatched message from ``source`` (None: any)
        with ``tag`` (None: any), without receiving it; None if there is none.

        Only the slow path uses it, to explain a stalled wait (a peer in another collective, or a
        peer that gave up). A transport that cannot probe returns None: stalls then end as timeouts.
        """
        return None

    def abort(self, reason: BaseException) -> None:
        """Release every waiter with PeerAbortedError; later calls fail fast."""

    def close(self) -> None:
        """Free resources. Safe to call twice."""
