"""The staging pool: where a send whose bytes peers cannot read in place waits for its receiver.

A send from private memory that no peer can read (not in a shared segment, not read by CMA) is
copied into this rank's staging pool when it is published and read by the receiver from there;
the space is given back when the receiver acknowledges. The pool is created, and its pages
reserved, once at setup: nothing about it is ever negotiated again, so a rank that disagrees
with its peers about a collective cannot break the pool's bookkeeping, only its own messages.

The pool is cut into one **share** per destination on the node, so a peer that is slow to
receive can fill only its own share and never starve the others.

When a message does not fit its share:
- larger than the whole share: it goes over the node's MPI communicator ("overflow");
- the share holds only earlier messages of the same stream (sender, receiver, tag): it **waits**
  until enough of them are acknowledged, in stream order behind any others already waiting;
- the share holds messages of another stream, or another stream is already waiting: overflow.

Why waiting cannot deadlock a schedule that is deadlock-free under MPI rendezvous semantics: a
waiting message waits only for earlier messages of its own stream. The receiver matches a
stream in order (non-overtaking), so it consumes those earlier messages before it can use the
waiting one anyway; the wait adds no dependency that rendezvous does not already impose. (The
executor waits the ops of a step in order and channels map to lanes one to one, so "before it
can use" holds for every program.) A wait behind another stream's messages could close a cycle
through two lanes, which is why those go over MPI: there a send completes as MPI's own
semantics allow, at worst rendezvous. Every outcome is decided while the transport's lock is
held, and waiting sends are placed by the progress that every wait runs.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from .segments import align

PLACED, WAIT, OVERFLOW = "placed", "wait", "overflow"
SHARE_BYTES = 4 << 20          # default share per destination: four 1 MiB schedule segments
SHARE_QUANTUM = 64 << 10       # shares are whole multiples of this
POOL_CAP = 32 << 20            # at most this much pool per rank however many peers it has


class Share:
    """The part of a rank's pool for messages to one peer: first-fit blocks, 64-byte aligned.
    ``blocks`` are [start, end, tag] of unacknowledged messages, sorted by start (absolute
    offsets in the segment)."""

    __slots__ = ("base", "size", "blocks", "waiting", "waiting_tag")

    def __init__(self, base: int, size: int):
        self.base, self.size = base, size
        self.blocks: list = []
        self.waiting: deque = deque()
        self.waiting_tag: Optional[int] = None

    def take(self, nbytes: int, tag: int) -> Optional[int]:
        need, at = align(max(nbytes, 1)), self.base
        for i, (start, end, _) in enumerate(self.blocks):
            if start - at >= need:
                self.blocks.insert(i, [at, at + need, tag])
                return at
            at = end
        if self.base + self.size - at >= need:
            self.blocks.append([at, at + need, tag])
            return at
        return None

    def give_back(self, off: int) -> None:
        for i, block in enumerate(self.blocks):
            if block[0] == off:
                del self.blocks[i]
                return

    def holds_only(self, tag: int) -> bool:
        return all(b[2] == tag for b in self.blocks)

    def used(self) -> int:
        return sum(end - start for start, end, _ in self.blocks)


class StagingPool:
    """``shares[p]`` for every peer node rank p; ``copy_in(off, buf)`` writes ``buf``'s bytes at
    offset ``off`` of the pool's segment (host or device memory, the transport knows)."""

    def __init__(self, base: int, share: int, peers: list, copy_in: Callable):
        self.share = share
        self.shares = {p: Share(base + i * share, share) for i, p in enumerate(peers)}
        self.copy_in = copy_in

    def admit(self, p: int, req) -> str:
        """Decide a new send to peer ``p`` (``req.tag``, ``req.buf``): PLACED (``req.off`` set,
        bytes copied), WAIT (queued in the share) or OVERFLOW."""
        share, nbytes = self.shares[p], req.buf.nbytes
        if nbytes > share.size:
            return OVERFLOW
        if share.waiting:
            if share.waiting_tag == req.tag:
                share.waiting.append(req)
                return WAIT
            return OVERFLOW
        if self._place(share, req):
            return PLACED
        if share.holds_only(req.tag):
            share.waiting_tag = req.tag
            share.waiting.append(req)
            return WAIT
        return OVERFLOW

    def retry(self, p: int) -> list:
        """Sends leaving ``p``'s waiting queue, in stream order: [(req, PLACED or OVERFLOW)]."""
        share, out = self.shares[p], []
        while share.waiting:
            req = share.waiting[0]
            if self._place(share, req):
                out.append((share.waiting.popleft(), PLACED))
            elif share.holds_only(req.tag):
                break
            else:   # cannot happen while only one stream waits; never wait behind another stream
                out.extend((r, OVERFLOW) for r in share.waiting)
                share.waiting.clear()
        if not share.waiting:
            share.waiting_tag = None
        return out

    def release(self, p: int, off: int) -> None:
        self.shares[p].give_back(off)

    def _place(self, share: Share, req) -> bool:
        off = share.take(req.buf.nbytes, req.tag)
        if off is None:
            return False
        self.copy_in(off, req.buf)
        req.off = off
        return True


def share_size(peers: int, wanted: int, budget: Optional[int], cap: Optional[int]) -> int:
    """Bytes per share for ``peers`` destinations: ``wanted``, within ``cap`` and ``budget``
    bytes for the whole pool (None: no limit), in SHARE_QUANTUM steps (0: no pool)."""
    if peers <= 0:
        return 0
    limits = [x for x in (cap, budget) if x is not None]
    size = min([wanted] + [max(x, 0) // peers for x in limits])
    return size // SHARE_QUANTUM * SHARE_QUANTUM
