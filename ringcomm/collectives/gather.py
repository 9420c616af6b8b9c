"""gather(out, x, root=0): root's out becomes the concatenation of every rank's x, in rank order.

Every rank's x has the same number of elements; out (size x that many) only on root, None
elsewhere. x is never changed. In place (MPI_IN_PLACE) when root's x is exactly root's block of its
out: root's block is then read from a copy taken as the call starts, so that no algorithm reads and
writes one memory (S/n bytes copied at the root, which MPI's in-place gather spares). Vector: x on
each rank (count = its elements); bus bandwidth factor (n-1)/n of the gathered size (nccl-tests).
Rooted: ends with the confirmation barrier.
MPI: MPI_Igather. torch.distributed: ProcessGroup.gather.
"""
from __future__ import annotations

import numpy as np

from ..errors import bad_value
from .base import Call, Collective, buffer, disjoint, elements, is_block, root_of, same_kind, set_aside


class Gather(Collective):
    name = "gather"
    code = 7
    rooted = True

    def bus_factor(self, size):
        return (size - 1) / size if size > 1 else 0.0

    def nbytes(self, call, size):
        # The gathered size (a rank's block times the ranks), which every gather algorithm's
        # cost is written in; priced on a block, each ran its crossovers at n times the size.
        return super().nbytes(call, size) * size

    def prepare(self, comm, out, x, root=0) -> Call:
        xb = buffer(x, self.name, "x", read_only=True)
        root = root_of(self.name, root, comm.size)
        if comm.rank != root:
            if out is not None:
                raise bad_value(self.name, "out", f"None on rank {comm.rank} (only root {root} receives)",
                                type(out).__name__)
            return Call(self, xb, None, dtype=xb.dtype, count=xb.numel, result=None, root=root, in_place=False)
        if out is None:
            raise bad_value(self.name, "out", f"an array of {comm.size * xb.numel} elements on root {root}", None)
        ob = buffer(out, self.name, "out")
        same_kind(self.name, ob, xb)
        elements(self.name, "out", ob, comm.size * xb.numel)
        if is_block(ob, xb, root * xb.numel):
            aside = set_aside(xb)
            call = Call(self, aside, ob, dtype=xb.dtype, count=xb.numel, result=out, root=root, in_place=False)
            call.snapshot = (aside.flat, xb.flat)
            return call
        disjoint(self.name, ob, xb)
        return Call(self, xb, ob, dtype=xb.dtype, count=xb.numel, result=out, root=root, in_place=False)

    def reference(self, inputs, root=0):
        out = [None] * len(inputs)
        out[root] = np.concatenate(inputs)
        return out

    def mpi(self, backend, call):
        dt = backend.datatype(call.dtype)
        inp, out = call.arrays()
        recv = [out, dt] if backend.rank == call.root else None
        return backend.world.Igather([inp, dt], recv, call.root), (inp, out)

    def c10d(self, backend, call):
        inp, out = call.arrays()
        t_in = backend.tensor(inp, call.dtype)
        outs = []
        if backend.rank == call.root:
            t_out = backend.tensor(out, call.dtype)
            outs = [[t_out[r * call.count:(r + 1) * call.count] for r in range(backend.size)]]
        return backend.pg.gather(outs, [t_in], backend.gather_options(call.root)), None
