"""Build the transport a ringcomm Communicator runs over, from the MPI job and its topology.

``RINGCOMM_TRANSPORT`` chooses: ``auto`` (default) uses shared memory between ranks of one node
(per the topology, and actually on the same host) and MPI between nodes; ``mpi`` uses MPI for
every pair; ``shm`` is ``auto`` but fails at init unless every peer can be reached through
shared memory. ``describe(transport)`` says which transport serves each peer.
"""
from __future__ import annotations

import socket

from .. import env
from ..errors import UsageError
from ..topology import Topology
from .base import Transport

CHOICES = ("auto", "mpi", "shm")


def choice() -> str:
    return env.get("RINGCOMM_TRANSPORT")


def build(mpi_comm, topology: Topology, timeout: float = 300.0) -> Transport:
    """Collective over ``mpi_comm``: every rank calls it, with the same environment.
    ``timeout`` bounds every handshake of the transports' setup (the communicator's timeout)."""
    from .mpi import MPITransport
    from .routed import RoutedTransport
    mode = choice()
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    if mode == "mpi":
        return MPITransport(mpi_comm)
    # Pretend nodes (RINGCOMM_NODE_ID) split a host; a node id reused on two hosts must not
    # join them, so a shared-memory group is (topology node, real host).
    hosts = mpi_comm.allgather(socket.gethostname())
    group_of = [(topology.node_of[r], hosts[r]) for r in range(size)]
    local = [r for r in range(size) if group_of[r] == group_of[rank]]
    color = min(local)
    node_comm = mpi_comm.Split(color=color, key=rank)   # collective: every rank takes part
    if mode == "shm":
        remote = [r for r in range(size) if group_of[r] != group_of[rank]]
        if remote:
            node_comm.Free()
            raise UsageError(f"RINGCOMM_TRANSPORT=shm but ranks {remote} are not on the node of "
                             f"rank {rank}; use auto or mpi")
    if len(local) == 1:
        node_comm.Free()
        return MPITransport(mpi_comm)
    from .shm import ShmTransport
    shm = ShmTransport(node_comm, local, world_rank=rank, world_size=size, setup_timeout=timeout)
    if len(local) == size:
        return RoutedTransport(rank, size, {p: shm for p in range(size) if p != rank}, [shm], node=shm)
    mpi = MPITransport(mpi_comm)
    routes = {p: (shm if p in shm.local else mpi) for p in range(size) if p != rank}
    return RoutedTransport(rank, size, routes, [shm, mpi], node=shm)


def describe(transport: Transport) -> dict:
    """{peer: transport name} for every peer of this rank."""
    if hasattr(transport, "describe"):
        return transport.describe()
    return {p: transport.name for p in range(transport.size) if p != transport.rank}
