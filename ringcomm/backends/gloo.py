"""Backend "gloo": torch.distributed's gloo collectives on CPU memory, rendezvous over MPI.

numpy arrays and CPU tensors are handed to gloo as torch views of the same memory (bf16 through
its uint16 storage), so collectives stay in place. gloo reduces float16 and bfloat16 itself.
Deadlines: the process group is created with the communicator's timeout, and gloo raises when a
collective runs past it; that error comes back as CommError naming the collective.
"""
from __future__ import annotations

import atexit
import datetime

import torch.distributed as dist

from ..errors import CommError, CommTimeoutError
from ..transport.polling import wait_polling
from . import c10d
from .reference import ReferenceCommunicator


class GlooCommunicator(ReferenceCommunicator):
    backend = "gloo"
    library = "gloo"

    def __init__(self, world, topology, *, timeout):
        super().__init__(world, topology, timeout=timeout)
        self._store, host = c10d.rendezvous(world, timeout, self.backend)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = datetime.timedelta(seconds=timeout)
        # On one host, bind gloo to loopback: the hostname may not resolve to a usable address.
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host) if host == c10d.LOOPBACK
                            else dist.ProcessGroupGloo.create_default_device()]
        self._pg = dist.ProcessGroupGloo(self._store, self.rank, self.size, options)
        atexit.register(self._release)

    def _release(self, timeout: float = 10.0) -> None:
        """Drop the process group and its store on every rank together, before interpreter exit.

        Left to interpreter teardown, rank 0 could destroy the TCPStore server while a peer's gloo
        threads still use it, and that peer aborted in C++ ("terminate called without an active
        exception") after all its work was done. A bounded barrier keeps the ranks together, and
        never hangs the exit of a job whose peers are already gone.
        """
        if self._pg is None:
            return
        try:
            request = self.world.Ibarrier()
            wait_polling(request.Test, timeout)
        except Exception:
            pass   # a failed peer: nothing left to wait for
        self._pg = self._store = None

    def _collective(self, name, algorithm, work, buf, seq, *, op=None, root=0):
        t = c10d.as_tensor(work, buf)
        try:
            handle, finish = c10d.start(self._pg, name, t, self.rank, self.size, op, root)
            handle.wait()
        except RuntimeError as err:   # gloo reports timeouts and lost peers as RuntimeError
            kind = CommTimeoutError if "timeout" in str(err).lower() or "timed out" in str(err).lower() else CommError
            raise kind(f"{self._describe(name, seq, work, buf)} on rank {self.rank}: gloo failed: {err}") from err
        finish()
