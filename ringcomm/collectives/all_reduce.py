"""all_reduce(x, op, out=None): every rank ends with the reduction of every rank's x.

In place (out None) x becomes the result; out of place x is left untouched and out receives it.
Vector: x (count = x's elements). Bus bandwidth factor 2(n-1)/n (nccl-tests).
MPI: MPI_Iallreduce. torch.distributed: ProcessGroup.allreduce (on out, after copying x there).
"""
from __future__ import annotations

from .base import Call, Collective, buffer, disjoint, elements, reduce_reference, reduction, same_kind


class AllReduce(Collective):
    name = "all_reduce"
    code = 0
    reduces = True

    def bus_factor(self, size):
        return 2 * (size - 1) / size if size > 1 else 0.0

    def prepare(self, comm, x, op="sum", out=None) -> Call:
        xb = buffer(x, self.name, "x", read_only=out is not None and out is not x)
        op, factor = reduction(self.name, op, xb.dtype)
        if out is None or out is x:
            return Call(self, xb, None, dtype=xb.dtype, count=xb.numel, result=x, op=op, factor=factor,
                        writable=True)
        ob = buffer(out, self.name, "out")
        same_kind(self.name, ob, xb)
        elements(self.name, "out", ob, xb.numel)
        disjoint(self.name, ob, xb)
        return Call(self, xb, ob, dtype=xb.dtype, count=xb.numel, result=out, op=op, factor=factor,
                    in_place=False)

    def reference(self, inputs, op="sum", dtype="float32", factor=1.0):
        result = reduce_reference(inputs, op, dtype, factor)
        return [result] * len(inputs)

    def mpi(self, backend, call):
        MPI, dt = backend.MPI, backend.datatype(call.dtype)
        inp, out = call.arrays()
        send = MPI.IN_PLACE if call.in_place else [inp, dt]
        return backend.world.Iallreduce(send, [out, dt], backend.mpi_op(call.op, call.dtype)), (inp, out)

    def c10d(self, backend, call):
        inp, out = call.arrays()
        t = backend.tensor(out, call.dtype)
        if not call.in_place:
            t.copy_(backend.tensor(inp, call.dtype))
        return backend.pg.allreduce([t], backend.allreduce_options(call.op)), None
