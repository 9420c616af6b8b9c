"""Init's exchanges over MPI before any transport exists, each bounded by the timeout.

``ringcomm.init`` learns who is in the job before it builds a transport: the launchers' view,
every rank's host and node, the settings the ranks must share (agreement.py). MPI's own calls
for that (``Comm.Dup``, ``allgather``) wait forever for a rank that never arrives, and a rank
that never reached ``init`` (stuck in its own start-up, stopped, or sent down another code path
by a bug) hung every other rank there, with no error anywhere. The transports' own handshakes
were already bounded (shm/node.py).

``Bootstrap`` does the same with nonblocking MPI polled under the communicator's timeout: the
job's communicator comes from ``MPI_Comm_idup``, and each exchange is one message from every
rank to every other, so a rank that times out names the ranks it never heard from (a
nonblocking allgather could only say that someone is missing). The idup itself cannot name
anyone: it is MPI's collective, the first call every rank makes.

A rank that gives up tells every peer why (``ABORT_TAG``) before it raises, and every exchange
looks for such a notice before it takes anything else: a rank late to an exchange learns why the
others left (PeerAbortedError with the peer's reason). That cannot make every rank agree: a rank late to the last exchange may find its peers'
messages there before their notices (they sent them before giving up), and go on alone into the
node split (``MPI_Comm_split``), where it once waited forever. Nothing can poll the split, so
transport/factory.py runs it under a watchdog that ends the job past the timeout.

MPI_Init comes before all that, where ``init`` is the one to start MPI: MPICH's (and Open MPI's)
waits for every process of the job, holding the GIL, so nothing in Python can watch it, and a
process that never reached ``init`` held every other one there forever. ``mpi_init_deadline``
arms a native thread (_deadline.c) that ends the process at the timeout (at least 30 s, or
RINGCOMM_MPI_INIT_TIMEOUT) with the reason on stderr; the launcher then ends the job.

The reference backends' set-up and splits exchange over the communicator they run their
library's calls on, where tagged messages could meet the library's own: ``allgather_within``
polls MPI's nonblocking allgathers there instead.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
from typing import Any, Callable, Optional

import numpy as np

from . import env
from .errors import CommTimeoutError, PeerAbortedError
from .transport.mpi import Ledger, new_communicator
from .transport.polling import wait_polling

try:
    from ._deadline import Deadline
except ImportError:   # not built (no compiler at install time): faulthandler's watchdog instead
    Deadline = None

ABORT_TAG = 0   # exchanges use tags 1, 2, ...
NOTICE_WAIT = 1.0   # seconds a rank that gives up waits for its notices to leave
_notices: list = []   # abort notices in flight: MPI reads their buffers after the raise


class Bootstrap:
    """Init's view of the job: ``comm``, a duplicate of ``world`` that only ringcomm uses, and
    ``allgather`` over it under ``timeout`` seconds (None: forever). ``call``: what every rank
    must call to take part, in the errors' words (torch's rendezvous under mpirun uses it too)."""

    def __init__(self, world, timeout: Optional[float], call: str = "ringcomm.init"):
        from mpi4py import MPI
        self._MPI = MPI
        self.timeout = timeout
        self.call = call
        self.size = world.Get_size()
        self.count = 0   # exchanges so far: each has a tag of its own
        def duplicate():   # MPI's refusal of one more communicator raises from the request's test
            made, request = world.Idup()
            return made, wait_polling(request.Test, timeout)

        comm, done = new_communicator(duplicate, f"init on rank {world.Get_rank()}")
        if not done:
            # The request stays posted (MPI cannot withdraw a collective), and so does the
            # communicator it would have made: a failed init leaks one.
            raise CommTimeoutError(
                f"init on rank {world.Get_rank()}: timed out after {timeout:g} s waiting for every one of the job's "
                f"{self.size} ranks to call {call} (MPI_Comm_idup over MPI_COMM_WORLD): a rank that never "
                f"calls it, or is stopped, holds up the others")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.ledger = Ledger(comm, self.size)   # shared with the transports over comm: init.py retires it

    def allgather(self, value: Any, what: str) -> list:
        """Every rank's ``value`` (picklable), in rank order; CommTimeoutError naming the ranks
        never heard from. ``what``: the exchange, in the error's words."""
        MPI = self._MPI
        self.count += 1
        tag = self.count
        payload = bytearray(pickle.dumps(value))
        sends = [self._isend(payload, peer, tag) for peer in range(self.size) if peer != self.rank]
        got: dict = {self.rank: value}
        status = MPI.Status()

        def arrived() -> bool:
            notice = self._received(ABORT_TAG, status)
            if notice is not None:
                raise PeerAbortedError(f"init on rank {self.rank}: in exchange #{tag} ({what}): rank {notice[0]} "
                                       f"gave up: {notice[1].decode(errors='replace')}")
            while len(got) < self.size and (message := self._received(tag, status)) is not None:
                got[message[0]] = pickle.loads(message[1])
            return len(got) == self.size and MPI.Request.Testall(sends)

        if not wait_polling(arrived, self.timeout):
            missing = [r for r in range(self.size) if r not in got]
            whom = (f"ranks {missing} (they have not reached it: stopped, or still on their way to {self.call})"
                    if missing else "its messages to be received")
            err = CommTimeoutError(f"init on rank {self.rank}: timed out after {self.timeout:g} s in exchange "
                                   f"#{tag} ({what}) waiting for {whom}")
            self._abort(str(err))
            raise err
        return [got[r] for r in range(self.size)]

    def _received(self, tag: int, status) -> Optional[tuple]:
        """(source, bytes) of a message under ``tag`` that has arrived from any rank, or None."""
        MPI = self._MPI
        if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status):
            return None
        source, data = status.Get_source(), bytearray(status.Get_count(MPI.BYTE))
        self.comm.Recv([data, MPI.BYTE], source=source, tag=tag)
        self.ledger.received[source] += 1
        return source, data

    def _isend(self, data: bytearray, peer: int, tag: int):
        self.ledger.sent[peer] += 1
        return self.comm.Isend([data, self._MPI.BYTE], dest=peer, tag=tag)

    def _abort(self, why: str) -> None:
        """Tell every peer why this rank gives up. Small messages complete once MPI has copied them
        out, which it does while this rank polls them: unpolled, MPICH had not delivered them when
        a late peer looked, after this rank had left."""
        MPI = self._MPI
        text = bytearray(why.encode())
        sends = [self._isend(text, peer, ABORT_TAG) for peer in range(self.size) if peer != self.rank]
        if not wait_polling(lambda: MPI.Request.Testall(sends), NOTICE_WAIT):
            _notices.extend([text, *sends])   # MPI may still read the buffer

    def free(self) -> None:
        self.comm.Free()


