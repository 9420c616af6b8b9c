"""send(x, dst, tag=0) and recv(out, src, tag=0): point-to-point messages between two ranks.

Not collectives (no sequence number: other ranks take no part), but calls of the same kind that
own their validation and their reference-backend mapping like the collectives do. Messages
between one pair under one tag arrive in the order they were sent (MPI's rule); a receive of
another length or dtype than the message raises MismatchError on the receiver (never a truncated
or reinterpreted buffer). ``src=None`` receives from any rank; the sender is then ``Work.source``
(and a blocking call returns ``(out, source)``). Bus bandwidth factor 1.
MPI: MPI_Isend / MPI_Irecv. torch.distributed: ProcessGroup.send / recv / recv_anysource.
"""
from __future__ import annotations

import numpy as np

from ..core.envelope import USER_TAG_LIMIT
from ..errors import bad_type, bad_value
from .base import Call, Collective, buffer, rank_of


def _tag(collective: str, tag) -> int:
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
        raise bad_type(collective, "tag", "an int", type(tag).__name__)
    if not 0 <= tag < USER_TAG_LIMIT:
        raise bad_value(collective, "tag", f"an int in [0, {USER_TAG_LIMIT - 1}]", int(tag))
    return int(tag)


def _peer(collective: str, argument: str, peer, comm) -> int:
    peer = rank_of(collective, argument, peer, comm.size)
    if peer == comm.rank:
        raise bad_value(collective, argument, f"a rank other than this one ({comm.rank})", peer)
    return peer


class Send(Collective):
    name = "send"
    code = 9

    def bus_factor(self, size):
        return 1.0

    def prepare(self, comm, x, dst, tag=0) -> Call:
        xb = buffer(x, self.name, "x", read_only=True)
        # in_place=False: the input is only read (a remembered send neither marks a tensor written
        # nor asks a numpy array to be writable)
        call = Call(self, xb, None, dtype=xb.dtype, count=xb.numel, result=None, in_place=False)
        call.peer, call.tag = _peer(self.name, "dst", dst, comm), _tag(self.name, tag)
        return call

    def mpi(self, backend, call):
        inp, _ = call.arrays()
        return backend.world.Isend([inp, backend.datatype(call.dtype)], call.peer, call.tag), inp

    def c10d(self, backend, call):
        inp, _ = call.arrays()
        return backend.pg.send([backend.tensor(inp, call.dtype)], call.peer, call.tag), None


class Recv(Collective):
    name = "recv"
    code = 10

    def bus_factor(self, size):
        return 1.0

    def prepare(self, comm, out, src, tag=0) -> Call:
        ob = buffer(out, self.name, "out")
        call = Call(self, None, ob, dtype=ob.dtype, count=ob.numel, result=out, in_place=False)
        call.peer = None if src is None else _peer(self.name, "src", src, comm)
        call.tag = _tag(self.name, tag)
        return call

    def mpi(self, backend, call):
        _, out = call.arrays()
        source = backend.MPI.ANY_SOURCE if call.peer is None else call.peer
        return backend.world.Irecv([out, backend.datatype(call.dtype)], source, call.tag), out

    def c10d(self, backend, call):
        _, out = call.arrays()
        t = backend.tensor(out, call.dtype)
        if call.peer is None:
            return backend.pg.recv_anysource([t], call.tag), None
        return backend.pg.recv([t], call.peer, call.tag), None
