"""torch.distributed on ringcomm: a c10d backend named "ringcomm".

    import ringcomm, torch.distributed as dist
    ringcomm.init_process_group()        # under mpirun; no MASTER_ADDR, no torchrun
    dist.get_backend()                   # "ringcomm"
    torch.nn.parallel.DistributedDataParallel(model)   # its buckets reduce on ringcomm

``RingcommProcessGroup`` is a Python ``torch.distributed.ProcessGroup`` subclass (the pattern of
torch/testing/_internal/distributed/multi_threaded_pg.py). c10d calls its methods both from
Python (dist.all_reduce -> ``allreduce``; dist.all_gather_into_tensor -> ``all_gather_single``)
and from C++ (torch's DDP reducer -> ``allreduce``; ``_broadcast_coalesced`` -> ``broadcast``;
parameter-shape checks -> ``allgather``), so both spellings of each collective are provided.

Every call becomes one async collective on the ringcomm Communicator (its progress thread runs
them in issue order) and returns a c10d Work built from a ``torch.futures.Future``. One completer
thread waits on the ringcomm Works in that same order and completes the futures, so torch's DDP
(which chains ``get_future().then(...)``) keeps computing backward while buckets are on the wire.
Tensors the communicator cannot take in place (CUDA for a CPU-only backend, non-contiguous ones)
go through a contiguous host copy, written back before the future completes; CUDA tensors stay on
the device where the communicator lists "cuda" in ``comm.devices`` (ringcomm over CUDA IPC, nccl).
"""
from __future__ import annotations

import collections
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    ReduceOptions,
    ReduceScatterOptions,
    _create_work_from_future,
)

from ..errors import UsageError, bad_value

BACKEND = "ringcomm"

_OPS = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
}


def _op(opts, collective: str) -> str:
    for torch_op, name in _OPS.items():
        if opts.reduceOp == torch_op:
            return name
    raise bad_value(collective, "op", "SUM, AVG, PRODUCT, MIN or MAX", str(opts.reduceOp))


def _accepts(comm, t: torch.Tensor) -> bool:
    """Whether ``comm`` takes ``t`` in place (``comm.devices``: CUDA tensors too where CUDA IPC or
    NCCL carries them); otherwise a contiguous host copy goes instead."""
    on_device = t.device.type == "cpu" or t.device.type in getattr(comm, "devices", ("cpu",))
    return on_device and t.is_contiguous()


class _Completer:
    """Completes c10d futures in issue order, as ringcomm finishes the matching Works."""

    def __init__(self, rank: int, timeout: Optional[float]):
        self.timeout = timeout
        # Busy time: collectives run one at a time, so each one's share starts at its issue or at
        # the previous one's completion, whichever is later (no double counting of queued time).
        self.comm_seconds = 0.0
        self._last_done = 0.0
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"ringcomm-c10d-{rank}")
        self._thread.start()

    def add(self, work, fut: torch.futures.Future, finish: Callable) -> None:
        with self._cv:
            self._queue.append((work, fut, finish, time.perf_counter()))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                work, fut, finish, t0 = self._queue.popleft()
            try:
                work.wait(self.timeout)
                result = finish()
                done = time.perf_counter()
                self.comm_seconds += done - max(t0, self._last_done)
                self._last_done = done
            except BaseException as err:   # the caller sees it from Work.wait() / the future
                fut.set_exception(err)
            else:
                fut.set_result(result)


