"""ringcomm.init(): a Communicator for the current mpirun job."""
from __future__ import annotations

import os
from typing import Optional

from .communicator import DEFAULT_TIMEOUT, Communicator


def init(backend: Optional[str] = None, *, timeout: Optional[float] = None) -> Communicator:
    """Join the job launched by ``mpirun -n N``: no MASTER_ADDR, no torchrun."""
    from mpi4py import MPI

    from .topology import discover
    from .transport import factory
    backend = backend or os.environ.get("RINGCOMM_BACKEND", "ringcomm")
    if timeout is None:
        timeout = float(os.environ.get("RINGCOMM_TIMEOUT", DEFAULT_TIMEOUT))
    if backend != "ringcomm":
        raise ValueError(f'init got unexpected value for argument "backend" (expected "ringcomm", got {backend!r})')
    world = MPI.COMM_WORLD.Dup()
    topology = discover(world)
    return Communicator(factory.build(world, topology), timeout=timeout, local_rank=topology.local_rank,
                        local_size=topology.local_size, node_count=topology.node_count,
                        topology=topology)