def allgather_within(comm, value: Any, timeout: Optional[float], what: str,
                     aborted: Callable[[], Optional[str]] = lambda: None) -> list:
    """Every rank's ``value`` (picklable), in rank order, over ``comm`` with MPI's nonblocking
    allgathers polled under ``timeout``: for the reference backends' set-up and splits, which
    share ``comm`` with their library's own messages (so no tagged ones, as Bootstrap sends).
    MPI's blocking allgather there held every rank for one that never came. A nonblocking
    collective cannot say who is missing: the CommTimeoutError names the exchange (``what``)."""
    data = np.frombuffer(pickle.dumps(value), np.uint8)
    count, sizes = np.array([data.size], np.int64), np.empty(comm.Get_size(), np.int64)
    _polled(comm.Iallgather(count, sizes), (count, sizes), comm, timeout, what, aborted)
    both = np.empty(int(sizes.sum()), np.uint8)
    _polled(comm.Iallgatherv(data, (both, sizes.tolist())), (data, both), comm, timeout, what, aborted)
    ends = np.cumsum(sizes)
    return [pickle.loads(both[end - n:end].tobytes()) for end, n in zip(ends.tolist(), sizes.tolist())]


_stranded: list = []   # timed-out collectives' requests and the buffers MPI may still write


def _polled(request, buffers, comm, timeout, what: str, aborted) -> None:
    if not wait_polling(request.Test, timeout, aborted):
        _stranded.append((request, buffers))   # MPI cannot withdraw a collective
        raise CommTimeoutError(f"{what} on rank {comm.Get_rank()}: MPI did not complete it within {timeout:g} s; a "
                               f"peer may not have entered it or may have entered a different collective")


# MPI_Init also waits out the processes' start-up (imports, a slow file system), which no
# collective's timeout measures: a 2 s timeout meant for failing collectives fast must not end a
# healthy job whose processes started 3 s apart.
MPI_INIT_FLOOR = 30.0

# Launchers' rank variables, for the words of an error raised before MPI knows the rank.
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def mpi_init_limit(timeout: Optional[float]) -> tuple:
    """(seconds MPI_Init may wait, or None for ever; where that comes from, in an error's words)."""
    chosen = env.get("RINGCOMM_MPI_INIT_TIMEOUT")
    if chosen is not None:
        return chosen, "RINGCOMM_MPI_INIT_TIMEOUT"
    if timeout is None:
        return None, ""
    return max(timeout, MPI_INIT_FLOOR), f"the init timeout, at least {MPI_INIT_FLOOR:g} s"


@contextlib.contextmanager
def mpi_init_deadline(timeout: Optional[float], call: str = "ringcomm.init"):
    """Around MPI_Init (the module docstring): unless it returns in time (``mpi_init_limit``),
    end this process with the reason on stderr (``call``: what starts MPI, in its words).
    Without the compiled piece, faulthandler's watchdog does it, with a traceback for a reason."""
    limit, source = mpi_init_limit(timeout)
    if limit is None:
        yield
        return
    rank = next((os.environ[v] for v in _RANK_VARIABLES if os.environ.get(v, "").strip()), "?")
    deadline = None
    if Deadline is not None:
        try:
            deadline = Deadline(limit, (
                f"ringcomm: init on rank {rank}: MPI_Init has not returned after {limit:g} s ({source}): "
                f"it waits for every process of the job, and one never reached it (stuck or stopped before "
                f"{call}, or never started); ending this process, and with it the job\n").encode())
        except OSError:   # no thread to be had now (EAGAIN): faulthandler tries its own
            pass
    if deadline is None:
        faulthandler.dump_traceback_later(limit, exit=True)
    try:
        yield
    finally:
        if deadline is None:
            faulthandler.cancel_dump_traceback_later()
        else:
            deadline.cancel()
