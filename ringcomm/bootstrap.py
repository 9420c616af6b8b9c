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

Left unbounded: the node split (``MPI_Comm_split`` in transport/factory.py), a few milliseconds
after the last exchange here, and the reference backends' own set-up.
"""
from __future__ import annotations

import pickle
from typing import Any, Optional

from .errors import CommTimeoutError
from .transport.polling import wait_polling


class Bootstrap:
    """Init's view of the job: ``comm``, a duplicate of ``world`` that only ringcomm uses, and
    ``allgather`` over it under ``timeout`` seconds (None: forever)."""

    def __init__(self, world, timeout: Optional[float]):
        from mpi4py import MPI
        self._MPI = MPI
        self.timeout = timeout
        self.size = world.Get_size()
        self.count = 0   # exchanges so far: each has a tag of its own
        comm, request = world.Idup()
        if not wait_polling(request.Test, timeout):
            # The request stays posted (MPI cannot withdraw a collective), and so does the
            # communicator it would have made: a failed init leaks one.
            raise CommTimeoutError(
                f"init: timed out after {timeout:g} s waiting for every one of the job's {self.size} ranks to call "
                f"ringcomm.init (MPI_Comm_idup over MPI_COMM_WORLD): a rank that never calls it, or is stopped, "
                f"holds up the others")
        self.comm = comm
        self.rank = comm.Get_rank()

    def allgather(self, value: Any, what: str) -> list:
        """Every rank's ``value`` (picklable), in rank order; CommTimeoutError naming the ranks
        never heard from. ``what``: the exchange, in the error's words."""
        MPI, comm = self._MPI, self.comm
        self.count += 1
        tag = self.count
        payload = bytearray(pickle.dumps(value))
        sends = [comm.Isend([payload, MPI.BYTE], dest=peer, tag=tag) for peer in range(self.size) if peer != self.rank]
        got: dict = {self.rank: value}
        status = MPI.Status()

        def arrived() -> bool:
            while len(got) < self.size and comm.Iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status):
                peer = status.Get_source()
                data = bytearray(status.Get_count(MPI.BYTE))
                comm.Recv([data, MPI.BYTE], source=peer, tag=tag)
                got[peer] = pickle.loads(data)
            return len(got) == self.size and MPI.Request.Testall(sends)

        if not wait_polling(arrived, self.timeout):
            missing = [r for r in range(self.size) if r not in got]
            whom = (f"ranks {missing} (they have not reached it: stopped, or still on their way to ringcomm.init)"
                    if missing else "its messages to be received")
            raise CommTimeoutError(f"init on rank {self.rank}: timed out after {self.timeout:g} s in exchange "
                                   f"#{tag} ({what}) waiting for {whom}")
        return [got[r] for r in range(self.size)]

    def free(self) -> None:
        self.comm.Free()
