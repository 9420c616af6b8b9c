"""scatter(out, x, root=0): rank r's out becomes block r of root's x.

Root's x holds size equal blocks (x only on root, None elsewhere); every rank's out has one block's
elements. In place (MPI_IN_PLACE) when root's out is exactly root's block of its x: it holds its
result already, and what the algorithm writes for root lands in memory of its own (S/n bytes copied
there, which MPI's in-place scatter spares). Vector: out (count = its elements); bus bandwidth
factor (n-1)/n of root's whole x (nccl-tests). Rooted: ends with the confirmation barrier.
MPI: MPI_Iscatter. torch.distributed: ProcessGroup.scatter.
"""
from __future__ import annotations

import numpy as np

from ..errors import bad_value
from .base import Call, Collective, buffer, disjoint, elements, is_block, root_of, same_kind, set_aside


class Scatter(Collective):
    name = "scatter"
    code = 8
    rooted = True

    def bus_factor(self, size):
        return (size - 1) / size if size > 1 else 0.0

    def nbytes(self, call, size):
        # The scattered size (a rank's block times the ranks), which every scatter algorithm's
        # cost is written in; priced on a block, each ran its crossovers at n times the size.
        return super().nbytes(call, size) * size

    def prepare(self, comm, out, x, root=0) -> Call:
        ob = buffer(out, self.name, "out")
        root = root_of(self.name, root, comm.size)
        if comm.rank != root:
            if x is not None:
                raise bad_value(self.name, "x", f"None on rank {comm.rank} (only root {root} sends)",
                                type(x).__name__)
            return Call(self, None, ob, dtype=ob.dtype, count=ob.numel, result=out, root=root, in_place=False)
        if x is None:
            raise bad_value(self.name, "x", f"an array of {comm.size * ob.numel} elements on root {root}", None)
        xb = buffer(x, self.name, "x", read_only=True)
        same_kind(self.name, ob, xb)
        elements(self.name, "x", xb, comm.size * ob.numel)
        if is_block(xb, ob, root * ob.numel):
            return Call(self, xb, set_aside(ob), dtype=ob.dtype, count=ob.numel, result=out, root=root,
                        in_place=False)
        disjoint(self.name, ob, xb)
        return Call(self, xb, ob, dtype=ob.dtype, count=ob.numel, result=out, root=root, in_place=False)

    def reference(self, inputs, root=0):
        """``inputs[root]`` is root's whole x; other entries are ignored."""
        n = len(inputs)
        m = inputs[root].size // n
        return [np.asarray(inputs[root][r * m:(r + 1) * m]) for r in range(n)]

    def mpi(self, backend, call):
        dt = backend.datatype(call.dtype)
        inp, out = call.arrays()
        send = [inp, dt] if backend.rank == call.root else None
        return backend.world.Iscatter(send, [out, dt], call.root), (inp, out)

    def c10d(self, backend, call):
        inp, out = call.arrays()
        t_out = backend.tensor(out, call.dtype)
        ins = []
        if backend.rank == call.root:
            t_in = backend.tensor(inp, call.dtype)
            ins = [[t_in[r * call.count:(r + 1) * call.count] for r in range(backend.size)]]
        return backend.pg.scatter([t_out], ins, backend.scatter_options(call.root)), None
