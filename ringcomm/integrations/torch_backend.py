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

Every call becomes async collectives on the ringcomm Communicator (its progress thread runs them
in issue order) and returns a ``torch_work.Work``: ``wait()`` raises the collective's error, its
futures are typed the way torch's C++ hooks expect, and their callbacks may block without
stalling later collectives (torch_work.py says how). Tensors the communicator cannot take in
place (CUDA for a CPU-only backend, non-contiguous ones) go through a contiguous host copy,
written back only once the collective has succeeded. CUDA tensors stay on the device where the
communicator lists "cuda" in ``comm.devices`` (ringcomm over CUDA IPC, nccl, gloo).

Groups and the communicator: the world group and every ``dist.new_group(backend="ringcomm")``
over all ranks share one Communicator (groups issue in one program order on every rank, so
matching holds). Each group bounds its collectives by its own timeout; ``abort()`` aborts the
shared communicator; ``shutdown()`` closes it once the last group is gone, if
``init_process_group`` created it.
"""
from __future__ import annotations

import math
import os
import socket
import threading
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
)
from torch.distributed.constants import default_pg_timeout

from ..errors import CommError, UsageError, bad_type, bad_value
from .torch_engine import Engine
from .torch_work import ABORT_GRACE, Pending, Work, call_site, seconds

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


class _Shared:
    """One Communicator, the process groups that issue on it, and the Engine that orders and
    completes their calls (torch_engine.py)."""

    def __init__(self, comm, owned: bool):
        self.comm, self.owned = comm, owned   # owned: init_process_group made it, so closes it
        self.engine = Engine(f"ringcomm-c10d-{comm.rank}")
        self.groups: list = []
        self.aborted = False
        self.lock = threading.Lock()

    def join(self, group) -> None:
        with self.lock:
            self.groups.append(group)
        self.retime()

    def leave(self, group) -> bool:
        """Forget ``group``; True when it was the last one."""
        with self.lock:
            if group in self.groups:
                self.groups.remove(group)
            return not self.groups

    def retime(self) -> None:
        # ringcomm's own deadline (which names the peer it waited for) must not cut a group's
        # longer timeout short; a group's shorter one is enforced as its calls settle
        # (torch_work.Pending.settle aborts the communicator).
        with self.lock:
            if self.groups:
                self.comm.timeout = max(g.timeout for g in self.groups)

    def abort(self, reason: str) -> None:
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
        self.comm.abort(reason)
        self.engine.fail_queued(CommError(f"not issued: {reason}"))


class RingcommProcessGroup(dist.ProcessGroup):
    """c10d process group whose collectives run on a ringcomm Communicator."""

    def __init__(self, shared: _Shared, rank: int, size: int, timeout: Optional[float] = None):
        super().__init__(rank, size)
        comm = shared.comm
        if (rank, size) != (comm.rank, comm.size):
            raise UsageError(f'ringcomm process group got unexpected value for argument "rank, size" '
                             f'(expected the whole job ({comm.rank}, {comm.size}); sub-groups are not '
                             f'supported, got ({rank}, {size}))')
        self.comm, self._shared = comm, shared
        self._rank, self._size = rank, size
        # Seconds any one collective of this group may take; None: the communicator's.
        self.timeout = float(timeout if timeout is not None else comm.timeout or default_pg_timeout.total_seconds())
        self._closed: Optional[str] = None
        self.engine = shared.engine
        shared.join(self)

    @property
    def comm_seconds(self) -> float:
        """Seconds a collective of this communicator was in flight (which may overlap compute)."""
        return self.engine.busy_seconds

    def getBackendName(self) -> str:
        return BACKEND

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"RingcommProcessGroup(rank={self._rank}, size={self._size}, comm={self.comm!r})"

    # ---- timeouts and lifetime ----------------------------------------------------------------
    def set_timeout(self, timeout) -> None:
        value = seconds(timeout)
        if value is None or not math.isfinite(value):
            raise bad_value("set_timeout", "timeout", "a positive timedelta", timeout)
        self.timeout = value
        self._shared.retime()

    def abort_communicator(self, reason: str) -> None:
        """Abort the shared communicator: every rank's waits on it end with an error."""
        self._shared.abort(reason)

    def abort(self) -> None:
        """dist.distributed_c10d._abort_process_group(): abort the communicator; pending and
        queued collectives fail at once."""
        if self._closed == "aborted":
            return
        self._closed = "aborted"
        self.abort_communicator(f"process group aborted on rank {self._rank} (ProcessGroup.abort)")
        if self._shared.leave(self):
            self.engine.close()

    def shutdown(self) -> None:
        """dist.destroy_process_group(): let issued collectives finish (or fail on their deadline),
        then close the communicator if this was its last group and init_process_group made it."""
        if self._closed is not None:
            return
        self._closed = "shut down"
        self.engine.drain(self.timeout + 2 * ABORT_GRACE)
        if self._shared.leave(self):
            self.engine.close()
            if self._shared.owned and not self._shared.aborted:
                self.comm.close()
            if _WORLD and _WORLD[-1] is self._shared:
                _WORLD.clear()

    # ---- plumbing ---------------------------------------------------------------------------
    def _submit(self, collective: str, launches: list, result: list, after: Callable = None, opts=None):
        """One c10d Work for ``launches`` (ringcomm calls, issued in order by the Engine).

        ``opts.asyncOp`` is False when torch's Python API waits at once (dist.all_reduce without
        async_op): then the Engine may run the collective in this thread.
        """
        if self._closed is not None:
            raise bad_value(collective, "group", "a live process group", f"a group that was {self._closed}")
        pending = Pending(self, collective, launches, result, after, call_site())
        self.engine.submit(pending, blocking=not getattr(opts, "asyncOp", True))
        return Work(pending)

    def _staged(self, t: torch.Tensor):
        """(what the communicator works on: t's own memory or a host copy, write-back or None)."""
        if _accepts(self.comm, t):
            return _host_view(t), None
        host = t.detach().to("cpu", copy=True).contiguous()
        return _host_view(host), lambda: t.copy_(host)

    @staticmethod
    def _one(tensors: list, collective: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise bad_value(collective, "tensors", "one tensor per process", f"{len(tensors)} tensors")
        return tensors[0]

    def _all_reduce_launch(self, t: torch.Tensor, op: str):
        work_t, back = self._staged(t)
        return _call(self.comm.all_reduce, work_t, op=op), back

    # ---- all-reduce --------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        t = self._one(tensors, "allreduce")
        launch, back = self._all_reduce_launch(t, _op(opts or AllreduceOptions(), "allreduce"))
        return self._submit("allreduce", [launch], tensors, back, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op(opts or AllreduceCoalescedOptions(), "allreduce_coalesced")
        staged = [self._all_reduce_launch(t, op) for t in tensors]
        return self._submit("allreduce_coalesced", [launch for launch, _ in staged], tensors,
                            _all([back for _, back in staged]), opts)

    # ---- broadcast / reduce -----------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        t = self._one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        work_t, back = self._staged(t)
        # Bytes: a broadcast moves data without arithmetic, so any dtype (bool too) can travel.
        raw = _bytes(work_t)
        return self._submit("broadcast", [_call(self.comm.broadcast, raw, root=root)], tensors, back, opts)

    def reduce(self, tensors, opts=None):
        t = self._one(tensors, "reduce")
        opts = opts or ReduceOptions()
        op = _op(opts, "reduce")
        work_t, back = self._staged(t)
        launch = _call(self.comm.reduce, work_t, root=opts.rootRank, op=op)
        return self._submit("reduce", [launch], tensors, back, opts)

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
        return self._submit("allgather", [_call(self.comm.all_gather, gathered, xin)], outs, scatter_back, opts)

    def _all_gather_launch(self, output, input):
        if output.numel() != self._size * input.numel() or output.dtype != input.dtype:
            raise bad_value("all_gather_into_tensor", "output_tensor",
                            f"{self._size * input.numel()} elements of {input.dtype}",
                            f"{output.numel()} elements of {output.dtype}")
        out_t, back = self._staged(output)
        xin = _bytes(_alike(input, out_t))
        out_raw = _bytes(out_t)
        return _call(self.comm.all_gather, out_raw, xin), back

    def all_gather_single(self, output, input, opts=None):
        launch, back = self._all_gather_launch(output, input)
        return self._submit("all_gather_into_tensor", [launch], [output], back, opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        staged = [self._all_gather_launch(o, i) for o, i in zip(outputs, inputs)]
        return self._submit("all_gather_into_tensor_coalesced", [launch for launch, _ in staged], outputs,
                            _all([back for _, back in staged]), opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ---- reduce-scatter ----------------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = self._one(output_tensors, "reduce_scatter")
        chunks = self._one(input_tensors, "reduce_scatter")
        if len(chunks) != self._size:
            raise bad_value("reduce_scatter", "input_list", f"{self._size} tensors", len(chunks))
        return self.reduce_scatter_single(out, torch.cat([c.reshape(-1) for c in chunks]), opts)

    def _reduce_scatter_launch(self, output, input, op: str):
        if input.numel() != self._size * output.numel():
            raise bad_value("reduce_scatter_tensor", "input", f"{self._size * output.numel()} elements",
                            f"{input.numel()} elements")
        out_t, back = self._staged(output)
        x = _host_view(_alike(input, out_t))
        return _call(self.comm.reduce_scatter, out_t.reshape(-1), x.reshape(-1), op=op), back

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts or ReduceScatterOptions(), "reduce_scatter")
        launch, back = self._reduce_scatter_launch(output, input, op)
        return self._submit("reduce_scatter_tensor", [launch], [output], back, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = _op(opts or ReduceScatterOptions(), "reduce_scatter")
        staged = [self._reduce_scatter_launch(o, i, op) for o, i in zip(outputs, inputs)]
        return self._submit("reduce_scatter_tensor_coalesced", [launch for launch, _ in staged], outputs,
                            _all([back for _, back in staged]), opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- barrier ---------------------------------------------------------------------------------
    def barrier(self, opts=None):
        return self._submit("barrier", [_call(self.comm.barrier)], [], None, opts)


def _call(collective: Callable, *args, **kwargs) -> Callable:
    """``launch(async_op=True)``: the ringcomm call, async (a Work) or synchronous (run inline)."""
    return lambda async_op=True: collective(*args, async_op=async_op, **kwargs)


def _all(callbacks: list) -> Optional[Callable]:
    """One write-back that runs every one of ``callbacks`` (None entries skipped)."""
    todo = [c for c in callbacks if c is not None]
    if not todo:
        return None

    def run():
        for c in todo:
            c()
    return run


# numpy views made here, not with Tensor.numpy(): that marks the storage non-resizable for good,
# and torch's batched PowerSGD hook resizes DDP's bucket in place.
_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
          torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8}


class _Memory:
    """A contiguous CPU tensor's memory for numpy, by address; the array's ``base``, so the
    tensor lives as long as any view of it (a temporary ``.contiguous()`` copy included)."""

    __slots__ = ("tensor", "__array_interface__")

    def __init__(self, t: torch.Tensor, dtype):
        dtype = np.dtype(dtype)
        self.tensor = t
        self.__array_interface__ = {"data": (t.data_ptr(), False), "typestr": dtype.str, "version": 3,
                                    "shape": (t.numel() * t.element_size() // dtype.itemsize,)}


def _memory(t: torch.Tensor, dtype) -> np.ndarray:
    """A flat, writable numpy array of ``dtype`` over a contiguous CPU tensor's memory."""
    if t.numel() == 0:
        return np.empty(0, dtype)
    return np.asarray(_Memory(t, dtype))


def _host_view(t: torch.Tensor):
    """What a reducing collective gets: a numpy view of a CPU tensor, or the tensor itself
    (device tensors; bfloat16, which numpy lacks and the communicator must know as such)."""
    if t.device.type != "cpu" or t.dtype not in _NUMPY:
        return t
    return _memory(t, _NUMPY[t.dtype])


def _bytes(t):
    """A flat uint8 view of a contiguous tensor's memory (any dtype): for data movement. numpy for
    a CPU tensor; a torch view for a CUDA one (the communicator takes it as device memory)."""
    if isinstance(t, np.ndarray):
        return t.reshape(-1).view(np.uint8)
    if t.device.type != "cpu":
        return t.detach().reshape(-1).view(torch.uint8)
    return _memory(t, np.uint8)


def _alike(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` contiguous on the device of ``like`` (the input of a call whose output is ``like``:
    a call's buffers must share one device)."""
    return x.detach().to(like.device).contiguous()


# ---- registration and rendezvous --------------------------------------------------------------
_WORLD: list = []    # the _Shared of the last init_process_group(), while any of its groups lives


def _create(prefix_store, rank: int, size: int, timeout: timedelta):
    if not _WORLD:
        raise UsageError('torch.distributed backend "ringcomm" needs a ringcomm Communicator: '
                         'start it with ringcomm.init_process_group() instead of '
                         'torch.distributed.init_process_group(backend="ringcomm")')
    # dist.new_group() without a timeout passes torch's 30-minute default: that group takes the
    # communicator's timeout instead (RINGCOMM_TIMEOUT or init's), like the world group.
    explicit = None if timeout == default_pg_timeout else seconds(timeout)
    return RingcommProcessGroup(_WORLD[-1], rank, size, explicit)


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
    # Rank 0 must not run ahead and destroy the store (dist.destroy_process_group) before every
    # rank has connected: torch's init_process_group does not wait for them.
    comm.barrier()
    return store


def _check_timeout(timeout) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise bad_type("init_process_group", "timeout", "a number of seconds or None", type(timeout).__name__)
    if not (timeout > 0 and math.isfinite(timeout)):
        raise bad_value("init_process_group", "timeout", "a finite number of seconds > 0", timeout)


def init_process_group(backend: Optional[str] = None, *, comm=None, timeout: Optional[float] = None):
    """Initialise torch.distributed with backend "ringcomm" for this mpirun job; returns the comm.

    ``backend`` picks the ringcomm backend (as for ``ringcomm.init``); the torch.distributed
    backend is always "ringcomm". Pass ``comm`` to reuse an existing Communicator (it stays
    open after ``dist.destroy_process_group()``; one made here is closed then). ``timeout``
    (seconds): the world group's timeout, and the communicator's.
    """
    if dist.is_initialized():
        raise UsageError("init_process_group got unexpected value for argument \"state\" (expected "
                         "torch.distributed not yet initialised, got an initialised default group)")
    _check_timeout(timeout)
    owned = comm is None
    if owned:
        from ..init import init
        comm = init(backend, timeout=timeout)
    td = timedelta(seconds=timeout or getattr(comm, "timeout", None) or default_pg_timeout.total_seconds())
    register()
    store = _rendezvous_store(comm, td)
    _WORLD[:] = [_Shared(comm, owned)]
    try:
        dist.init_process_group(backend=BACKEND, store=store, rank=comm.rank, world_size=comm.size, timeout=td)
    except BaseException:
        _WORLD.clear()
        raise
    return comm
