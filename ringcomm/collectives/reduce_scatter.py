"""reduce_scatter(out, x, op, counts=None): rank r's out becomes part r of the reduction of
every rank's x.

Even: x holds size x out's elements, part r at r * len(out). Uneven: part r has ``counts[r]``
elements (every rank passes the same counts; out has counts[rank]). x is never changed; out may
be exactly this rank's part of x. Vector: x (count = x's elements). Bus bandwidth factor (n-1)/n.
MPI: MPI_Ireduce_scatter_block / MPI_Ireduce_scatter. torch.distributed: _reduce_scatter_base
(uneven: parts padded to the largest, as gloo reduces equal parts only).
"""
from __future__ import annotations

from ..core.buffers import address
from ..core.schedule import layout
from ..errors import bad_value
from .base import Call, Collective, buffer, counts_of, elements, reduce_reference, reduction, same_kind


class ReduceScatter(Collective):
    name = "reduce_scatter"
    code = 4
    reduces = True
    uneven = True

    def bus_factor(self, size):
        return (size - 1) / size if size > 1 else 0.0

    def prepare(self, comm, out, x, op="sum", counts=None) -> Call:
        xb, ob = buffer(x, self.name, "x", read_only=True), buffer(out, self.name, "out")
        same_kind(self.name, ob, xb)
        op, factor = reduction(self.name, op, xb.dtype)
        if counts is None:
            if xb.numel % comm.size:
                raise bad_value(self.name, "x", f"a multiple of {comm.size} elements (or pass counts=)",
                                f"{xb.numel} elements")
            elements(self.name, "out", ob, xb.numel // comm.size)
            parts, off = None, comm.rank * ob.numel
        else:
            parts = counts_of(self.name, "counts", counts, comm.size)
            elements(self.name, "x", xb, sum(parts))
            elements(self.name, "out", ob, parts[comm.rank])
            off = sum(parts[:comm.rank])
        if ob.device == xb.device == "cpu" and ob.numel and _overlaps(ob, xb) and \
                address(ob.flat) != address(xb.flat[off:off + ob.numel]):
            raise bad_value(self.name, "out", "memory apart from x, or exactly this rank's part of x",
                            "an array overlapping x elsewhere")
        return Call(self, xb, ob, dtype=xb.dtype, count=xb.numel, result=out, op=op, factor=factor,
                    counts=parts, in_place=False)

    def reference(self, inputs, op="sum", dtype="float32", factor=1.0, counts=None):
        whole = reduce_reference(inputs, op, dtype, factor)
        n = len(inputs)
        if counts is None:
            m = whole.size // n
            return [whole[r * m:(r + 1) * m] for r in range(n)]
        offs = [sum(counts[:r]) for r in range(n)]
        return [whole[offs[r]:offs[r] + counts[r]] for r in range(n)]

    def mpi(self, backend, call):
        dt = backend.datatype(call.dtype)
        inp, out = call.arrays()
        op = backend.mpi_op(call.op, call.dtype)
        if out is not None and _aliases(out, inp):   # MPI forbids aliasing send and receive buffers
            inp = inp.copy()
        if call.counts is None:
            return backend.world.Ireduce_scatter_block([inp, dt], [out, dt], op), (inp, out)
        return backend.world.Ireduce_scatter([inp, dt], [out, dt], list(call.counts), op), (inp, out)

    def c10d(self, backend, call):
        inp, out = call.arrays()
        t_in = backend.tensor(inp, call.dtype)
        if _aliases(out, inp):
            t_in = t_in.clone()
        t_out = backend.tensor(out, call.dtype)
        opts = backend.reduce_scatter_options(call.op)
        if call.counts is None or len(set(call.counts)) == 1:
            return backend.pg._reduce_scatter_base(t_out, t_in, opts), None
        # Equal parts only in torch's gloo: every part padded to the largest, the padding reduced too.
        top = max(call.counts)
        padded = t_in.new_zeros(top * backend.size)
        for r, (o, c) in enumerate(layout(call.shape(backend.size, 1))):
            padded[r * top:r * top + c] = t_in[o:o + c]
        mine = t_out.new_zeros(top)
        handle = backend.pg._reduce_scatter_base(mine, padded, opts)

        def finish():
            t_out.copy_(mine[:t_out.numel()])
        return handle, finish


def _overlaps(a, b) -> bool:
    import numpy as np
    return bool(np.shares_memory(a.flat, b.flat))


def _aliases(a, b) -> bool:
    import numpy as np
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and bool(np.shares_memory(a, b))
