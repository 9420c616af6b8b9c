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


class PeerBuffers:
    """``pids[r]``: the process of window rank r."""

    def __init__(self, pids: list):
        self.pids = pids

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
