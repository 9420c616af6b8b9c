"""broadcast(x, root): every rank's x becomes root's x.

Vector: x. Bus bandwidth factor 1 (nccl-tests). Rooted: every rank waits for the confirmation
barrier, so a rank that disagrees makes every rank raise rather than some return normally.
MPI: MPI_Ibcast. torch.distributed: ProcessGroup.broadcast.
"""
from __future__ import annotations

from .base import Call, Collective, buffer, root_of


class Broadcast(Collective):
    name = "broadcast"
    code = 1
    rooted = True

    def bus_factor(self, size):
        return 1.0

    def prepare(self, comm, x, root=0) -> Call:
        xb = buffer(x, self.name, "x")   # read and written, as MPI_Bcast's buffer is (not const)
        root = root_of(self.name, root, comm.size)
        return Call(self, xb, None, dtype=xb.dtype, count=xb.numel, result=x, root=root)

    def reference(self, inputs, root=0):
        return [inputs[root]] * len(inputs)

    def mpi(self, backend, call):
        inp, _ = call.arrays()
        return backend.world.Ibcast([inp, backend.datatype(call.dtype)], call.root), inp

    def c10d(self, backend, call):
        inp, _ = call.arrays()
        return backend.pg.broadcast([backend.tensor(inp, call.dtype)], backend.broadcast_options(call.root)), None
