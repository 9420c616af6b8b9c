"""What the gloo and NCCL backends share: torch.distributed process groups arranged over MPI.

The process group is built directly (ProcessGroupGloo / ProcessGroupNCCL) rather than through
``init_process_group``, so a job may hold several communicators and torch's global default group
stays free for the user. Rendezvous needs no MASTER_ADDR: rank 0 opens a TCPStore on a port the
kernel picks (port 0, so no race for a "free" port) and broadcasts the address with MPI.
"""
from __future__ import annotations

import datetime
import os
import socket

import numpy as np
import torch
import torch.distributed as dist

from ..core.ops import ReduceOp
from ..core.schedule import chunk
from ..errors import CommError

LOOPBACK = "127.0.0.1"
_OPS = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVG: dist.ReduceOp.SUM,
        ReduceOp.PROD: dist.ReduceOp.PRODUCT, ReduceOp.MIN: dist.ReduceOp.MIN,
        ReduceOp.MAX: dist.ReduceOp.MAX}


def store_address(world) -> str:
    """Loopback when every rank runs on this host; else MASTER_ADDR, else rank 0's hostname."""
    hosts = world.allgather(socket.gethostname())
    if len(set(hosts)) == 1:
        return LOOPBACK
    chosen = os.environ.get("MASTER_ADDR") or hosts[0]
    return world.bcast(chosen if world.Get_rank() == 0 else None)


def rendezvous(world, timeout: float, backend: str):
    """A TCPStore every rank is connected to, set up over MPI. Raises CommError on all ranks."""
    host, rank, size = store_address(world), world.Get_rank(), world.Get_size()
    delta = datetime.timedelta(seconds=timeout)
    store, port, error = None, None, None
    if rank == 0:
        try:
            store = dist.TCPStore(host, 0, size, True, timeout=delta, wait_for_workers=False)
            port = store.port
        except Exception as err:  # every rank must learn of it, or the others would wait forever
            error = f"rank 0 could not open a TCPStore on {host}: {err}"
    port, error = world.bcast((port, error))
    if error is None and rank != 0:
        try:
            store = dist.TCPStore(host, port, size, False, timeout=delta)
        except Exception as err:
            error = f"rank {rank} could not reach the TCPStore at {host}:{port}: {err}"
    errors = [e for e in world.allgather(error) if e]
    if errors:
        raise CommError(f"init(backend={backend!r}): rendezvous failed: {'; '.join(errors)}")
    return store, host


def as_tensor(work, buf):
    """A torch view of W sharing its memory (bf16 is stored as uint16, viewed back as bfloat16)."""
    if isinstance(work, torch.Tensor):
        return work
    if buf is not None and buf.dtype.name == "bfloat16":
        return torch.from_numpy(work.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(work)


def start(pg, name: str, t: torch.Tensor, rank: int, size: int, op, root: int, device_ids=None):
    """Issue collective ``name`` on flat tensor ``t`` with W's in-place semantics.

    Returns (work, finish): wait on ``work``, then call ``finish()`` to complete W."""
    finish = _nothing
    if name == "all_reduce":
        opts = dist.AllreduceOptions()
        opts.reduceOp = _OPS[op]
        work = pg.allreduce([t], opts)
    elif name == "broadcast":
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        work = pg.broadcast([t], opts)
    elif name == "reduce":
        opts = dist.ReduceOptions()
        opts.reduceOp, opts.rootRank, opts.rootTensor = _OPS[op], root, 0
        work = pg.reduce([t], opts)
    elif name == "all_gather":
        off, n = chunk(t.numel(), size, rank)
        work = pg._allgather_base(t, t[off:off + n].clone())   # input must not alias the output
    elif name == "reduce_scatter":
        off, n = chunk(t.numel(), size, rank)
        mine = torch.empty(n, dtype=t.dtype, device=t.device)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _OPS[op]
        work = pg._reduce_scatter_base(mine, t, opts)

        def finish():
            t[off:off + n].copy_(mine)
    elif name == "barrier":
        opts = dist.BarrierOptions()
        if device_ids is not None:
            opts.device_ids = device_ids
        work = pg.barrier(opts)
    else:  # pragma: no cover - the Communicator only calls the collectives above
        raise AssertionError(name)
    return work, finish


def _nothing():
    pass
