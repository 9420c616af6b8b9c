"""Peers' ``ringcomm.empty`` buffers, mapped into this process (memory.py says why).

A direct algorithm's first round carries, beside each buffer's address, the memfd block it lies
in: the owner's descriptor number, the block's inode, address and size (``words``). A peer opens
``/proc/<owner pid>/fd/<fd>``, the way the transport shares its own segments (segments.py), checks
the inode, and maps the block once for the life of both processes: the owner never unmaps a
block, so its address range stays that block. Where the open fails (another user, ``hidepid``)
the peer goes on reaching that owner through CMA, as for any buffer.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Optional

import numpy as np

from ... import memory

_log = logging.getLogger("ringcomm")
_LOCK = threading.Lock()
_MAPPED: dict = {}   # (pid, inode) -> the block as a uint8 array here, or None where it cannot be opened
NONE = (0, 0, 0, 0)


def _forget() -> None:
    _MAPPED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


FD_BITS = 20   # a send's EXTRA word (rings.py): the block's descriptor, then the message's offset in it


class PeerBuffers:
    """``pids[r]``: the process of window rank r (node rank r, for the transport's own sends)."""

    def __init__(self, pids: list):
        self.pids = pids
        self._sent: dict = {}   # (rank, descriptor) -> that block mapped here, or None: see ``sent``

    @staticmethod
    def send_word(addr: int, nbytes: int) -> int:
        """The EXTRA word of a send of ``nbytes`` at ``addr`` that lies in a block of this process:
        its descriptor and the offset in it; 0 where it lies in none."""
        block = memory.locate(addr, nbytes)
        if block is None or not 0 < block.fd < 1 << FD_BITS:
            return 0
        return block.fd | (addr - block.addr) << FD_BITS

    def sent(self, rank: int, word: int, nbytes: int) -> Optional[np.ndarray]:
        """The ``nbytes`` a send's EXTRA ``word`` names in ``rank``'s block, mapped here (uint8),
        or None where it cannot be (read them by CMA). A descriptor names one block for the life
        of its owner, which never closes a block's descriptor, so the mapping is looked up once
        per descriptor, by the inode the descriptor has then."""
        fd, offset = word & ((1 << FD_BITS) - 1), word >> FD_BITS
        key = (rank, fd)
        if key not in self._sent:
            try:
                st = os.stat(f"/proc/{self.pids[rank]}/fd/{fd}")
            except OSError:
                self._sent[key] = None
            else:
                self._sent[key] = self.open(rank, fd, st.st_ino, st.st_size)
        view = self._sent[key]
        if view is None or offset + nbytes > view.nbytes:
            return None
        return view[offset:offset + nbytes]

    @staticmethod
    def words(addr: int, nbytes: int) -> tuple:
        """(descriptor, inode, address, size) of the block of this process holding ``nbytes`` at
        ``addr``, or zeros."""
        block = memory.locate(addr, nbytes)
        return NONE if block is None else (block.fd, block.ino, block.addr, block.nbytes)

    def open(self, rank: int, fd: int, ino: int, nbytes: int) -> Optional[np.ndarray]:
        """Window rank ``rank``'s block (its ``words``) mapped here, or None where it cannot be."""
        pid = self.pids[rank]
        key = (pid, ino)
        with _LOCK:
            if key in _MAPPED:
                return _MAPPED[key]
            try:
                view = _map(pid, fd, ino, nbytes)
            except OSError as err:
                _log.info("ringcomm: cannot map a ringcomm.empty buffer of pid %d (%s); reading it "
                          "through CMA instead", pid, err)
                view = None
            _MAPPED[key] = view
            return view


def _map(pid: int, fd: int, ino: int, nbytes: int) -> np.ndarray:
    own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        st = os.fstat(own)
        if st.st_ino != ino or st.st_size < nbytes:
            raise OSError(f"/proc/{pid}/fd/{fd} is not the block its owner announced")
        return memory.map_shared(own, nbytes)   # keeps no descriptor: the mapping alone holds the block
    finally:
        os.close(own)
