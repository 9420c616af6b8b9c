"""A shared window: a small mailbox per rank that every rank of the group can read in place.

The substrate of one-shot collectives (algorithms/one_shot.py): instead of a message per peer,
each rank writes its piece once and every rank reads all of them where they lie. A transport
offers one as ``transport.window`` when all its ranks share memory (shm on one node, threads).

Rank r owns one uint8 region (in shared memory, or an in-process array), laid out as

    [ROUND int64 | pad to 64 B] [slot 0: STAMP int64 | WORD int64 | pad | CAPACITY bytes] [slot 1: same]

Round k uses slot k % 2: the owner writes the payload, then STAMP and WORD (what the algorithm
says identifies the call: the collective's envelope tag and its exact count, and the part of its
shape the count does not show, such as a root or uneven counts, so ranks in different calls
notice instead of reading each other's bytes), then ROUND = k. Plain stores become
visible in program order on x86 (see shm.py for the argument and the guard on other CPUs). A
reader waits until every rank's ROUND >= k and then reads the slots.

Why two slots need no acknowledgement: rank r writes slot k % 2 again in round k + 2, after it
finished round k + 1, which needed every peer's ROUND >= k + 1, which each peer posts only after
it finished reading round k. So a slot is never overwritten while a peer may still read it: one
flag store and n - 1 flag loads per round, nothing else.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..core.compiled import array_address, core_for
from ..errors import PeerAbortedError
from .polling import SPIN_SHARED, wait_polling

POISON = -1              # the stamp of a rank that gave up (window stamps are never negative)
CAPACITY = 64 << 10       # payload bytes per rank per round of a sub-communicator's window
JOB_CAPACITY = 512 << 10  # the same for the whole job's window: medium collectives in a few rounds
LINE = 64
# A direct algorithm's row (``address_words``) holds per array its address, and where the window
# maps peers' ringcomm.empty blocks (``memory``) the four words of memory.words after it:
# descriptor, inode, block address, block size. The inode is nonzero where the array lies in a block.
BLOCK_WORDS = 4
INODE = 2                # an array's inode word, counted from its address
SPIN_SECONDS = SPIN_SHARED   # a window's default budget; shm passes spin_for(its node)


def _words(region: np.ndarray) -> memoryview:
    return memoryview(region).cast("B").cast("q")


def region_bytes(capacity: int = CAPACITY) -> int:
    return LINE + 2 * (LINE + capacity)


# A region's first line holds its rank's round flag (word 0) and, in a sub-communicator's slot,
# which communicator's window has it (word 1: its context id + 1 while open, minus that once
# closed, 0 never used), so that a slot is given to another communicator only once every peer of
# the last one has closed it, and so that a peer waiting in that window learns of the close at
# once instead of at its timeout (0 alone could not tell "closed" from "not opened yet").
def window_round(region: np.ndarray) -> int:
    """The last round ``region``'s rank posted in it."""
    return _words(region[:16])[0]


def window_owner(region: np.ndarray) -> int:
    """The context id of the window that has ``region`` open, or -1."""
    word = _words(region[:16])[1]
    return word - 1 if word > 0 else -1


def set_window_owner(region: np.ndarray, context: int) -> None:
    """Mark ``region`` open in the window of communicator ``context``."""
    _words(region[:16])[1] = context + 1


def close_window_owner(region: np.ndarray, context: int) -> None:
    """Mark ``region`` closed by the window of communicator ``context``."""
    _words(region[:16])[1] = -(context + 1)


def window_closed(region: np.ndarray, context: int) -> bool:
    """Whether ``region``'s rank has closed its window of communicator ``context``."""
    return _words(region[:16])[1] == -(context + 1)


