"""The point-to-point interface every algorithm runs over.

Deliberately tiny, in the spirit of gloo's pair: nonblocking send and receive of a flat buffer
to or from one peer, under a tag, and a request to wait on. Messages between the same pair under
the same tag are matched in posting order (MPI's non-overtaking rule); algorithms rely on that.

Two optional hooks let a transport go faster without algorithms knowing:
- ``irecv_reduce`` receives and reduces in one go; a shared-memory transport reduces straight
  out of the sender's memory instead of copying into scratch first.
- ``stage`` brackets one collective with the arrays it sends from and receives into, so that a
  transport can decide how to carry them (shm: read large ones in place with CMA).

And one optional capability: ``window`` (transport/window.py), a mailbox per rank that every rank
reads in place, offered only where all ranks of the job share memory; one-shot algorithms need it.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Callable, Iterator, NamedTuple, Optional

import numpy as np

Reducer = Callable[..., None]   # reduce(dst, msg) or reduce(dst, msg, own): see irecv_reduce


class WindowSlot(NamedTuple):
    """The shared-window slot a sub-communicator's members agreed on, and the round its window
    counts from: past every member's last round in that slot, where an earlier communicator
    left its flags (subcommunicators.py)."""
    index: int
    start: int = 0


class Request(ABC):
    @abstractmethod
    def wait(self, timeout: Optional[float]) -> bool:
        """Block until complete; False if ``timeout`` seconds passed first (None: no limit).

        Raises PeerAbortedError if the transport was aborted while waiting."""

    @abstractmethod
    def test(self) -> bool:
        """True if complete, without blocking."""

    def cancel(self) -> None:
        """Withdraw a receive that has not matched (its buffer is never written after this).
        Sends and completed requests ignore it."""

    def buffered(self) -> bool:
        """A send: True once its buffer may change, which a transport that copies the bytes out
        when it posts (MPI's eager send) knows before the send completes; the transport then
        finishes it on its own. ``comm.send`` completes on this; a collective's schedule waits
        for completion, which keeps a transport's staging space from filling up behind it."""
        return self.test()

    def passive(self) -> bool:
        """A send: True when its peer can finish it without this rank doing anything more (the
        bytes are where the receiver reads them, or the receiver may read them itself): testing
        it only observes the acknowledgement, so nobody need be woken to test it."""
        return False

    def rendezvous(self) -> bool:
        """A send: True when its receiver reads the bytes out of the caller's array, so only a
        matching receive completes it (a timeout then says so)."""
        return False


class DoneRequest(Request):
    def wait(self, timeout):
        return True

    def test(self):
        return True


class ReduceOnWait(Request):
    """A receive into scratch whose completion also reduces it into the destination, once:
    dst = dst OP scratch, or dst = own OP scratch when ``own`` is given."""

    def __init__(self, inner: Request, dst: np.ndarray, scratch: np.ndarray, reduce: Reducer, own=None):
        self._inner, self._dst, self._scratch, self._reduce, self._own = inner, dst, scratch, reduce, own
        self._reduced = False

    def wait(self, timeout):
        if not self._inner.wait(timeout):
            return False
        if not self._reduced:
            if self._own is None:
                self._reduce(self._dst, self._scratch)
            else:
                self._reduce(self._dst, self._scratch, self._own)
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

    def isend_p2p(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        """isend for a user's send (``comm.send``): ``buf`` is the caller's own array, untouched
        until the request completes (MPI_Isend's rule), so a transport may have the receiver read
        it in place at sizes where that beats a copy (shm: CMA, or a pipe where CMA is off).
        A collective's sends get that only for the arrays it stages."""
        return self.isend(buf, peer, tag)

    @abstractmethod
    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        """Start receiving exactly ``buf.nbytes`` bytes into ``buf``."""

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reduce: Reducer,
                     scratch: np.ndarray, own: Optional[np.ndarray] = None) -> Request:
        """Receive a message of ``buf``'s shape and reduce it into ``buf``: buf = buf OP msg, or
        buf = own OP msg when ``own`` (an array of buf's shape) is given. ``reduce(dst, msg)`` and
        ``reduce(dst, msg, own)`` compute those (ops.Reduction); a transport that reduces in
        pieces slices dst, msg and own alike. The operand order (own, then the message) is what
        keeps results bitwise identical across ranks."""
        return ReduceOnWait(self.irecv(scratch, peer, tag), buf, scratch, reduce, own)

    @contextlib.contextmanager
    def stage(self, arrays: tuple) -> Iterator[None]:
        """Bracket one collective: ``arrays`` are the flat arrays it sends from and receives into
        (its named buffers). Sends may come from any of them, receives land in them directly."""
        yield

    def read_notice(self, notice: tuple, timeout: float = 1.0) -> str:
        """Receive the abort notice (Communicator._fail) that ``probe`` found, as
        "rank R gave up: <its reason>"; the probe saw it whole, so it is here within ``timeout``."""
        source, tag, nbytes = notice
        text = np.empty(nbytes, np.uint8)
        got = self.irecv(text, source, tag).wait(timeout)
        reason = text.tobytes().decode(errors="replace") if got else "(its reason did not arrive)"
        return f"rank {source} gave up: {reason}"

    def probe(self, source: Optional[int], tag: Optional[int] = None, context: int = 0,
              skip: int = 0) -> Optional[tuple]:
        """(source, tag, nbytes) of the earliest unmatched message from ``source`` (None: any)
        with ``tag`` (None: any tag of communicator ``context``, i.e. tag >> 32 == context),
        without receiving it; None if there is none. With no ``tag``, messages whose tag has any
        bit of ``skip`` are passed over (a collective looking for a peer's message that explains
        its stall passes over point-to-point sends still waiting for their receive).

        Only the slow path uses it, to explain a stalled wait (a peer in another collective, or a
        peer that gave up). A transport that cannot probe returns None: stalls then end as timeouts.
        """
        return None

    def peer_gone(self, peer: int, as_rank: Optional[int] = None) -> Optional[str]:
        """Why ``peer`` will post nothing more, as far as this transport can see (its process
        ended, it closed or aborted its transport), or None. ``as_rank``: what the asking
        communicator calls it, where that differs (a sub-communicator's view). A transport that
        cannot see its peers (MPI, another node) says None: such a stall ends at the deadline, or
        at a notice of a rank that gave up."""
        return None

    def split(self, members: Optional[list], color, key: int, context: int, slot: Optional[int] = None):
        """The transport of a sub-communicator (``comm.split``): ``members`` are this transport's
        ranks in the new order (None: this rank is in none; still called, since some transports
        split collectively), ``context`` its id, ``slot`` the shared-window slot its members
        agreed on (a WindowSlot; None: no window)."""
        raise NotImplementedError(f"the {self.name} transport has no sub-communicators")

    def group(self, members: list, context: int):
        """The transport of a communicator of ``members`` alone (``comm._group``, like
        MPI_Comm_create_group): only the members call it. Transports whose ``split`` is local
        (a view: threads, shared memory) make the same view; MPI and routed transports override.
        No window yet: the members agree on a slot over the new transport, then ``open_window``."""
        return self.split(members, None, 0, context)

    def open_window(self, slot: WindowSlot) -> None:
        """Give this sub-communicator's transport the shared window ``slot`` its members agreed
        is free on each of them; a transport without shared windows ignores it."""

    def abort(self, reason: BaseException) -> None:
        """Release every waiter with PeerAbortedError; later calls fail fast."""

    def leave(self) -> None:
        """A sub-communicator's transport, given up by its communicator's close(): free what is
        its own and nothing it shares with its parent (a view's context id and the messages
        sent to it that it never received). Safe to call twice."""

    def retire(self) -> None:
        """After ``leave``, where the communicator closed cleanly on this rank (nothing failed,
        nothing in flight): give back what only such a close may, an MPI communicator of its
        own (transport/mpi.py retire_communicator). Safe to call twice."""

    def close(self) -> None:
        """Free resources. Safe to call twice."""

    def forget(self) -> None:
        """Once nothing uses this transport (its world and every sub-communicator closed):
        ``close``, and let go of what the node shares (segments); a transport that shares
        nothing has only ``close`` to do."""
        self.close()
