"""reduce(x, root, op, out=None): root ends with the reduction of every rank's x.

In place (out None) root's x becomes the result; out of place (out on root; None elsewhere) x is
left untouched everywhere. No rank's x changes except root's in place. Vector: x.
Bus bandwidth factor 1. Rooted: ends with the confirmation barrier.
MPI: MPI_Ireduce. torch.distributed: ProcessGroup.reduce.
"""
from __future__ import annotations

import numpy as np

from ..errors import bad_value
from .base import Call, Collective, buffer, disjoint, elements, reduce_reference, reduction, root_of, same_kind


class Reduce(Collective):
    name = "reduce"
    code = 2
    reduces = True
    rooted = True

    def bus_factor(self, size):
        return 1.0

    def prepare(self, comm, x, root=0, op="sum", out=None) -> Call:
        xb = buffer(x, self.name, "x")
        root = root_of(self.name, root, comm.size)
        op, factor = reduction(self.name, op, xb.dtype)
        mine = comm.rank == root
        if out is None or out is x:
            return Call(self, xb, None, dtype=xb.dtype, count=xb.numel, result=x, op=op, factor=factor,
                        root=root, writable=mine)
        if not mine:
            raise bad_value(self.name, "out", f"None on rank {comm.rank} (only root {root} receives the result)",
                            type(out).__name__)
        ob = buffer(out, self.name, "out")
        same_kind(self.name, ob, xb)
        elements(self.name, "out", ob, xb.numel)
        disjoint(self.name, ob, xb)
        return Call(self, xb, ob, dtype=xb.dtype, count=xb.numel, result=out, op=op, factor=factor, root=root,
                    in_place=False)

    def after(self, call, rank, size):
        if rank == call.root:   # elsewhere x is the caller's input, untouched
            super().after(call, rank, size)

    def reference(self, inputs, root=0, op="sum", dtype="float32", factor=1.0):
        """The root's result; other ranks' entries are their unchanged inputs."""
        out = list(inputs)
        out[root] = reduce_reference(inputs, op, dtype, factor)
        return out

    def mpi(self, backend, call):
        MPI, dt = backend.MPI, backend.datatype(call.dtype)
        inp, out = call.arrays()
        op = backend.mpi_op(call.op, call.dtype)
        if backend.rank != call.root:
            return backend.world.Ireduce([inp, dt], None, op, call.root), inp
        send = MPI.IN_PLACE if call.in_place else [inp, dt]
        return backend.world.Ireduce(send, [out, dt], op, call.root), (inp, out)

    def c10d(self, backend, call):
        inp, out = call.arrays()
        mine = backend.rank == call.root
        if mine:
            t = backend.tensor(out, call.dtype)
            if not call.in_place:
                t.copy_(backend.tensor(inp, call.dtype))
        else:   # gloo reduces in place on every rank: give it a copy, x must not change
            t = backend.tensor(np.array(inp, copy=True) if isinstance(inp, np.ndarray) else inp.copy(), call.dtype)
        return backend.pg.reduce([t], backend.reduce_options(call.op, call.root)), None