class RingcommProcessGroup(dist.ProcessGroup):
    """c10d process group whose collectives run on a ringcomm Communicator."""

    def __init__(self, comm, rank: int, size: int):
        super().__init__(rank, size)
        if (rank, size) != (comm.rank, comm.size):
            raise UsageError(f'ringcomm process group got unexpected value for argument "rank, size" '
                             f'(expected the whole job ({comm.rank}, {comm.size}); sub-groups are not '
                             f'supported, got ({rank}, {size}))')
        self.comm = comm
        self._rank, self._size = rank, size
        self._completer = _Completer(rank, getattr(comm, "timeout", None))

    @property
    def comm_seconds(self) -> float:
        """Seconds this group spent with a collective in flight (which may overlap compute)."""
        return self._completer.comm_seconds

    def getBackendName(self) -> str:
        return BACKEND

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"RingcommProcessGroup(rank={self._rank}, size={self._size}, comm={self.comm!r})"

    # ---- plumbing ---------------------------------------------------------------------------
    def _submit(self, launch: Callable, result, after: Callable = None):
        """Start ``launch()`` (an async ringcomm call) and return a c10d Work for it."""
        work = launch()
        fut = torch.futures.Future()

        def finish():
            if after is not None:
                after()
            return result
        self._completer.add(work, fut, finish)
        return _create_work_from_future(fut)

    def _staged(self, t: torch.Tensor):
        """(tensor the communicator works on, write-back or None)."""
        if _accepts(self.comm, t):
            return t, None
        host = t.detach().to("cpu", copy=True).contiguous()
        return host, lambda: t.copy_(host)

    @staticmethod
    def _one(tensors: list, collective: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise bad_value(collective, "tensors", "one tensor per process", f"{len(tensors)} tensors")
        return tensors[0]

    # ---- all-reduce --------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        t = self._one(tensors, "allreduce")
        op = _op(opts or AllreduceOptions(), "allreduce")
        work_t, back = self._staged(t)
        return self._submit(lambda: self.comm.all_reduce(work_t, op=op, async_op=True), tensors, back)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op(opts or AllreduceCoalescedOptions(), "allreduce_coalesced")
        works = [self.allreduce([t], _with_op(AllreduceOptions(), op)) for t in tensors]
        return _join(works, tensors)

    # ---- broadcast / reduce -----------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        t = self._one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        work_t, back = self._staged(t)
        # Bytes: a broadcast moves data without arithmetic, so any dtype (bool too) can travel.
        raw = _bytes(work_t)
        return self._submit(lambda: self.comm.broadcast(raw, root=root, async_op=True), tensors, back)

    def reduce(self, tensors, opts=None):
        t = self._one(tensors, "reduce")
        opts = opts or ReduceOptions()
        op = _op(opts, "reduce")
        work_t, back = self._staged(t)
        return self._submit(lambda: self.comm.reduce(work_t, root=opts.rootRank, op=op, async_op=True),
                            tensors, back)

    # ---- all-gather ----------------------------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        outs = self._one(output_tensors, "allgather")
        x = self._one(input_tensors, "allgather")
        if len(outs) != self._size or any(o.numel() != x.numel() for o in outs):
            raise bad_value("allgather", "output_tensors", f"{self._size} tensors of {x.numel()} elements",
                            [o.numel() for o in outs])
        xin = _bytes(x.detach().to("cpu").contiguous())
        gathered = np.empty(self._size * xin.size, np.uint8)

        def scatter_back():
            for r, o in enumerate(outs):
                chunk = torch.from_numpy(gathered[r * xin.size:(r + 1) * xin.size]).view(o.dtype)
                o.copy_(chunk.view(o.shape))
        return self._submit(lambda: self.comm.all_gather(gathered, xin, async_op=True), output_tensors,
                            scatter_back)

    def all_gather_single(self, output, input, opts=None):
        if output.numel() != self._size * input.numel() or output.dtype != input.dtype:
            raise bad_value("all_gather_into_tensor", "output_tensor",
                            f"{self._size * input.numel()} elements of {input.dtype}",
                            f"{output.numel()} elements of {output.dtype}")
        out_t, back = self._staged(output)
        xin = _bytes(_alike(input, out_t))
        out_raw = _bytes(out_t)
        return self._submit(lambda: self.comm.all_gather(out_raw, xin, async_op=True), [output], back)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return _join([self.all_gather_single(o, i) for o, i in zip(outputs, inputs)], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ---- reduce-scatter ----------------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = self._one(output_tensors, "reduce_scatter")
        chunks = self._one(input_tensors, "reduce_scatter")
        if len(chunks) != self._size:
            raise bad_value("reduce_scatter", "input_list", f"{self._size} tensors", len(chunks))
        return self.reduce_scatter_single(out, torch.cat([c.reshape(-1) for c in chunks]), opts)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts or ReduceScatterOptions(), "reduce_scatter")
        if input.numel() != self._size * output.numel():
            raise bad_value("reduce_scatter_tensor", "input", f"{self._size * output.numel()} elements",
                            f"{input.numel()} elements")
        out_t, back = self._staged(output)
        x = _alike(input, out_t).reshape(-1)
        return self._submit(lambda: self.comm.reduce_scatter(out_t.view(-1), x, op=op, async_op=True),
                            [output], back)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return _join([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- barrier ---------------------------------------------------------------------------------
    def barrier(self, opts=None):
        return self._submit(lambda: self.comm.barrier(async_op=True), None)


def _with_op(opts, op: str):
    opts.reduceOp = {v: k for k, v in _OPS.items()}[op]
    return opts


def _join(works: list, result):
    """One c10d Work that completes when all of ``works`` (issued in order) have."""
    fut = torch.futures.collect_all([w.get_future() for w in works]).then(lambda _: result)
    return _create_work_from_future(fut)


def _bytes(t):
    """A flat uint8 view of a contiguous tensor's memory (any dtype): numpy for a CPU tensor (the
    cheaper way into ringcomm), a torch view for a CUDA one (ringcomm takes it as device memory)."""
    flat = t.detach().reshape(-1).view(torch.uint8)
    return flat.numpy() if flat.device.type == "cpu" else flat


def _alike(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` contiguous on the device of ``like`` (the input of a call whose output is ``like``:
    a call's buffers must share one device)."""
    return x.detach().to(like.device).contiguous()


# ---- registration and rendezvous --------------------------------------------------------------
_WORLD_COMM: list = []    # the Communicator of the last init_process_group()


def _create(prefix_store, rank: int, size: int, timeout: timedelta):
    if not _WORLD_COMM:
        raise UsageError('torch.distributed backend "ringcomm" needs a ringcomm Communicator: '
                         'start it with ringcomm.init_process_group() instead of '
                         'torch.distributed.init_process_group(backend="ringcomm")')
    return RingcommProcessGroup(_WORLD_COMM[-1], rank, size)


def register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


def _rendezvous_store(comm, timeout: timedelta):
    """A TCPStore on rank 0, its address sent to the other ranks over the communicator itself."""
    host = os.environ.get("MASTER_ADDR")
    if host is None:
        single_node = getattr(comm, "node_count", 1) == 1
        host = "127.0.0.1" if single_node else socket.gethostname()
    store = None
    address = np.zeros(256, np.uint8)
    if comm.rank == 0:
        store = dist.TCPStore(host, int(os.environ.get("MASTER_PORT", 0)), comm.size, is_master=True,
                              timeout=timeout, wait_for_workers=False)
        text = f"{host} {store.port}".encode()
        address[:len(text)] = np.frombuffer(text, np.uint8)
    comm.broadcast(address, root=0)
    host, port = bytes(address).rstrip(b"\0").decode().split()
    if store is None:
        store = dist.TCPStore(host, int(port), comm.size, is_master=False, timeout=timeout)
    return store


def init_process_group(backend: Optional[str] = None, *, comm=None, timeout: Optional[float] = None):
    """Initialise torch.distributed with backend "ringcomm" for this mpirun job; returns the comm.

    ``backend`` picks the ringcomm backend (as for ``ringcomm.init``); the torch.distributed
    backend is always "ringcomm". Pass ``comm`` to reuse an existing Communicator.
    """
    if dist.is_initialized():
        raise UsageError("init_process_group got unexpected value for argument \"state\" (expected "
                         "torch.distributed not yet initialised, got an initialised default group)")
    if comm is None:
        from ..init import init
        comm = init(backend, timeout=timeout)
    seconds = timeout or getattr(comm, "timeout", None) or 1800.0
    td = timedelta(seconds=seconds)
    register()
    store = _rendezvous_store(comm, td)
    # Kept after init: dist.new_group(backend="ringcomm") over all ranks shares this communicator
    # (groups issue their collectives in one program order on every rank, so matching holds).
    _WORLD_COMM[:] = [comm]
    dist.init_process_group(backend=BACKEND, store=store, rank=comm.rank, world_size=comm.size, timeout=td)
    return comm
