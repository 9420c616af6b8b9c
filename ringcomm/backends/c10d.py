"""What the gloo and NCCL backends share: torch.distributed process groups arranged over MPI.

The process group is built directly (ProcessGroupGloo / ProcessGroupNCCL) rather than through
``init_process_group``, so a job may hold several communicators and torch's global default group
stays free for the user. Rendezvous needs no MASTER_ADDR: rank 0 opens a TCPStore on a port the
kernel picks (port 0, so no race for a "free" port) and broadcasts the address with MPI. Which
torch call runs each collective is written in the collective's own file (``Collective.c10d``);
``C10dBackend`` supplies the process group, tensor views of the call's buffers and the options.
"""
from __future__ import annotations

import datetime
import os
import socket
import threading
import warnings

import numpy as np
import torch
import torch.distributed as dist

from ..bootstrap import allgather_within
from ..point_to_point import not_passive, with_deadline
from ..core.ops import DType, ReduceOp
from ..errors import CommError
from ..transport.polling import join_threads
from .reference import ReferenceCommunicator, comm_error

LOOPBACK = "127.0.0.1"
# What a forked child must never destroy (C10dBackend._disown): kept until the child ends.
_PARENTS: list = []
_OPS = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVG: dist.ReduceOp.SUM, ReduceOp.PREMUL_SUM: dist.ReduceOp.SUM,
        ReduceOp.PROD: dist.ReduceOp.PRODUCT, ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.MAX: dist.ReduceOp.MAX,
        ReduceOp.BAND: dist.ReduceOp.BAND, ReduceOp.BOR: dist.ReduceOp.BOR, ReduceOp.BXOR: dist.ReduceOp.BXOR}
_TORCH = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "int8": torch.int8,
          "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}


def store_address(world, timeout: float, what: str) -> str:
    """Loopback when every rank runs on this host; else MASTER_ADDR, else rank 0's hostname."""
    hosts = allgather_within(world, socket.gethostname(), timeout, f"{what}: hosts")
    if len(set(hosts)) == 1:
        return LOOPBACK
    chosen = os.environ.get("MASTER_ADDR") or hosts[0]
    return allgather_within(world, chosen, timeout, f"{what}: rank 0's address")[0]


def rendezvous(world, timeout: float, backend: str):
    """A TCPStore every rank is connected to, set up over MPI, each exchange bounded by
    ``timeout`` (bootstrap.allgather_within). Raises CommError on all ranks."""
    what = f"init(backend={backend!r})"
    host, rank, size = store_address(world, timeout, what), world.Get_rank(), world.Get_size()
    delta = datetime.timedelta(seconds=timeout)
    store, port, error = None, None, None
    if rank == 0:
        try:
            store = dist.TCPStore(host, 0, size, True, timeout=delta, wait_for_workers=False)
            port = store.port
        except Exception as err:  # every rank must learn of it, or the others would wait forever
            error = f"rank 0 could not open a TCPStore on {host}: {err}"
    port, error = allgather_within(world, (port, error), timeout, f"{what}: rank 0's store")[0]
    if error is None and rank != 0:
        try:
            store = dist.TCPStore(host, port, size, False, timeout=delta)
        except Exception as err:
            error = f"rank {rank} could not reach the TCPStore at {host}:{port}: {err}"
    errors = [e for e in allgather_within(world, error, timeout, f"{what}: connections to the store") if e]
    if errors:
        raise CommError(f"init(backend={backend!r}): rendezvous failed: {'; '.join(errors)}")
    return store, host


