"""Backend "mpi": the MPI library's own collectives (MPI_Iallreduce, MPI_Ibcast, ...) via mpi4py.

Buffers only: mpi4py hands MPI the array's address, nothing is pickled. The nonblocking forms
are used so that a wait can honour the communicator's deadline (a blocking MPI_Allreduce cannot
time out) and notice an abort; MPI picks its algorithms itself.

MPI has no float16 or bfloat16 reductions. Those dtypes travel as 16-bit words and reduce with a
user-defined MPI_Op that runs ringcomm's own pairwise kernels (ops.reducer), so every pairwise
step rounds once to the storage type exactly as on the "ringcomm" backend.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..core.ops import DType, ReduceOp, reducer
from ..core.schedule import chunk
from ..errors import CommTimeoutError
from ..transport.mpi import MPIRequest
from .reference import ReferenceCommunicator

_NATIVE_TYPES = {
    "float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int32": MPI.INT32_T, "int64": MPI.INT64_T,
    "uint8": MPI.UINT8_T,
}
_NATIVE_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PROD: MPI.PROD,
               ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX}
_user_ops: dict = {}


def _datatype(dtype: DType):
    return _NATIVE_TYPES.get(dtype.name, MPI.UINT16_T)   # fp16 and bf16: 16-bit words


def _mpi_op(op: ReduceOp, dtype: DType):
    if dtype.name in _NATIVE_TYPES:
        return _NATIVE_OPS[op]
    key = (op.value, dtype.name)
    if key not in _user_ops:
        kernel, storage = reducer(op, dtype), dtype.storage

        def user_op(inbuf, inoutbuf, datatype):   # MPI semantics: inout = in OP inout
            kernel(np.frombuffer(inoutbuf, storage), np.frombuffer(inbuf, storage))
        _user_ops[key] = MPI.Op.Create(user_op, commute=True)
    return _user_ops[key]


class MPINativeCommunicator(ReferenceCommunicator):
    backend = "mpi"
    library = "MPI"

    def __init__(self, world, topology, *, timeout):
        super().__init__(world, topology, timeout=timeout)
        self._abandoned: list = []   # timed-out requests and the memory MPI may still write

    def _collective(self, name, algorithm, work, buf, seq, *, op=None, root=0):
        comm = self.world
        spec = [work, MPI.BYTE if buf is None else _datatype(buf.dtype)]
        mop = None if op is None else _mpi_op(op, buf.dtype)
        keep = [work]
        if name == "all_reduce":
            req = comm.Iallreduce(MPI.IN_PLACE, spec, mop)
        elif name == "broadcast":
            req = comm.Ibcast(spec, root)
        elif name == "reduce":
            if self.rank == root:
                req = comm.Ireduce(MPI.IN_PLACE, spec, mop, root)
            else:
                req = comm.Ireduce(spec, None, mop, root)
        elif name == "all_gather":
            req = comm.Iallgather(MPI.IN_PLACE, spec)
        elif name == "reduce_scatter":
            # MPI forbids aliasing the send and receive buffers; W is already a private copy.
            off, n = chunk(work.size, self.size, self.rank)
            mine = np.empty(n, work.dtype)
            keep.append(mine)
            req = comm.Ireduce_scatter_block(spec, [mine, spec[1]], mop)
        elif name == "barrier":
            req = comm.Ibarrier()
        else:  # pragma: no cover - the Communicator only calls the collectives above
            raise AssertionError(name)
        if not MPIRequest(req, self.transport).wait(self.timeout):
            self._abandoned.append((req, keep))
            raise CommTimeoutError(f"{self._describe(name, seq, work, buf)} on rank {self.rank}: "
                                   f"MPI did not complete it within {self.timeout:g} s; a peer may "
                                   f"not have entered it or may have entered a different collective")
        if name == "reduce_scatter":
            work[off:off + n] = mine
