"""all_gather(out, x, counts=None): every rank's out becomes the concatenation of every rank's x.

Even: out holds size x x's elements, part r at r * len(x). Uneven: ``counts[r]`` elements from
rank r (every rank passes the same counts; x has counts[rank] elements; zeros allowed). In place
when x is exactly this rank's part of out. Vector: out (count = out's elements).
Bus bandwidth factor (n-1)/n. MPI: MPI_Iallgather / MPI_Iallgatherv. torch.distributed:
ProcessGroup._allgather_base (uneven: every part padded to the largest, as gloo gathers equal
sizes only).
"""
from __future__ import annotations

import numpy as np

from ..core.schedule import layout
from .base import Call, Collective, buffer, counts_of, disjoint, elements, is_block, same_kind


class AllGather(Collective):
    name = "all_gather"
    code = 3
    uneven = True

    def bus_factor(self, size):
        return (size - 1) / size if size > 1 else 0.0

    def prepare(self, comm, out, x, counts=None) -> Call:
        xb, ob = buffer(x, self.name, "x", read_only=True), buffer(out, self.name, "out")
        same_kind(self.name, ob, xb)
        if counts is None:
            elements(self.name, "out", ob, comm.size * xb.numel)
            parts = None
            off = comm.rank * xb.numel
        else:
            parts = counts_of(self.name, "counts", counts, comm.size)
            elements(self.name, "x", xb, parts[comm.rank])
            elements(self.name, "out", ob, sum(parts))
            off = sum(parts[:comm.rank])
        in_place = is_block(ob, xb, off)
        if not in_place:
            disjoint(self.name, ob, xb)
        return Call(self, xb if not in_place else ob, ob, dtype=xb.dtype, count=ob.numel, result=out,
                    counts=parts, in_place=in_place)

    def reference(self, inputs, counts=None):
        whole = np.concatenate(inputs)
        return [whole] * len(inputs)

    def mpi(self, backend, call):
        MPI, dt = backend.MPI, backend.datatype(call.dtype)
        inp, out = call.arrays()
        world = backend.world
        if call.counts is None:
            send = MPI.IN_PLACE if call.in_place else [inp, dt]
            return world.Iallgather(send, [out, dt]), (inp, out)
        counts = list(call.counts)
        displs = [o for o, _ in layout(call.shape(backend.size, 1))]
        send = MPI.IN_PLACE if call.in_place else [inp, dt]
        return world.Iallgatherv(send, [out, (counts, displs), dt]), (inp, out)

    def c10d(self, backend, call):
        inp, out = call.arrays()
        rank, size = backend.rank, backend.size
        parts = layout(call.shape(size, 1))
        off, n = parts[rank]
        t_out = backend.tensor(out, call.dtype)
        # the input must not alias the output: gloo reads it while it writes the gathered tensor
        t_in = backend.tensor(inp, call.dtype)[off:off + n].clone() if call.in_place else backend.tensor(inp, call.dtype)
        if call.counts is None or len(set(call.counts)) == 1:
            return backend.pg._allgather_base(t_out, t_in), None
        # torch's gloo gathers equal sizes only: every part padded to the largest, then unpadded.
        top = max(call.counts)
        padded = t_out.new_zeros(top * size)
        mine = t_out.new_zeros(top)
        mine[:n] = t_in
        handle = backend.pg._allgather_base(padded, mine)

        def finish():
            for r, (o, c) in enumerate(parts):
                t_out[o:o + c] = padded[r * top:r * top + c]
        return handle, finish
