"""Build the transport a ringcomm Communicator runs over, from the MPI job and its topology."""
from __future__ import annotations

from ..topology import Topology
from .base import Transport


def build(mpi_comm, topology: Topology) -> Transport:
    from .mpi import MPITransport
    return MPITransport(mpi_comm)