def watching_closes(regions: list, context: int, members: list,
                    aborted: Callable[[int], Optional[str]]) -> Callable[[int], Optional[str]]:
    """A sub-communicator window's ``aborted(peer)``: the peer's close of this window (its region
    ``regions[peer]`` says so), else ``aborted(peer)``. ``members``: the job ranks, in order."""
    def reason(peer: int) -> Optional[str]:
        if window_closed(regions[peer], context):   # it will post no round here again
            return f"rank {peer} of this communicator (rank {members[peer]} of the job) has closed it (close())"
        return aborted(peer)
    return reason


class Window:
    """``regions[r]`` is rank r's region as this process sees it (``region_bytes`` long).

    ``reader(rank, address, dst)``, where the transport offers one, copies ``dst.nbytes`` bytes at
    ``address`` of that rank's memory into ``dst`` (CMA between processes, a plain copy between
    threads): the direct algorithms post addresses in their slots instead of payloads.
    ``writer(rank, address, src)`` copies ``src`` there the other way; a transport offers both or
    neither. ``pids``, where a transport gives them, say that ``reader`` is a CMA read of those
    processes: the compiled direct rounds (``direct_core``) then read peers themselves, except,
    with ``detour``, reads whose two sides lie a slow distance apart, which ``reader`` makes
    through a buffer (cma.PeerMemory).

    ``memory``, where the transport gives one (shm: PeerBuffers), opens peers' ``ringcomm.empty``
    buffers here: a direct algorithm's rounds carry, beside each address, the block it lies in
    (``address_words``), and ``learn`` maps the peers' blocks once; ``reader``, ``writer`` and
    ``mapped`` then reach them with plain loads and stores instead of CMA (memory.py).

    ``aborted(peer)`` returns why the job or that peer gave up, or closed this communicator
    (``watching_closes``), or None. ``spin`` is how long a wait polls before it starts sleeping
    (polling.py): processes on cores of their own poll for a while, threads of one process
    (which would only hold the GIL their peers need) give the CPU up at once.
    """

    def __init__(self, rank: int, regions: list, *, capacity: int = CAPACITY,
                 aborted: Callable[[int], Optional[str]] = lambda peer: None,
                 spin: float = SPIN_SECONDS, reader: Optional[Callable] = None,
                 writer: Optional[Callable] = None, pids: Optional[tuple] = None, detour: bool = False,
                 memory=None, start: int = 0):
        self.rank, self.size, self.capacity = rank, len(regions), capacity
        self.reader, self.writer = reader, writer
        self.memory = memory
        self._mapped: list = [[] for _ in regions]   # per rank: (start, end, view) of its blocks mapped here
        if reader is not None:
            self._cma_read, self._cma_write = reader, writer
            self.reader, self.writer = self._read, self._write
        self._scratch = np.empty(0, np.uint8)
        self.round = start   # past every member's last round in these regions (a reused slot)
        self.waiting: Optional[int] = None   # the round a wait of this rank's is in (poison says it)
        self._aborted, self.spin = aborted, spin
        # The compiled one-shot all-reduce round over these same regions (core/_round.c), or None.
        # It posts and reads rounds exactly as the methods below do, so either may run any round.
        self.core = core_for(rank, regions, capacity, pids, detour)
        # The same core where it may also read peers by CMA itself (direct_all_to_all.py), or None.
        self.direct_core = self.core if pids is not None and reader is not None else None
        # Flags and stamps through memoryviews: an item access costs a third of numpy's.
        self._flags = [_words(r[:8]) for r in regions]
        self._stamps = [[_words(r[LINE + p * (LINE + capacity):][:8]) for p in (0, 1)] for r in regions]
        self._shapes = [[_words(r[LINE + p * (LINE + capacity) + 8:][:8]) for p in (0, 1)] for r in regions]
        self._slots = [[r[2 * LINE + p * (LINE + capacity):][:capacity] for p in (0, 1)]
                       for r in regions]
        self._views: dict = {}   # (count, dtype number) -> per parity, every rank's slot as such an array
        self._peers = [r for r in range(self.size) if r != rank]

    # ---- peers' ringcomm.empty buffers (memory.py) ---------------------------------------------
    @property
    def array_words(self) -> int:
        """Words ``address_words`` posts per array: 1, or 1 + BLOCK_WORDS with ``memory``."""
        return 1 if self.memory is None else 1 + BLOCK_WORDS

    @property
    def block_word(self) -> int:
        """Where in an array's words its inode lies (nonzero: the array lies in a ringcomm.empty
        block), or -1 where the window posts addresses alone."""
        return -1 if self.memory is None else INODE

    def address_words(self, arrays) -> list:
        """The words a direct algorithm posts for ``arrays``: each one's address, and where the
        window has ``memory``, the four words that let peers map the block it lies in."""
        if self.memory is None:
            return [array_address(a) for a in arrays]
        words = []
        for a in arrays:
            addr = array_address(a)
            words.append(addr)
            words.extend(self.memory.words(addr, a.nbytes))
        return words

    def learn(self, rows: list) -> list:
        """Every rank's addresses (a tuple per rank) from the rows ``address_words`` posted;
        peers' blocks not mapped here yet are mapped on the way."""
        if self.memory is None:
            return rows
        step = self.array_words
        for r, row in enumerate(rows):
            if r == self.rank or not any(row[INODE::step]):   # no inode: none of its buffers is a block
                continue
            for i in range(0, len(row), step):
                fd, ino, start, nbytes = row[i + 1:i + step]
                if ino and not any(s == start for s, _, _ in self._mapped[r]):
                    view = self.memory.open(r, fd, ino, nbytes)
                    if view is not None:
                        self._mapped[r].append((start, start + nbytes, view))
        return [row[0::5] for row in rows]

    def mapped(self, rank: int, addr: int, nbytes: int) -> Optional[np.ndarray]:
        """``nbytes`` at ``addr`` of ``rank``'s memory as a uint8 array here, where they lie in a
        block of its that this process has mapped; else None."""
        blocks = self._mapped[rank]
        if not blocks:
            return None
        for start, end, view in blocks:
            if start <= addr and addr + nbytes <= end:
                return view[addr - start:addr - start + nbytes]
        return None

    def _read(self, rank: int, addr: int, dst: np.ndarray) -> None:
        if not self._mapped[rank]:
            return self._cma_read(rank, addr, dst)
        view = self.mapped(rank, addr, dst.nbytes)
        if view is None:
            self._cma_read(rank, addr, dst)
        else:
            np.copyto(dst.reshape(-1).view(np.uint8), view)

    def _write(self, rank: int, addr: int, src: np.ndarray) -> None:
        if self.gave_up(rank):   # its call raised: that memory is the caller's again (deserted)
            raise PeerAbortedError(f"rank {rank} gave up on this call ({self._aborted(rank) or 'it posted its poison'}): "
                                   f"this rank does not write into its buffers")
        view = self.mapped(rank, addr, src.nbytes) if self._mapped[rank] else None
        if view is None:
            self._cma_write(rank, addr, src)
        else:
            np.copyto(view, src.reshape(-1).view(np.uint8))

    def scratch(self, nbytes: int) -> np.ndarray:
        """A private buffer of at least ``nbytes``, kept between calls (one call runs at a time on
        a window: its communicator's), so large reads do not fault in fresh pages every call."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch

    def views(self, k: int, dtype, count: int) -> list:
        """Every rank's slot of round ``k`` as an array of ``count`` x ``dtype``, in rank order."""
        key = (count, dtype.num)   # hashing a numpy dtype itself costs as much as the copy in
        both = self._views.get(key)
        if both is None:
            if len(self._views) >= 64:   # a job uses a handful of shapes; do not grow without end
                self._views.clear()
            both = self._views[key] = [[slots[p].view(dtype)[:count] for slots in self._slots] for p in (0, 1)]
        return both[k & 1]

    def next_slot(self, dtype, count: int) -> np.ndarray:
        """This rank's slot of its next round, to fill before ``publish`` posts it."""
        return self.views(self.round + 1, dtype, count)[self.rank]

    def publish(self, stamp: int, word: int = 0) -> int:
        """Post this rank's next round (its slot as filled, if at all); returns its number."""
        k = self.round + 1
        self._stamps[self.rank][k & 1][0] = stamp
        self._shapes[self.rank][k & 1][0] = word
        self._flags[self.rank][0] = k   # last: a peer that sees k sees the payload, stamp and word
        self.round = k
        return k

    def poison(self) -> None:
        """This rank gave up: post its next round stamped POISON, so that a peer waiting for a round
        this rank will never post raises instead of completing it with a stale slot. The round it
        did post keeps its stamp: a peer still reading that one must find there what this rank
        found (a mismatch is a MismatchError on every rank, not "a peer gave up"). Its word is
        the round this rank gave up waiting for (``waiting``), or -1: a peer stopped (SIGSTOP, a
        debugger) that resumes and finds every rank's round k posted must still learn that a
        rank gave up on round k, and with it on buffers it may have reused since (``deserted``)."""
        k = self.round + 1
        self._stamps[self.rank][k & 1][0] = POISON
        self._shapes[self.rank][k & 1][0] = -1 if self.waiting is None else self.waiting
        self._flags[self.rank][0] = k

    def deserted(self, k: int) -> Optional[int]:
        """The first peer that posted round ``k`` and then gave up waiting for it, or None. Such a
        peer's call raised: its buffers are the caller's again, not to be read or written."""
        for peer in self._peers:
            if self._flags[peer][0] == k + 1 and self._stamps[peer][(k + 1) & 1][0] == POISON \
                    and self._shapes[peer][(k + 1) & 1][0] == k:
                return peer
        return None

    def gave_up(self, peer: int) -> bool:
        """Whether ``peer``'s newest round is its poison (it gave up, on this call or after it)."""
        k = self._flags[peer][0]
        return k > self.round and self._stamps[peer][k & 1][0] == POISON

    def stamp(self, rank: int, k: int) -> int:
        return self._stamps[rank][k & 1][0]

    def word(self, rank: int, k: int) -> int:
        return self._shapes[rank][k & 1][0]

    def odd_stamp(self, k: int, stamp: int, word: int = 0) -> Optional[int]:
        """The first peer whose round-``k`` slot carries another stamp or word, or None."""
        p = k & 1
        for peer in self._peers:
            if self._stamps[peer][p][0] != stamp or self._shapes[peer][p][0] != word:
                return peer
        return None

    def ahead(self, peer: int) -> Optional[int]:
        """The stamp of ``peer``'s newest round if it has posted one this rank has not, else None:
        how a stalled rank learns that a peer is in a one-shot collective it is not."""
        k = self._flags[peer][0]
        return self._stamps[peer][k & 1][0] if k > self.round else None

    def lagging(self, k: int) -> Optional[int]:
        """The first peer that has not posted round ``k`` yet, or None."""
        flags = self._flags
        for peer in self._peers:
            if flags[peer][0] < k:
                return peer
        return None

    def wait(self, k: int, timeout: float) -> Optional[int]:
        """Wait up to ``timeout`` seconds for every rank to post round ``k``: None once they all
        have, else the peer still missing. Raises PeerAbortedError if that peer gave up."""
        if wait_polling(lambda: self.lagging(k) is None, timeout, lambda: self._gave_up(k), spin=self.spin):
            return None
        return self.lagging(k)

    def gone(self, peer: int) -> Optional[str]:
        """Why ``peer`` will post nothing more to this communicator (it closed it, or it or the job
        gave up), or None. A stalled wait of any algorithm, not only the window's, asks it
        (executor.py), once it has re-tested what it waits for."""
        return self._aborted(peer)

    def _gave_up(self, k: int) -> Optional[str]:
        """Why the peer this round waits for gave up, if it did."""
        peer = self.lagging(k)
        return None if peer is None else self.gone(peer)
