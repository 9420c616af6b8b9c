"""The ranks of one node and the handshakes between them, every one bounded by the timeout.

A handshake is a nonblocking allgather of one int64 row per rank over the node communicator,
polled under the transport's timeout (the communicator's: ``ringcomm.init(timeout=)`` or
RINGCOMM_TIMEOUT). Segment setup needs a few of them (transport.py); nothing else does.

Each row starts with the handshake's kind and this rank's count of handshakes so far, so ranks
that reach different handshakes (one allocates, another sets up CUDA IPC) are told so instead of
reading each other's fields. While it waits, a rank also publishes that count in its control
segment (``mark``), so a rank that times out can name the peers that never arrived.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from ...core.envelope import CLOSE_CODE
from ...errors import CommError, CommTimeoutError, PeerAbortedError
from ..polling import wait_polling

KINDS = ("setup", "created", "mapped", "allocate", "allocate mapped", "device segment",
         "device segment opened", "device segment released")


class Node:
    """``comm``: an MPI communicator of exactly the ranks sharing this memory; ``ranks[i]`` is
    the global rank of node rank i."""

    def __init__(self, comm, ranks: Sequence[int], world_rank: int, timeout: float,
                 aborted: Callable[[], Optional[str]] = lambda: None):
        self.comm, self.ranks, self.rank = comm, list(ranks), world_rank
        self.me, self.n = comm.Get_rank(), comm.Get_size()
        self.timeout, self._aborted = timeout, aborted
        self.count = 0                          # handshakes this rank has entered
        self.broken: Optional[CommError] = None
        self.progress: Optional[Callable[[int], int]] = None   # peer's count, once control segments exist
        self.mark: Callable[[int], None] = lambda count: None

    def exchange(self, kind: str, row: Sequence[int]) -> np.ndarray:
        """Every rank's ``row`` (same length on all), as an (n, len) int64 array."""
        if self.broken is not None:
            raise CommError(f"shm transport on rank {self.rank}: an earlier handshake failed: "
                            f"{self.broken}") from self.broken
        self.count += 1
        self.mark(self.count)
        mine = np.array([KINDS.index(kind), self.count, *row], np.int64)
        every = np.zeros((self.n, mine.size), np.int64)
        req = self.comm.Iallgather(mine, every)
        try:
            done = wait_polling(req.Test, self.timeout, self._aborted)
        except PeerAbortedError as err:   # a peer gave up or ended: this handshake never completes
            self.broken = PeerAbortedError(f"shm transport on rank {self.rank}: handshake #{self.count} ({kind}) "
                                           f"with the ranks of this node {self.ranks}: {err}")
            raise self.broken from None
        if not done:
            self.broken = CommTimeoutError(
                f"shm transport on rank {self.rank}: timed out after {self.timeout:g} s in handshake "
                f"#{self.count} ({kind}) waiting for the ranks of this node {self.ranks}"
                f"{self._absent()} (did every rank enter the same collective, or allocate?)")
            raise self.broken
        odd = [i for i in range(self.n) if tuple(every[i, :2]) != (mine[0], mine[1])]
        if odd:
            i = odd[0]
            if every[i, 0] == CLOSE_CODE:   # its world's close gives the node's communicator back
                where = "has closed its communicator (close())"
            else:
                theirs = KINDS[every[i, 0]] if 0 <= every[i, 0] < len(KINDS) else f"kind {every[i, 0]}"
                where = f"is in handshake #{every[i, 1]} ({theirs})"
            self.broken = CommError(f"shm transport on rank {self.rank}: rank {self.ranks[i]} {where} while "
                                    f"this rank is in #{self.count} ({kind}): the ranks of a node must "
                                    f"allocate alike")
            raise self.broken
        return every[:, 2:]

    def agree(self, kind: str, failed: bool, *row: int) -> tuple:
        """(global ranks that failed, every rank's extra ``row`` fields)."""
        every = self.exchange(kind, [int(failed), *row])
        return [self.ranks[i] for i in np.flatnonzero(every[:, 0])], every[:, 1:]

    def _absent(self) -> str:
        if self.progress is None:
            return ""
        behind = [self.ranks[i] for i in range(self.n) if i != self.me and self.progress(i) < self.count]
        return f"; ranks {behind} have not reached it" if behind else ""
