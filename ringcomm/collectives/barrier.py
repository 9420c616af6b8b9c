"""barrier(): no rank leaves before every rank has entered.

No vector. MPI: MPI_Ibarrier. torch.distributed: ProcessGroup.barrier.
"""
from __future__ import annotations

from .base import Call, Collective


class Barrier(Collective):
    name = "barrier"
    code = 5

    def bus_factor(self, size):
        return 0.0

    def prepare(self, comm) -> Call:
        return Call(self, None, None, dtype=None, count=0)

    def reference(self, inputs):
        return [None] * len(inputs)

    def mpi(self, backend, call):
        return backend.world.Ibarrier(), None

    def c10d(self, backend, call):
        return backend.pg.barrier(backend.barrier_options()), None
