"""What every reference backend shares: MPI for identity and rendezvous, no algorithm names.

A reference backend runs each call with its library's own function. Which function is the
collective's business (``Collective.mpi`` / ``Collective.c10d`` in ringcomm/collectives); the
backend supplies the library handles, waits on the request with the communicator's deadline
and turns library errors into ringcomm's. A collective a backend cannot run says so by name
(the model of torch's c10d Backend: "Backend X does not support allreduce"), before any
communication.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..bootstrap import allgather_within
from ..communicator import Communicator
from ..diagnostics import preflight
from ..errors import CommError, CommTimeoutError, PeerAbortedError, UsageError, bad_type, bad_value
from ..transport.mpi import MPIRequest, MPITransport, new_communicator
from ..transport.polling import wait_polling

_stranded: list = []   # timed-out checks' requests and the buffers MPI may still write
NOTICE_GRACE = 2.0     # seconds a pre-flight exchange may still take once a peer gave up (_preflight)


class ReferenceCommunicator(Communicator):
    """A Communicator whose collectives run inside a library (MPI, gloo, NCCL).

    An MPI transport over the job's communicator supplies rank, size and the abort flag; the
    communicator itself (``world``) carries the rendezvous. Collective data never touches either.
    """

    backend = "reference"
    library = "the library"   # named in error messages

    def __init__(self, world, topology, *, timeout: Optional[float], context: tuple = ()):
        # A sub-communicator's transport owns its world: close() gives it back to MPI once every
        # member has closed cleanly (transport/mpi.py retire_communicator).
        super().__init__(MPITransport(world, own=bool(context)), timeout=timeout, local_rank=topology.local_rank,
                         local_size=topology.local_size, node_count=topology.node_count,
                         topology=topology, context=context)
        self.world = world
        # The libraries check nothing across ranks: ranks that disagreed on a count returned
        # MPI's partial or stale buffers as results, and killed the job with SIGABRT inside
        # gloo. So every collective starts with the ranks' fingerprints and splits compared
        # (``_preflight``): MismatchError on every rank instead.
        self._preflight_on = True

    def _check_algorithm(self, call, algorithm) -> Optional[str]:
        self._check_supported(call)
        if algorithm is None:
            return None
        if not isinstance(algorithm, str):
            raise bad_type(call.name, "algorithm", "a str or None", type(algorithm).__name__)
        raise bad_value(call.name, "algorithm",
                        f"None: backend {self.backend!r} runs {self.library}'s own algorithms "
                        f"(algorithm names apply to backend 'ringcomm')", algorithm)

    def _preflight(self, seq: int, call) -> None:
        """The pre-flight check (diagnostics/preflight.py) through MPI's own nonblocking
        allgather on the world: the ringcomm backend's tagged ring over the MPI transport cost
        85 us a call here, MPI's allgather 14. On gloo the check waits for the peers' previous
        gloo call to end: a 1 KiB all_reduce took 2.1 ms with it, 1.2 without, on the EPYC host.
        Collectives on the world keep their order on every rank, so a rank that skipped one
        compares its next call's fingerprint with the skipped one's, and the kinds or counts
        differ."""
        mine = self._fingerprint(seq, call)
        row = np.array(mine + preflight.parts(call, self.size), np.int64)
        rows = np.empty(self.size * row.size, np.int64)
        request = self.world.Iallgather(row, rows)
        waited = MPIRequest(request, self.transport)
        try:
            done = waited.wait(self.timeout)
        except PeerAbortedError:
            # A peer that compared first found a mismatch and gave up while this rank's copy of
            # the exchange was still landing: finish it, so that this rank names the mismatch
            # too (every rank raises MismatchError) rather than only that a peer gave up.
            if not wait_polling(waited.test, NOTICE_GRACE):
                raise
            done = True
        if not done:
            _stranded.append((request, row, rows))   # MPI cannot withdraw a collective
            raise CommTimeoutError(f"{call.name} #{seq} ({self.backend}) pre-flight check on rank {self.rank}: MPI "
                                   f"did not complete it within {self.timeout:g} s; a peer may not have entered it")
        pairwise = call.recv_counts is not None
        # Every rank the same call and finite input, the usual case, in one comparison; but not
        # an all_to_all's splits, which must pair up across ranks: every rank passing [1, 2] as
        # both its sends and its receives has rank 0 send rank 1 two elements where rank 1
        # expects one (this shortcut let that through: MPI left an element unwritten, gloo aborted).
        if not pairwise and not mine[-1] and rows.tobytes() == row.tobytes() * self.size:
            return
        preflight.compare(rows.reshape(self.size, row.size), f"{call.name} #{seq} on rank {self.rank}",
                          check_fields=True, with_parts=True, pairwise=pairwise)

    def _check_supported(self, call) -> None:
        """Raise UsageError (before any communication) for what the library cannot do."""

    def _point_to_point(self, call, async_op: bool):
        self._check_supported(call)   # send/recv take no algorithm, so _check_algorithm never saw them
        return super()._point_to_point(call, async_op)

    def _describe(self, call, seq: int) -> str:
        return f"{call.name} #{seq} ({self.backend}, {call.count} x {call.dtype.name if call.dtype else 'bytes'})"

    def _collective(self, call, algorithm, seq):
        what = self._describe(call, seq)
        try:
            handle, keep = self._start_call(call)
        except NotImplementedError as err:
            raise UsageError(f"{what}: {err}") from None
        self._wait(handle, keep, what)
        if callable(keep):   # the torch mappings that stage through padded tensors copy back here
            keep()

    def _start_call(self, call):
        raise NotImplementedError

    def _wait(self, handle, keep, what: str) -> None:
        raise NotImplementedError

    # ---- sub-communicators ----------------------------------------------------------------------
    def _split(self, seq: int, color, key: int, what: str = "split"):
        """Agree on the groups over MPI, then let the library build each (``_sub_backend``).
        ``what``: the call the user made (split or dup), in the words of its errors.

        The agreement is MPI's nonblocking allgather polled under the deadline: with the blocking
        one, a rank that never called split held every other one there forever. Once it is done
        every rank has entered the call, so the MPI_Comm_split after it waits for nobody absent."""
        table = allgather_within(self.world, (color, key), self.timeout, f"{what} #{seq} ({self.backend})",
                                 self.transport.aborted_reason)
        members = None
        if color is not None:
            members = sorted((r for r in range(self.size) if table[r][0] == color), key=lambda r: (table[r][1], r))
        self._splits += 1
        path = self.context + ((self._splits, color),)
        from mpi4py import MPI
        sub_world = new_communicator(lambda: self.world.Split(MPI.UNDEFINED if color is None else color,
                                                              0 if members is None else members.index(self.rank)),
                                     f"{what} #{seq} on rank {self.rank}")
        if members is None:
            return None
        sub = self._sub_backend(sub_world, members, path)
        sub.holders = self.holders   # gloo's and NCCL's groups meet in the world's store
        self.holders.join()
        return sub

    def _sub_backend(self, sub_world, members, path):
        raise NotImplementedError(f"backend {self.backend!r} has no sub-communicators")

    def _sub_topology(self, members):
        from ..topology import Topology
        return Topology.from_names(members.index(self.rank), [self.topology.node_of[r] for r in members])


def comm_error(what: str, library: str, err: BaseException) -> CommError:
    text = str(err)
    kind = CommTimeoutError if "timeout" in text.lower() or "timed out" in text.lower() else CommError
    return kind(f"{what}: {library} failed: {text}")


def host_copy(a):
    return np.array(a, copy=True)
