"""Descriptor rings: how a message is published, discovered and acknowledged.

Per ordered pair (sender s, receiver d) of a node, s's control segment holds a ring of SLOTS
descriptor slots of FIELDS int64 (64 bytes, one cache line each): [PUB, ACK, TAG, ORD, SEG, OFF,
NBYTES, EXTRA]. A send moves no bytes through the ring: the descriptor says where d can read the
payload (SEG/OFF: a shared segment and offset, the sender's own memory for CMA, its own memory
in a ringcomm.empty block d may map (EXTRA says which), a ring of cells the sender fills as the
receiver empties it ("pipe"), "empty", or "over MPI").

- publish (sender): message k to d goes to slot (k-1) % SLOTS once that slot's previous message
  is acknowledged (PUB == ACK); the sender writes TAG..NBYTES and then PUB = k.
- discover (receiver): messages are found in PUB order (message k is in slot (k-1) % SLOTS when
  its PUB == k) and indexed by (TAG, ORD), so a receive is matched by a dictionary lookup. ORD
  numbers the messages of one (sender, receiver, tag) stream: a receive takes exactly the
  message it was posted for even when streams interleave (MPI's non-overtaking rule per tag).
- acknowledge (receiver): after consuming the payload, ACK = PUB. The send completes then, and
  the sender may reuse the slot and the payload's memory.

TAG holds the full tag (sub-communicators put a context id above bit 32; tags are below 2**62).

Memory ordering: the protocol needs stores to become visible in program order (payload and
fields before PUB; payload reads before ACK) and loads not to pass earlier loads. x86-64 (TSO)
guarantees both for plain stores and loads, and each numpy operation is an opaque C call the
compiler cannot reorder across. On weakly ordered CPUs (ARM, POWER) this would need fences; the
transport refuses to start there unless RINGCOMM_SHM_UNSAFE_ORDERING=1.
"""
from __future__ import annotations

import platform
from collections import deque

import numpy as np

from ... import env
from ...errors import CommError

SLOTS = 256                       # descriptors in flight per ordered pair before sends queue
PUB, ACK, TAG, ORD, SEG, OFF, NBYTES, EXTRA = range(8)
FIELDS = 8                        # 64-byte slots: one cache line each
RING_BYTES = SLOTS * FIELDS * 8
VIA_MPI = -1                      # SEG value: the payload follows over the node's MPI communicator
EMPTY = -2                        # SEG value: a zero-byte message (barriers), nothing to read
CMA = -3                          # SEG value: the payload is in the sender's process memory at OFF
PIPE = -4                         # SEG value: through a ring of cells at OFF of the sender's pool (pipe.py)
BLOCK = -5                        # SEG value: as CMA, in a ringcomm.empty block of the sender's (EXTRA: messages.py)
_TSO = {"x86_64", "amd64", "i386", "i686"}


def check_ordering() -> None:
    if platform.machine().lower() not in _TSO and not env.get("RINGCOMM_SHM_UNSAFE_ORDERING"):
        raise CommError(f"the shm transport relies on x86 store ordering; this CPU is "
                        f"{platform.machine()} (set RINGCOMM_TRANSPORT=mpi, or "
                        f"RINGCOMM_SHM_UNSAFE_ORDERING=1 to try anyway)")


def ring_view(region: np.ndarray) -> memoryview:
    """A ring's slots as one flat int64 memoryview over ``region`` (RING_BYTES of uint8), field f
    of slot s at s * FIELDS + f. A memoryview, not a (SLOTS, FIELDS) array: an item of it is read
    or written in ~40 ns against numpy's ~150 (and a row view's ~200), and a message touches a
    dozen of them on each side (1.9 -> 1.0 us per message, publish to acknowledgement)."""
    return memoryview(region[:RING_BYTES]).cast("B").cast("q")


class Outgoing:
    """This rank's ring to one destination. ``queue`` holds sends ready to publish (payload in
    place), in the order they became ready; they take slots in that order."""

    __slots__ = ("ring", "published", "queue")

    def __init__(self, ring: memoryview):
        self.ring, self.published, self.queue = ring, 0, deque()

    def slot_free(self) -> bool:
        at = self.published % SLOTS * FIELDS
        return self.ring[at + PUB] == self.ring[at + ACK]

    def publish(self, tag: int, ordinal: int, seg: int, off: int, nbytes: int, extra: int = 0) -> tuple:
        """Write the next descriptor (its slot must be free); returns (slot, number)."""
        num = self.published + 1
        slot = (num - 1) % SLOTS
        ring, at = self.ring, slot * FIELDS
        ring[at + TAG], ring[at + ORD], ring[at + SEG], ring[at + OFF], ring[at + NBYTES] = tag, ordinal, seg, off, nbytes
        if seg == BLOCK:
            ring[at + EXTRA] = extra
        ring[at + PUB] = num   # last: a reader that sees it sees the fields
        self.published = num
        return slot, num

    def acked(self, slot: int, num: int) -> bool:
        return self.ring[slot * FIELDS + ACK] >= num


class Incoming:
    """A peer's ring to this rank: its messages discovered in PUB order, indexed by (tag, ord)."""

    __slots__ = ("ring", "seen", "arrived")

    def __init__(self, ring: memoryview):
        self.ring, self.seen, self.arrived = ring, 0, {}   # (tag, ord) -> slot, not yet taken

    def discover(self) -> list:
        """Index what the peer published since the last look; returns the new slots in order."""
        ring, seen, new = self.ring, self.seen, []
        while True:
            slot = seen % SLOTS
            at = slot * FIELDS
            if ring[at + PUB] != seen + 1:
                break
            self.arrived[(ring[at + TAG], ring[at + ORD])] = slot
            new.append(slot)
            seen += 1
        self.seen = seen
        return new

    def fields(self, slot: int) -> tuple:
        """(SEG, OFF, NBYTES) of the message in ``slot``."""
        ring, at = self.ring, slot * FIELDS
        return ring[at + SEG], ring[at + OFF], ring[at + NBYTES]

    def extra(self, slot: int) -> int:
        return self.ring[slot * FIELDS + EXTRA]

    def key(self, slot: int) -> tuple:
        at = slot * FIELDS
        return self.ring[at + TAG], self.ring[at + ORD]

    def ack(self, slot: int) -> None:
        at = slot * FIELDS
        self.ring[at + ACK] = self.ring[at + PUB]
