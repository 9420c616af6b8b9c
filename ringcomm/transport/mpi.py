"""MPI point-to-point transport: mpi4py buffer-mode Isend/Irecv straight on the array's memory.

No pickling: the buffer protocol hands MPI the array's address. Waits poll ``Test`` so that they
can honour a deadline: spin briefly (a message is often already there), then back off with short
sleeps so that an oversubscribed node (4 ranks on 2 cores) still lets the sender run (polling.py).

Thread safety: requests are created and tested by whichever thread runs the collective (the
caller or the communicator's progress thread); ringcomm.init() asks MPI for
MPI_THREAD_MULTIPLE so that the application may use MPI from its own threads meanwhile.
"""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np

from ..core.envelope import ABORT_TAG, CLOSE_CODE
from ..errors import CommunicatorLimitError, MismatchError, UsageError
from .base import Request, Transport
from .polling import wait_polling

__all__ = ["Ledger", "MPIRequest", "MPIRecvRequest", "MPITransport", "collect_retired", "new_communicator",
           "retire_communicator",
           "wait_polling"]


def new_communicator(make, what: str = ""):
    """``make()``, an MPI call that returns a new communicator, with MPI's refusal as a
    CommunicatorLimitError that says what to do: MPI holds a context id for every communicator
    until it is freed (MPICH has 2,048 per process). MPI refuses on every member alike (the
    members agree on the id), so no rank waits for one that failed.

    MPI hands a freed communicator's id to a later communicator, and a message a peer sent to
    the freed one and nobody received (a failed collective, a send never received) then matches
    the later one's receive. That happened: a mismatch test's stale 64 MiB message truncated the
    next init's receive. So ringcomm frees a communicator that carried messages only once its
    members agree that nothing sent on it is left unreceived (``retire_communicator``), and one
    nothing was ever sent on at once (``free_communicator``).
    ``what``: the call, for the error."""
    from mpi4py import MPI
    prefix = f"{what}: " if what else ""
    collect_retired()
    try:
        return make()
    except MPI.Exception as err:
        said = str(err).strip().splitlines()   # MPICH: an error stack, the reason last
        reason = said[-1].strip() if said else str(err)
        raise CommunicatorLimitError(
            f"{prefix}MPI could not make another communicator ({reason}): every init, every split or "
            f"dup across nodes, and every split or dup on the mpi, gloo and nccl backends holds one "
            f"until every member has closed it (an init: with its sub-communicators) cleanly and "
            f"nothing sent on it is left unreceived (a freed one's stale messages could reach its "
            f"successor); make fewer, reusing communicators, and close() inits, splits and dups "
            f"once done with them") from err


_retiring: list = []   # (communicator, its exchange's request, the buffers MPI writes)
_retiring_lock = threading.Lock()


def retire_communicator(comm, sent: list, received: list) -> None:
    """Give ``comm`` back to MPI once every member has retired it and nothing sent on it is left
    unreceived: ``sent[j]`` messages this rank sent to rank j on it (counted when posted),
    ``received[j]`` it received from j (counted when complete). Each member calls this as its
    last call on ``comm``, only if nothing failed or is still in flight there; the members' counts
    travel in a nonblocking allgather, so closing waits for nobody, and the first
    ``collect_retired`` that finds the exchange done frees ``comm`` if for every pair what one
    sent the other received. A member that never retires it (gone, or its communicator broke)
    leaves it held, as a send nobody received does. Each row leads with CLOSE_CODE: where a
    member timed out in a collective the others never entered (an erroneous program), their
    exchange pairs with its pre-flight allgather, whose row leads with that collective's code, so
    nobody frees, and that member's MismatchError says the others have close()."""
    from mpi4py import MPI
    n = comm.Get_size()
    row = np.array([CLOSE_CODE, *sent, *received], np.int64)
    rows = np.zeros(n * row.size, np.int64)
    try:
        request = comm.Iallgather(row, rows)
    except MPI.Exception:
        return   # MPI refused: the communicator stays, as before
    with _retiring_lock:
        _retiring.append((comm, request, row, rows))
    collect_retired()


