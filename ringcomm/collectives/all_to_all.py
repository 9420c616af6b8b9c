"""all_to_all(out, x, out_splits=None, in_splits=None): rank r sends block j of x to rank j and
receives block r of every rank's x into out, in rank order.

Even (no splits): x and out hold size equal blocks. Uneven, like torch's all_to_all_single:
``in_splits[j]`` elements of x go to rank j, ``out_splits[j]`` elements of out come from rank j
(zeros allowed; what rank i sends to j must equal what j expects from i, or both raise
MismatchError: message lengths are checked). Pass splits on every rank or on none. x is never
changed, except in place (MPI_IN_PLACE's form): out is x itself, which is then read from a copy
taken as the call starts (x's S bytes copied once more). Vector: x (count = its elements).
Bus bandwidth factor (n-1)/n (nccl-tests). MPI: MPI_Ialltoallv. torch.distributed:
ProcessGroup.alltoall_base.
"""
from __future__ import annotations

import numpy as np

from ..core.schedule import chunk
from ..errors import bad_value
from .base import Call, Collective, buffer, counts_of, disjoint, elements, is_block, same_kind, set_aside


class AllToAll(Collective):
    name = "all_to_all"
    code = 6
    uneven = True

    def bus_factor(self, size):
        return (size - 1) / size if size > 1 else 0.0

    def prepare(self, comm, out, x, out_splits=None, in_splits=None) -> Call:
        xb, ob = buffer(x, self.name, "x", read_only=True), buffer(out, self.name, "out")
        same_kind(self.name, ob, xb)
        n = comm.size
        sends = self._splits(in_splits, "in_splits", xb, n)
        recvs = self._splits(out_splits, "out_splits", ob, n)
        elements(self.name, "x", xb, sum(sends))
        elements(self.name, "out", ob, sum(recvs))
        if in_splits is None and out_splits is None and ob.numel != xb.numel:
            # Blocks of x's size / n go out and out's size / n come in: ranks could never agree.
            raise bad_value(self.name, "out", f"{xb.numel} elements, as many as x (or pass out_splits=)",
                            f"{ob.numel} elements")
        same = ob.numel == xb.numel and is_block(ob, xb, 0)
        if not same:
            disjoint(self.name, ob, xb)
        me = comm.rank
        if sends[me] != recvs[me]:   # the block a rank sends itself: its own two lists must agree
            raise bad_value(self.name, "out_splits", f"out_splits[{me}] equal to in_splits[{me}] = {sends[me]} "
                            f"(the block rank {me} sends itself)", recvs[me])
        # In place (out is x): x is read from a copy taken as the call starts (before)
        inp = set_aside(xb) if same else xb
        call = Call(self, inp, ob, dtype=xb.dtype, count=xb.numel, result=out, counts=sends,
                    recv_counts=recvs, in_place=False)
        call.uneven = in_splits is not None or out_splits is not None
        if same:
            call.snapshot = (inp.flat, xb.flat)
        return call

    def _splits(self, splits, argument: str, buf, n: int) -> tuple:
        if splits is not None:
            return counts_of(self.name, argument, splits, n)
        if buf.numel % n:
            raise bad_value(self.name, "x" if argument == "in_splits" else "out",
                            f"a multiple of {n} elements (or pass {argument}=)", f"{buf.numel} elements")
        return (buf.numel // n,) * n

    def is_uneven(self, call):
        # Whether splits were passed, not whether they differ: that is what every rank agrees on
        # (each knows only its own row of the split matrix), so every rank picks the same algorithm.
        return call.uneven

    def nbytes(self, call, size):
        # The selector must pick the same algorithm on every rank, but the ranks of an uneven call
        # agree on no size (each knows its own row of the split matrix): it is priced as empty.
        return 0 if call.uneven else super().nbytes(call, size)

    def window_word(self, call):
        # Each rank's splits are its own row of the split matrix and differ by design; a direct
        # round checks every block's length against what its receiver expects instead.
        return int(call.uneven)

    def envelope_count(self, call):
        # What the ranks agree on: the block of an even call; uneven calls differ per rank, and
        # there the message lengths (checked on every receive) catch disagreements.
        return 0 if call.uneven else call.counts[0]

    def reference(self, inputs, in_splits=None):
        """``in_splits[i]``: the splits rank i used (None: even)."""
        n = len(inputs)
        splits = in_splits or [tuple(chunk(x.size, n, j)[1] for j in range(n)) for x in inputs]
        offs = [np.cumsum((0,) + tuple(s))[:-1] for s in splits]
        return [np.concatenate([inputs[i][offs[i][r]:offs[i][r] + splits[i][r]] for i in range(n)])
                for r in range(n)]

    def mpi(self, backend, call):
        dt = backend.datatype(call.dtype)
        inp, out = call.arrays()
        sdispls = np.cumsum((0,) + call.counts)[:-1].tolist()
        rdispls = np.cumsum((0,) + call.recv_counts)[:-1].tolist()
        return backend.world.Ialltoallv([inp, (list(call.counts), sdispls), dt],
                                        [out, (list(call.recv_counts), rdispls), dt]), (inp, out)

    def c10d(self, backend, call):
        inp, out = call.arrays()
        return backend.pg.alltoall_base(backend.tensor(out, call.dtype), backend.tensor(inp, call.dtype),
                                        list(call.recv_counts), list(call.counts),
                                        backend.all_to_all_options()), None
