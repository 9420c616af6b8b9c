"""Backend "nccl": NCCL through torch.distributed, rendezvous over MPI.

Each rank drives GPU ``local_rank % device_count`` of its node. CUDA tensors are reduced where
they live. Host memory (numpy arrays, CPU tensors) is staged through the GPU: copied in, reduced
by NCCL, copied back; slower, but every collective keeps one meaning on every backend.

Without CUDA (or with a torch built without NCCL) init fails on every rank with the reason of
each rank that cannot run it, before any process group exists.
"""
from __future__ import annotations

import datetime

import torch

from ..bootstrap import allgather_within
from ..errors import CommError, CommTimeoutError, UsageError
from ..transport.polling import wait_polling
from . import c10d


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


class NCCLCommunicator(c10d.C10dBackend):
    backend = "nccl"
    library = "NCCL"
    devices = ("cpu", "cuda")

    def __init__(self, world, topology, *, timeout, context=(), store=None):
        reasons = allgather_within(world, unavailable_reason(), timeout, "init(backend='nccl'): whether NCCL can run")
        by_reason: dict = {}
        for r, why in enumerate(reasons):
            if why:
                by_reason.setdefault(why, []).append(str(r))
        if by_reason:
            listed = "; ".join(f"rank{'s' * (len(rs) > 1)} {', '.join(rs)}: {why}" for why, rs in by_reason.items())
            raise UsageError(f"init: backend 'nccl' cannot run here ({listed}); "
                             f"use backend 'gloo', 'mpi' or 'ringcomm' on CPU")
        super().__init__(world, topology, timeout=timeout, context=context)
        import torch.distributed as dist
        self.device = torch.device("cuda", topology.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(self.device)
        if store is None:
            store, _ = c10d.rendezvous(world, timeout, self.backend)
        self._store = store
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = datetime.timedelta(seconds=timeout)
        self.pg = dist.ProcessGroupNCCL(store, self.rank, self.size, options)

    def _check_supported(self, call) -> None:
        if call.device not in ("cpu", f"cuda:{self.device.index}"):
            raise UsageError(f"{call.name} on rank {self.rank}: backend 'nccl' of this rank drives "
                             f"cuda:{self.device.index} (local rank {self.local_rank} modulo the "
                             f"{torch.cuda.device_count()} devices here), got memory on {call.device}")

    def tensor(self, flat, dtype):
        """Device memory stays where it is (DLPack); host arrays are staged through the GPU
        (copied back in ``_wait``)."""
        t = super().tensor(flat, dtype)
        if t.is_cuda:
            return t
        staged = t.to(self.device)
        self._staged.append((t, staged))
        return staged

    def barrier_options(self):
        opts = super().barrier_options()
        opts.device_ids = [self.device.index]
        return opts

    def _collective(self, call, algorithm, seq):
        self._staged = []
        super()._collective(call, algorithm, seq)

    def _wait(self, handle, keep, what: str) -> None:
        try:   # NCCL runs on its own stream; poll its event so the wait has a deadline
            if not wait_polling(handle.is_completed, self.timeout, self.transport.aborted_reason):
                raise CommTimeoutError(f"{what} on rank {self.rank}: NCCL did not complete it within "
                                       f"{self.timeout:g} s")
            handle.wait()
        except RuntimeError as err:   # NCCL errors (lost peer, watchdog) arrive as RuntimeError
            raise CommError(f"{what} on rank {self.rank}: NCCL failed: {err}") from err
        for host, staged in self._staged:
            host.copy_(staged)
        torch.cuda.current_stream(self.device).synchronize()

    def _sub_backend(self, sub_world, members, path):
        import torch.distributed as dist
        store = dist.PrefixStore(f"ringcomm-split-{path!r}", self._store)
        return NCCLCommunicator(sub_world, self._sub_topology(members), timeout=self.timeout, context=path,
                                store=store)
