"""Bootstrap without MPI: a node's handshakes and overflow payloads over a torch.distributed Store.

Under torchrun, or torch's own test harness (env://, tcp://, file:// init methods), there is no
MPI job: torch hands the backend a Store that every rank reaches. The shared-memory transport
needs four things from the communicator of its node, and uses mpi4py's names for them, so that
an MPI communicator and a ``StoreComm`` serve alike (shm/ and cuda_ipc.py are unchanged):

- ``Get_rank()``, ``Get_size()``;
- ``Iallgather(row, table)``: the node handshakes (shm/node.py). Each rank stores its row under a
  key numbered by how many allgathers it has made (every rank makes them in the same order, and
  node.py's rows name their handshake, so ranks that disagree are told so); ``Test()`` checks,
  without blocking, that every rank's key exists, then reads them;
- ``Isend(buf, dest, tag)``, ``Irecv(buf, source, tag)``: the payloads the staging pool cannot
  hold ("payload over MPI", shm/messages.py). They go over gloo point-to-point on the same
  store (torch ships gloo), on a ProcessGroupGloo of the node's ranks made at setup (its
  constructor is collective over them) on the loopback interface. gloo keeps messages of one
  pair and tag in order, which is all the pairing of payloads with descriptors relies on; a
  send completes as the receiver takes it, at worst rendezvous, as under MPI.

``allgather`` (blocking, strings) serves the setup itself: who is on which host.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Optional
import numpy as np

from ..errors import CommError, CommTimeoutError

LOOPBACK = "127.0.0.1"


class _Gathered:
    """An Iallgather in flight: ``Test()`` is True once every rank's row was read into ``table``."""

    def __init__(self, comm: "StoreComm", keys: list, table: np.ndarray):
        self.comm, self.keys, self.table, self.done = comm, keys, table, False

    def Test(self) -> bool:   # noqa: N802 - mpi4py's name: shm's node code calls either
        if not self.done and self.comm.store.check(self.keys):
            rows = [np.frombuffer(self.comm.store.get(k), self.table.dtype) for k in self.keys]
            self.table[...] = np.stack(rows).reshape(self.table.shape)
            self.done = True
        return self.done


class _GlooRequest:
    """A gloo send or receive: ``Test()`` is True once done; a failed one raises CommError.

    gloo's point-to-point Works report completion only from inside ``wait()`` (``is_completed()``
    stays False until someone waits), so a thread waits for each; these payloads are the large
    ones (over a pool share), where a thread start is noise."""

    def __init__(self, work, what: str, keep):
        self.what, self.keep = what, keep   # keep: the tensor over the buffer's memory
        self.error: Optional[BaseException] = None
        self._done = threading.Event()
        threading.Thread(target=self._wait, args=(work,), daemon=True, name=f"ringcomm-gloo {what}").start()

    def _wait(self, work) -> None:
        try:
            work.wait()
        except RuntimeError as err:
            self.error = CommError(f"{self.what} failed in gloo: {err}")
        self._done.set()

    def Test(self) -> bool:   # noqa: N802
        if not self._done.is_set():
            return False
        if self.error is not None:
            raise self.error
        return True

    def Cancel(self) -> None:   # noqa: N802 - a gloo operation cannot be withdrawn; it ends with the group
        pass


class StoreComm:
    """The ranks ``ranks`` (global ranks, in node order) of a job bootstrapped through ``store``;
    this process is ``ranks[index]``. With ``payloads`` construction is collective over them (the
    gloo group that carries Isend/Irecv); ``name`` keeps its keys apart from other StoreComms'."""

    def __init__(self, store, ranks: list, index: int, timeout: float, name: str, payloads: bool = False):
        import torch.distributed as dist
        self.store = dist.PrefixStore(f"ringcomm/{name}/", store)
        self.ranks, self.index, self.timeout = list(ranks), index, timeout
        self._gathers = 0
        self._gloo = None
        if payloads and len(self.ranks) > 1:
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)]
            options._timeout = timedelta(seconds=timeout)
            self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", self.store), index, len(self.ranks),
                                               options)

    def Get_rank(self) -> int:   # noqa: N802
        return self.index

    def Get_size(self) -> int:   # noqa: N802
        return len(self.ranks)

    def Iallgather(self, row: np.ndarray, table: np.ndarray) -> _Gathered:   # noqa: N802
        self._gathers += 1
        prefix = f"gather/{self._gathers}/"
        self.store.set(prefix + str(self.index), np.ascontiguousarray(row).tobytes())
        return _Gathered(self, [prefix + str(i) for i in range(len(self.ranks))], table)

    def allgather(self, text: str) -> list:
        """Every rank's ``text`` (any length), in rank order; bounded by the timeout."""
        self._gathers += 1
        keys = [f"gather/{self._gathers}/{i}" for i in range(len(self.ranks))]
        self.store.set(keys[self.index], text.encode())
        deadline = time.monotonic() + self.timeout
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                raise CommTimeoutError(f"ringcomm setup on rank {self.ranks[self.index]}: not every rank of "
                                       f"{self.ranks} reached the store within {self.timeout:g} s")
            time.sleep(0.005)
        return [self.store.get(k).decode() for k in keys]

    def Isend(self, buf, dest: int, tag: int) -> _GlooRequest:   # noqa: N802
        if self._gloo is None:
            raise CommError(f"rank {self.ranks[self.index]}: this store communicator carries no payloads")
        tensor = _tensor(buf)
        return _GlooRequest(self._gloo.send([tensor], dest, tag), f"payload to rank {self.ranks[dest]}", tensor)

    def Irecv(self, buf, source: int, tag: int) -> _GlooRequest:   # noqa: N802
        tensor = _tensor(buf)
        return _GlooRequest(self._gloo.recv([tensor], source, tag), f"payload from rank {self.ranks[source]}",
                            tensor)

    def Free(self) -> None:   # noqa: N802
        gloo, self._gloo = self._gloo, None
        if gloo is not None:
            try:
                gloo.abort()   # a payload nobody will take must not hold up the exit
            except RuntimeError:
                pass


def _tensor(buf):
    import torch
    flat = np.asarray(buf).reshape(-1).view(np.uint8)
    return torch.from_numpy(flat)
