"""One transport per peer: shared memory to ranks on this node, MPI to everyone else.

Algorithms see a single Transport; each call goes to the transport that serves its peer.
``describe()`` shows the choice ({peer: "shm" | "mpi"}), so tests and users can check that
ranks of one node really talk through shared memory.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .base import Transport


class RoutedTransport(Transport):
    name = "routed"

    def __init__(self, rank: int, size: int, routes: dict, transports: list):
        """``routes`` maps every peer (all ranks but ``rank``) to one of ``transports``."""
        self.rank, self.size = rank, size
        self.routes = routes
        self.transports = transports

    def isend(self, buf: np.ndarray, peer: int, tag: int):
        return self.routes[peer].isend(buf, peer, tag)

    def irecv(self, buf: np.ndarray, peer: int, tag: int):
        return self.routes[peer].irecv(buf, peer, tag)

    def irecv_reduce(self, buf, peer, tag, reduce, scratch):
        return self.routes[peer].irecv_reduce(buf, peer, tag, reduce, scratch)

    @contextlib.contextmanager
    def stage(self, flat: np.ndarray):
        # Staging nests: shared memory first, so MPI also sends from (and lands in) the segment.
        with contextlib.ExitStack() as stack:
            for t in self.transports:
                flat = stack.enter_context(t.stage(flat))
            yield flat

    def allocate(self, nbytes: int, dtype=np.uint8) -> np.ndarray:
        """Shared memory when a node transport can hand it out, else ordinary memory."""
        for t in self.transports:
            if hasattr(t, "allocate"):
                return t.allocate(nbytes, dtype)
        return np.empty(nbytes // np.dtype(dtype).itemsize, dtype)

    def describe(self) -> dict:
        return {peer: t.name for peer, t in sorted(self.routes.items())}

    def abort(self, reason: BaseException) -> None:
        for t in self.transports:
            t.abort(reason)

    def close(self) -> None:
        for t in self.transports:
            t.close()
