"""Who is on which node, and so which transport connects two ranks.

A node is identified by its hostname, or by ``RINGCOMM_NODE_ID`` when set, so that one machine
can pretend to be several nodes (traffic between pretend nodes then goes over MPI, as it would
between real ones).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from . import env


@dataclass(frozen=True)
class Topology:
    rank: int
    node_of: tuple   # node index (0..node_count-1, in order of first appearance) of every rank

    @property
    def size(self) -> int:
        return len(self.node_of)

    @property
    def node(self) -> int:
        return self.node_of[self.rank]

    @property
    def node_count(self) -> int:
        return len(set(self.node_of))

    @property
    def local_ranks(self) -> tuple:
        """Global ranks on this rank's node, in rank order."""
        return tuple(r for r, n in enumerate(self.node_of) if n == self.node)

    @property
    def local_rank(self) -> int:
        return self.local_ranks.index(self.rank)

    @property
    def local_size(self) -> int:
        return len(self.local_ranks)

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of[a] == self.node_of[b]

    @classmethod
    def from_names(cls, rank: int, names) -> "Topology":
        index: dict = {}
        return cls(rank, tuple(index.setdefault(name, len(index)) for name in names))


def node_name() -> str:
    return env.get("RINGCOMM_NODE_ID") or socket.gethostname()


def discover(mpi_comm) -> Topology:
    """Every rank learns every rank's node (one small allgather at init)."""
    return Topology.from_names(mpi_comm.Get_rank(), mpi_comm.allgather(node_name()))


def last_level_cache(cpu: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Bytes of the largest cache this machine's first CPU reports (its last level: shared by the
    cores of one socket or chiplet on the machines this runs on), or 0 where the system does not
    say (not Linux, a container hiding sysfs) or says something unreadable. The cost model prices
    copies from cache with it."""
    best = 0
    try:
        for index in os.listdir(cpu):
            if not index.startswith("index"):
                continue
            with open(os.path.join(cpu, index, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG") or 0) * scale)
    except (OSError, ValueError):   # half an answer is no answer
        return 0
    return best
