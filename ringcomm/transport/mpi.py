"""MPI point-to-point transport: mpi4py buffer-mode Isend/Irecv straight on the array's memory.

No pickling: the buffer protocol hands MPI the array's address. Waits poll ``Test`` so that they
can honour a deadline: spin briefly (a message is often already there), then back off with short
sleeps so that an oversubscribed node (4 ranks on 2 cores) still lets the sender run (polling.py).

Thread safety: requests are created and tested by whichever thread runs the collective (the
caller or the communicator's progress thread); ringcomm.init() asks MPI for
MPI_THREAD_MULTIPLE so that the application may use MPI from its own threads meanwhile.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import CommunicatorLimitError, MismatchError, UsageError
from .base import Request, Transport
from .polling import wait_polling

__all__ = ["MPIRequest", "MPIRecvRequest", "MPITransport", "new_communicator", "wait_polling"]


def new_communicator(make, what: str = ""):
    """``make()``, an MPI call that returns a new communicator, with MPI's refusal as a
    CommunicatorLimitError that says what to do: MPI holds a context id for every communicator
    until it is freed (MPICH has 2,048 per process). MPI refuses on every member alike (the
    members agree on the id), so no rank waits for one that failed.

    ringcomm frees only communicators nothing was ever sent on (``free_communicator``): MPI
    hands a freed one's id to a later communicator, and a message a peer sent to the freed one
    and nobody received (a failed collective, a send never received) then matches the later
    one's receive. That happened: a mismatch test's stale 64 MiB message truncated the next
    init's receive.
    ``what``: the call, for the error."""
    from mpi4py import MPI
    prefix = f"{what}: " if what else ""
    try:
        return make()
    except MPI.Exception as err:
        said = str(err).strip().splitlines()   # MPICH: an error stack, the reason last
        reason = said[-1].strip() if said else str(err)
        raise CommunicatorLimitError(
            f"{prefix}MPI could not make another communicator ({reason}): every init, and every split "
            f"or dup on the mpi, gloo and nccl backends or across nodes, holds one for the life of the "
            f"process (a freed one's stale messages could reach its successor); make fewer, reusing "
            f"communicators, and close() the ringcomm backend's splits within a node, which give "
            f"theirs back") from err


def free_communicator(comm) -> None:
    """MPI_Comm_free of a communicator this library made and never sent a message on (see
    ``new_communicator``)."""
    from mpi4py import MPI
    if comm != MPI.COMM_NULL:
        try:
            comm.Free()
        except MPI.Exception:
            pass   # already failed or finalized: nothing left to give back


class MPIRequest(Request):
    __slots__ = ("_req", "_done", "_transport")

    def __init__(self, req, transport: "MPITransport"):
        self._req, self._done, self._transport = req, False, transport

    def test(self) -> bool:
        if not self._done:
            self._done = self._req.Test()
        return self._done

    def wait(self, timeout: Optional[float]) -> bool:
        if self._done or self.test():   # small messages are usually done: skip the polling setup
            return True
        return wait_polling(self.test, timeout, self._transport.aborted_reason)

    def cancel(self) -> None:
        if not self._done:
            self._req.Cancel()


class MPIRecvRequest(MPIRequest):
    """A receive that checks the message's length: MPI silently accepts a shorter message."""
    __slots__ = ("_status", "_expect", "_peer")

    def __init__(self, req, transport: "MPITransport", nbytes: int, peer: int):
        super().__init__(req, transport)
        self._status, self._expect, self._peer = transport.new_status(), nbytes, peer

    def test(self) -> bool:
        if not self._done:
            try:
                self._done = self._req.Test(self._status)
            except Exception as err:   # MPI_ERR_TRUNCATE: the message is longer than the receive
                raise MismatchError(f"rank {self._transport.rank}: a message from rank {self._peer} does "
                                    f"not fit the receive of {self._expect} bytes "
                                    f"({str(err).splitlines()[0]})") from None
            if self._done:
                got = self._status.Get_count(self._transport.byte)
                if got != self._expect:
                    raise MismatchError(f"rank {self._transport.rank}: the message from rank {self._peer} "
                                        f"has {got} bytes, the receive expected {self._expect}")
        return self._done


class MPITransport(Transport):
    name = "mpi"

    def __init__(self, comm):
        from mpi4py import MPI
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._aborted: Optional[str] = None
        self._byte = self.byte = MPI.BYTE
        self.new_status = MPI.Status

    def _bytes(self, buf: np.ndarray):
        if not isinstance(buf, np.ndarray):   # a cupy array: this MPI cannot read device memory
            raise UsageError(f"the MPI transport carries host arrays only, got {type(buf).__module__}."
                             f"{type(buf).__name__}; CUDA tensors go over CUDA IPC within a node or "
                             f"the nccl backend across nodes")
        # [buf, BYTE] instead of a uint8 view: mpi4py takes ~2 us longer per call to parse a view.
        return [buf, self._byte]

    def isend(self, buf, peer, tag):
        return MPIRequest(self.comm.Isend(self._bytes(buf), dest=peer, tag=tag), self)

    def irecv(self, buf, peer, tag):
        return MPIRecvRequest(self.comm.Irecv(self._bytes(buf), source=peer, tag=tag), self, buf.nbytes, peer)

    def probe(self, source, tag=None, context=0, skip=0):
        from mpi4py import MPI
        status = MPI.Status()
        found = self.comm.Iprobe(source=MPI.ANY_SOURCE if source is None else source,
                                 tag=MPI.ANY_TAG if tag is None else tag, status=status)
        if not found or (tag is None and status.Get_tag() & skip):   # MPI shows only the earliest
            return None
        return status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)

    def split(self, members, color, key, context, slot=None):
        """A new MPI communicator (MPI_Comm_split: every rank of this one calls it): MPI's tags
        cannot carry a context id, an MPI communicator is one."""
        from mpi4py import MPI
        position = members.index(self.rank) if members is not None else 0
        sub = new_communicator(lambda: self.comm.Split(MPI.UNDEFINED if members is None else color, position))
        return None if members is None else MPITransport(sub)

    def group(self, members, context):
        """MPI_Comm_create_group: collective over ``members`` only; ``context`` (the same on every
        member) is its tag, so that groups created at once from other threads do not cross."""
        whole = self.comm.Get_group()
        chosen = whole.Incl(list(members))
        try:
            sub = new_communicator(lambda: self.comm.Create_group(chosen, tag=context % 32749))
        finally:
            chosen.Free()
            whole.Free()
        return MPITransport(sub)

    def aborted_reason(self) -> Optional[str]:
        return self._aborted

    def abort(self, reason: BaseException) -> None:
        self._aborted = f"aborted: {reason}"
