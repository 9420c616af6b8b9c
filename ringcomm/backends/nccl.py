"""Backend "nccl": NCCL through torch.distributed, rendezvous over MPI.

Each rank drives GPU ``local_rank % device_count`` of its node. CUDA tensors are reduced where
they live. Host memory (numpy arrays, CPU tensors, which is what the Communicator hands over
today) is staged through the GPU: copied in, reduced by NCCL, copied back; slower, but every
collective keeps one meaning on every backend.

Without CUDA (or with a torch built without NCCL) init fails on every rank with the reason of
each rank that cannot run it, before any process group exists.
"""
from __future__ import annotations

import datetime

import torch

from ..errors import CommError, CommTimeoutError, UsageError
from ..transport.polling import wait_polling
from . import c10d
from .reference import ReferenceCommunicator


def unavailable_reason() -> str | None:
    """Why NCCL cannot run in this process, or None when it can."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_nccl_available():
        return f"this torch ({torch.__version__}) was built without NCCL"
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return (f"torch.cuda.is_available() is False (torch {torch.__version__}, "
                f"{'CUDA ' + built if built else 'a CPU-only build'}): no usable GPU")
    return None


class NCCLCommunicator(ReferenceCommunicator):
    backend = "nccl"
    library = "NCCL"

    def __init__(self, world, topology, *, timeout):
        reasons = world.allgather(unavailable_reason())
        by_reason: dict = {}
        for r, why in enumerate(reasons):
            if why:
                by_reason.setdefault(why, []).append(str(r))
        if by_reason:
            listed = "; ".join(f"rank{'s' * (len(rs) > 1)} {', '.join(rs)}: {why}" for why, rs in by_reason.items())
            raise UsageError(f"init: backend 'nccl' cannot run here ({listed}); "
                             f"use backend 'gloo', 'mpi' or 'ringcomm' on CPU")
        super().__init__(world, topology, timeout=timeout)
        import torch.distributed as dist
        self.device = torch.device("cuda", topology.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(self.device)
        self._store, _ = c10d.rendezvous(world, timeout, self.backend)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = datetime.timedelta(seconds=timeout)
        self._pg = dist.ProcessGroupNCCL(self._store, self.rank, self.size, options)

    def _collective(self, name, algorithm, work, buf, seq, *, op=None, root=0):
        host = c10d.as_tensor(work, buf)
        staged = not host.is_cuda
        t = host.to(self.device, non_blocking=False) if staged else host
        try:
            handle, finish = c10d.start(self._pg, name, t, self.rank, self.size, op, root,
                                        device_ids=[self.device.index])
            # NCCL runs on its own stream; poll its event so the wait has a deadline.
            if not wait_polling(handle.is_completed, self.timeout, self.transport.aborted_reason):
                raise CommTimeoutError(f"{self._describe(name, seq, work, buf)} on rank {self.rank}: "
                                       f"NCCL did not complete it within {self.timeout:g} s")
            handle.wait()
            finish()
        except RuntimeError as err:   # NCCL errors (lost peer, watchdog) arrive as RuntimeError
            raise CommError(f"{self._describe(name, seq, work, buf)} on rank {self.rank}: "
                            f"NCCL failed: {err}") from err
        if staged:
            host.copy_(t)
        else:
            torch.cuda.current_stream(self.device).synchronize()