class Ledger:
    """The messages one MPI communicator carried point to point, counted by every user of it
    (init's exchanges, the transports over it), for ``retire_communicator``: ``sent[j]`` to rank
    j, counted when posted, and ``received[j]`` from j, counted when complete or when a posted
    receive stands for it (MPI matches a posted receive in order, so no later communicator can
    get that message, and MPI_Comm_free lets it finish)."""
    __slots__ = ("comm", "sent", "received")

    def __init__(self, comm, size: Optional[int] = None):
        self.comm = comm
        n = comm.Get_size() if size is None else size
        self.sent, self.received = [0] * n, [0] * n

    def merge(self, other: "Ledger") -> None:
        """Take ``other``'s counts of the same communicator in, in place (the lists stay those
        the users hold)."""
        for j, (sent, received) in enumerate(zip(other.sent, other.received)):
            self.sent[j] += sent
            self.received[j] += received

    def retire(self) -> None:
        """``retire_communicator`` with these counts; at most once."""
        comm, self.comm = self.comm, None
        if comm is not None:
            retire_communicator(comm, self.sent, self.received)


def collect_retired() -> int:
    """Free the retiring communicators whose exchange is done and balanced; how many were freed.
    Each test also moves MPI's progress along, so the exchanges finish as later calls come."""
    freed = 0
    with _retiring_lock:
        for item in list(_retiring):
            comm, request, _, rows = item
            try:
                if not request.Test():
                    continue
            except Exception:   # the communicator failed under the exchange: it stays held
                _retiring.remove(item)
                continue
            _retiring.remove(item)
            n = comm.Get_size()
            rows = rows.reshape(n, 1 + 2 * n)
            counts = rows[:, 1:].reshape(n, 2, n)   # [rank i][sent, received][rank j]
            if (rows[:, 0] == CLOSE_CODE).all() and np.array_equal(counts[:, 0, :], counts[:, 1, :].T):
                free_communicator(comm)
                freed += 1
    return freed


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
                self._transport.received[self._peer] += 1
                got = self._status.Get_count(self._transport.byte)
                if got != self._expect:
                    raise MismatchError(f"rank {self._transport.rank}: the message from rank {self._peer} "
                                        f"has {got} bytes, the receive expected {self._expect}")
        return self._done


class MPITransport(Transport):
    name = "mpi"

    def __init__(self, comm, own: bool = False, ledger: Optional[Ledger] = None):
        """``own``: ``comm`` was made for this transport (a split), and ``retire`` gives it back.
        ``ledger``: where the communicator's other users count their messages (init's)."""
        from mpi4py import MPI
        self.comm, self.own = comm, own
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._aborted: Optional[str] = None
        self._gave_up: Optional[str] = None   # a peer's abort notice, once read (aborted_reason)
        self._reading = False                 # aborted_reason is reading a notice (its wait asks again)
        self._byte = self.byte = MPI.BYTE
        self.new_status = MPI.Status
        self.ledger = Ledger(comm, self.size) if ledger is None else ledger
        self.sent, self.received = self.ledger.sent, self.ledger.received   # counted in the hot path

    def _bytes(self, buf: np.ndarray):
        if not isinstance(buf, np.ndarray):   # a cupy array: this MPI cannot read device memory
            raise UsageError(f"the MPI transport carries host arrays only, got {type(buf).__module__}."
                             f"{type(buf).__name__}; CUDA tensors go over CUDA IPC within a node or "
                             f"the nccl backend across nodes")
        # [buf, BYTE] instead of a uint8 view: mpi4py takes ~2 us longer per call to parse a view.
        return [buf, self._byte]

    def isend(self, buf, peer, tag):
        request = MPIRequest(self.comm.Isend(self._bytes(buf), dest=peer, tag=tag), self)
        self.sent[peer] += 1
        return request

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
        return None if members is None else MPITransport(sub, own=True)

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
        return MPITransport(sub, own=True)

    def retire(self) -> None:
        if self.own:
            self.own = False
            self.ledger.retire()

    def aborted_reason(self) -> Optional[str]:
        """Why waits here must stop: this rank aborted the transport, or a peer's abort notice
        (Communicator._fail) came, read and kept. Asked only while a wait sleeps: the reference
        backends' waits then end as the peer gives up, not at their own timeout. Reading the
        notice waits on a request, whose sleeps ask this again: ``_reading`` ends that there."""
        if self._aborted is None and self._gave_up is None and not self._reading:
            notice = self.probe(None, ABORT_TAG)
            if notice is not None:
                self._reading = True
                try:
                    self._gave_up = self.read_notice(notice)
                finally:
                    self._reading = False
        return self._aborted or self._gave_up

    def abort(self, reason: BaseException) -> None:
        self._aborted = f"aborted: {reason}"