class C10dBackend(ReferenceCommunicator):
    """A reference backend over one torch.distributed process group (``pg``)."""
    pg = None
    _waiters: frozenset = frozenset()   # send/recv threads (``_waited``) that may not have ended
    _given_up: frozenset = frozenset()  # those a join already waited its whole bound for

    def close(self) -> None:
        super().close()       # withdraws what nobody matched: cancel() aborts the group under its thread
        self.join_waiters()

    def _disown(self) -> None:
        """A forked child shares the parent's sockets (and on rank 0 the store's server): a
        group or store destroyed here shuts them down under the parent, whose next collective on
        that group then waited out gloo's timeout. The child keeps them, unused, until it ends."""
        super()._disown()
        _PARENTS.append((self.pg, getattr(self, "_store", None)))

    def tensor(self, flat, dtype: DType) -> torch.Tensor:
        """A torch view sharing the memory of a call's flat array (bf16 is stored as uint16):
        host arrays through ``torch.from_numpy``, device arrays (cupy views of CUDA tensors or
        of cupy arrays) through DLPack, which hands torch the device memory itself."""
        if isinstance(flat, torch.Tensor):
            return flat
        if not isinstance(flat, np.ndarray):
            t = torch.from_dlpack(flat)
            return t.view(torch.bfloat16) if dtype.name == "bfloat16" else t
        host = flat.view(np.int16) if dtype.name == "bfloat16" else flat
        if flat.flags.writeable:
            t = torch.from_numpy(host)
        else:   # an input the call only reads (core/buffers.py): torch warns that it cannot write it
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                t = torch.from_numpy(host)
        return t.view(torch.bfloat16) if dtype.name == "bfloat16" else t

    @staticmethod
    def allreduce_options(op: ReduceOp):
        opts = dist.AllreduceOptions()
        opts.reduceOp = _OPS[op]
        return opts

    @staticmethod
    def broadcast_options(root: int):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        return opts

    @staticmethod
    def reduce_options(op: ReduceOp, root: int):
        opts = dist.ReduceOptions()
        opts.reduceOp, opts.rootRank, opts.rootTensor = _OPS[op], root, 0
        return opts

    @staticmethod
    def reduce_scatter_options(op: ReduceOp):
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _OPS[op]
        return opts

    @staticmethod
    def gather_options(root: int):
        opts = dist.GatherOptions()
        opts.rootRank = root
        return opts

    @staticmethod
    def scatter_options(root: int):
        opts = dist.ScatterOptions()
        opts.rootRank = root
        return opts

    @staticmethod
    def all_to_all_options():
        return dist.AllToAllOptions()

    def barrier_options(self):
        return dist.BarrierOptions()

    def _start_call(self, call):
        try:
            return call.collective.c10d(self, call)
        except RuntimeError as err:   # refused at once (an op or dtype the library lacks)
            raise comm_error(self._describe(call, 0), self.library, err) from err

    def _post(self, call, work):
        """The library's own send or receive. Backend gloo replaces this with framed messages
        (framed.py); NCCL's, untried here on a GPU, keep the library's own pairing, which does
        not compare lengths either."""
        handle, _ = self._start_call(call)

        def run() -> None:
            handle.wait()
            if call.name == "recv" and call.peer is None:
                work.source = handle._source_rank()
        return self._waited(run, work)

    def _waited(self, run, work) -> tuple:
        """``_post``'s (test, cancel, passive) for a send or receive that ``run`` completes:
        torch's send/recv Works complete only inside wait() (is_completed() stays False until
        then), so a thread runs it and the progress thread polls that thread's outcome."""
        done, failed = threading.Event(), []

        def waiter() -> None:
            try:
                run()
            except RuntimeError as err:   # torch reports timeouts and lost peers as RuntimeError
                failed.append(comm_error(work.description, self.library, err))
            except CommError as err:
                failed.append(err)
            done.set()
        thread = threading.Thread(target=waiter, daemon=True, name=f"ringcomm-{self.library}-p2p")
        self._waiters = frozenset(t for t in self._waiters if t.is_alive()) | {thread}
        thread.start()

        def test() -> bool:
            if failed:
                raise failed[0]
            return done.is_set()

        def cancel() -> None:
            # torch's Work cannot withdraw a send or receive, and a thread left waiting in the
            # library made torch abort the process at exit ("terminate called without an
            # active exception": gloo, an unreceived send, then close). Closing is the group's
            # end anyway: aborting it now lets that thread go; join_waiters sees it end.
            pg = self.pg
            if not done.is_set() and pg is not None and hasattr(pg, "abort"):
                pg.abort()
        return with_deadline(test, self.timeout, work, self.transport.aborted_reason), cancel, not_passive

    def join_waiters(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` seconds in all) for every send/recv thread to end, not just
        to finish waiting: the thread drops its torch Work after it has said it is done, and a
        Work's destructor takes the GIL back. Doing that while the interpreter exits killed
        the thread inside the destructor (Python ends threads that ask for the GIL then), and
        torch aborted the process: "terminate called without an active exception" after
        every check of tests/mpi_jobs/unreceived_at_close.py had passed, 1 run in 20-30.
        A thread one join gave up on is not waited for again: closing the world joins twice (its
        own close, then the release of the group), and a thread stuck in the library made that
        close take both bounds."""
        left = frozenset(join_threads(self._waiters - self._given_up, timeout))
        self._given_up = frozenset(t for t in self._given_up if t.is_alive()) | left
        self._waiters = self._given_up
