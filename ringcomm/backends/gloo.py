"""Backend "gloo": torch.distributed's gloo collectives on CPU memory, rendezvous over MPI.

numpy arrays and CPU tensors are handed to gloo as torch views of the same memory (bf16 through
its uint16 storage), so collectives stay in place. gloo reduces float16 and bfloat16 itself.
Device memory (CUDA tensors, cupy arrays) goes to gloo as CUDA tensors through DLPack, for the two
collectives torch's gloo runs on CUDA (all_reduce, broadcast); the others are refused by name.
Deadlines: the process group is created with the communicator's timeout, and gloo raises when a
collective runs past it; that error comes back as CommError naming the collective. gloo refuses
int16 altogether: that is a UsageError before any communication. gloo's send/recv never compare
lengths, so each message goes with a header the receive checks first (framed.py).
"""
from __future__ import annotations

import atexit
import datetime

import torch.distributed as dist

from ..errors import PeerAbortedError, UsageError
from . import c10d
from .framed import FramedPointToPoint, Frames
from .reference import comm_error

NOTICE_SLICE = datetime.timedelta(seconds=0.5)   # how often a gloo wait looks for a peer's abort notice


class GlooCommunicator(FramedPointToPoint, c10d.C10dBackend):
    backend = "gloo"
    library = "gloo"
    devices = ("cpu", "cuda")
    CUDA_COLLECTIVES = ("all_reduce", "broadcast")   # torch's gloo runs only these on CUDA tensors

    def __init__(self, world, topology, *, timeout, context=(), store=None, host=None):
        super().__init__(world, topology, timeout=timeout, context=context)
        if store is None:
            store, host = c10d.rendezvous(world, timeout, self.backend)
        self._store, self._host = store, host
        self.pg = dist.ProcessGroupGloo(store, self.rank, self.size, self._options(timeout, host))
        self.frames = Frames()   # send/recv go framed by a header (framed.py)
        atexit.register(self._release)
        if not context:   # the world's group and store go once it and its sub-communicators closed
            self.holders.on_release(self._close_world)

    @staticmethod
    def _options(timeout: float, host: str):
        options = dist.ProcessGroupGloo._Options()
        options._timeout = datetime.timedelta(seconds=timeout)
        # On one host, bind gloo to loopback: the hostname may not resolve to a usable address.
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host) if host == c10d.LOOPBACK
                            else dist.ProcessGroupGloo.create_default_device()]
        return options

    def _release(self, timeout: float = 10.0) -> None:
        """Drop the process group and its store on every rank together, before interpreter exit.

        Left to interpreter teardown, rank 0 could destroy the TCPStore server while a peer's gloo
        threads still use it, and that peer aborted in C++ ("terminate called without an active
        exception") after all its work was done. So rank 0, the server's host, keeps it until
        every peer has dropped its group and said so in the store, or for ``timeout`` seconds,
        which never hangs the exit of a job whose peers are gone. The ranks meet in the store,
        not over MPI: a collective that timed out on one rank alone (a split's allgather) is
        still posted on the world, and a barrier there paired with it on the peers, so the exit
        waited out its bound. A sub-communicator's group only goes: the store is the world's.
        """
        if self.pg is None or self._forked is not None:   # the parent's, not this forked child's
            return
        if any(t.is_alive() for t in self._waiters):   # the exit, with sends or receives never matched
            self.pg.abort()
        self.join_waiters()
        store = self._store
        self.pg = self._store = None   # the gloo group goes before this rank says it has
        if self.context or store is None:
            return
        try:
            store.set_timeout(datetime.timedelta(seconds=timeout))
            if self.rank == 0:
                store.wait([f"ringcomm-exit/{r}" for r in range(1, self.size)])
            else:
                store.set(f"ringcomm-exit/{self.rank}", b"")
        except Exception:
            pass   # a peer or the server gone, or late past the bound: nothing left to wait for

    def close(self) -> None:
        """A sub-communicator's gloo group goes with it (its sockets and threads), without the
        exit's barrier: the world's store, which its peers may still use, is not its own."""
        super().close()
        if self.context and self.pg is not None and self._forked is None:
            atexit.unregister(self._release)
            self.pg = self._store = None

    def _close_world(self) -> None:
        """What the exit would do (``_release``), once the world and its sub-communicators have
        closed: each init kept fifteen descriptors (group, store) until the process ended."""
        atexit.unregister(self._release)
        self._release()

    def _check_supported(self, call) -> None:
        if call.dtype is not None and call.dtype.name == "int16":
            raise UsageError(f"{call.name}: backend 'gloo' does not support dtype int16 (torch's gloo refuses "
                             f"it: 'Invalid scalar type'); use int32, or backend 'ringcomm' or 'mpi'")
        if call.device != "cpu" and call.name not in self.CUDA_COLLECTIVES:
            raise UsageError(f"{call.name} on rank {self.rank}: backend 'gloo' runs only "
                             f"{' and '.join(self.CUDA_COLLECTIVES)} on device memory (torch's gloo), got "
                             f"memory on {call.device}; use backend 'ringcomm' (CUDA IPC) or 'nccl'")

    def _wait(self, handle, keep, what: str) -> None:
        """gloo's blocking wait, in slices of NOTICE_SLICE: between them a peer's abort notice
        ends it. A peer interrupted after its pre-flight paired with this rank's never enters the
        gloo call, and this rank waited on gloo's sockets, where no notice comes, for all of
        gloo's timeout (60 s in tests/mpi_jobs/interrupted.py). A sliced wait that runs out
        withdraws nothing: the call completes, with its result, at the next slice."""
        try:
            while True:
                try:
                    handle.wait(NOTICE_SLICE)
                    return
                except RuntimeError as err:
                    if "Operation timed out" not in str(err):   # gloo's own timeout says otherwise
                        raise
                why = self.transport.aborted_reason()
                if why is not None:
                    raise PeerAbortedError(f"{what} on rank {self.rank}: {why}")
        except RuntimeError as err:   # gloo reports timeouts and lost peers as RuntimeError
            raise comm_error(f"{what} on rank {self.rank}", "gloo", err) from err

    def _sub_backend(self, sub_world, members, path):
        store = dist.PrefixStore(f"ringcomm-split-{path!r}", self._store)
        return GlooCommunicator(sub_world, self._sub_topology(members), timeout=self.timeout, context=path,
                                store=store, host=self._host)
