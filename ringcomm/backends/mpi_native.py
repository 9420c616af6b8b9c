"""Backend "mpi": the MPI library's own calls (MPI_Iallreduce, MPI_Ialltoallv, ...) via mpi4py.

Buffers only: mpi4py hands MPI the array's address, nothing is pickled. The nonblocking forms
are used so that a wait can honour the communicator's deadline (a blocking MPI_Allreduce cannot
time out) and notice an abort; MPI picks its algorithms itself. Which MPI call runs each
collective is written in the collective's own file (``Collective.mpi``).

MPI has no float16 or bfloat16 reductions. Those dtypes travel as 16-bit words and reduce with a
user-defined MPI_Op that runs ringcomm's own pairwise kernels (ops.reducer), so every pairwise
step rounds once to the storage type exactly as on the "ringcomm" backend. MPI's C_BOOL takes
only logical ops: a bool sum or max is a logical or, prod or min a logical and (as gloo does).
Device (CUDA) arrays are refused: this MPI is not CUDA-aware.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..point_to_point import not_passive, with_deadline
from ..core.ops import DType, ReduceOp, reducer
from ..errors import CommTimeoutError, MismatchError, UsageError
from ..transport.mpi import MPIRequest
from .reference import ReferenceCommunicator

_NATIVE_TYPES = {
    "float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int8": MPI.INT8_T, "int16": MPI.INT16_T,
    "int32": MPI.INT32_T, "int64": MPI.INT64_T, "uint8": MPI.UINT8_T, "bool": MPI.C_BOOL,
}
_NATIVE_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PREMUL_SUM: MPI.SUM,
               ReduceOp.PROD: MPI.PROD, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX,
               ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR, ReduceOp.BXOR: MPI.BXOR}
_BOOL_OPS = {ReduceOp.SUM: MPI.LOR, ReduceOp.MAX: MPI.LOR, ReduceOp.BOR: MPI.LOR, ReduceOp.PROD: MPI.LAND,
             ReduceOp.MIN: MPI.LAND, ReduceOp.BAND: MPI.LAND, ReduceOp.BXOR: MPI.LXOR}
_user_ops: dict = {}


class MPINativeCommunicator(ReferenceCommunicator):
    backend = "mpi"
    library = "MPI"
    MPI = MPI
    devices = ("cpu",)

    def __init__(self, world, topology, *, timeout, context=()):
        super().__init__(world, topology, timeout=timeout, context=context)
        self._abandoned: list = []   # timed-out requests and the memory MPI may still write

    # ---- what the collectives' mpi() ask for ----------------------------------------------------
    @staticmethod
    def datatype(dtype: DType):
        return _NATIVE_TYPES.get(dtype.name, MPI.UINT16_T)   # fp16 and bf16: 16-bit words

    @staticmethod
    def mpi_op(op: ReduceOp, dtype: DType):
        if dtype.name == "bool":
            return _BOOL_OPS[op]
        if dtype.name in _NATIVE_TYPES:
            return _NATIVE_OPS[op]
        key = (op.value, dtype.name)
        if key not in _user_ops:
            kernel, storage = reducer(op, dtype), dtype.storage

            def user_op(inbuf, inoutbuf, datatype):   # MPI semantics: inout = in OP inout
                kernel(np.frombuffer(inoutbuf, storage), np.frombuffer(inbuf, storage))
            _user_ops[key] = MPI.Op.Create(user_op, commute=True)
        return _user_ops[key]

    # ---- the seam ----------------------------------------------------------------------------------
    def _check_supported(self, call) -> None:
        if call.device != "cpu":   # mpi4py would hand MPI the device pointer
            raise UsageError(f"{call.name} on rank {self.rank}: backend 'mpi' takes host memory only (this MPI "
                             f"is not CUDA-aware), got memory on {call.device}; device memory goes through "
                             f"backend 'ringcomm' (CUDA IPC within a node) or 'nccl'")

    def _start_call(self, call):
        return call.collective.mpi(self, call)

    def _wait(self, handle, keep, what: str) -> None:
        if not MPIRequest(handle, self.transport).wait(self.timeout):
            self._abandoned.append((handle, keep))
            raise CommTimeoutError(f"{what} on rank {self.rank}: MPI did not complete it within {self.timeout:g} s; "
                                   f"a peer may not have entered it or may have entered a different collective")

    def _post(self, call, work):
        req, keep = call.collective.mpi(self, call)
        status = MPI.Status()
        expected = call.count * call.dtype.itemsize
        counts = self.transport   # what close() tells the peers (transport/mpi.py retire_communicator)
        if call.name == "send":
            counts.sent[call.peer] += 1

        def test() -> bool:
            try:
                if not req.Test(status):
                    return False
            except MPI.Exception as err:   # MPI_ERR_TRUNCATE: the message is longer than the receive
                raise MismatchError(f"{work.description}: the message does not fit the receive of "
                                    f"{expected} bytes ({str(err).splitlines()[0]})") from None
            if call.name == "recv":
                work.source = status.Get_source()
                counts.received[work.source] += 1
                got = status.Get_count(MPI.BYTE)
                if got != expected:
                    raise MismatchError(f"{work.description}: the message has {got} bytes, the receive "
                                        f"expected {expected}")
            return True
        return with_deadline(test, self.timeout, work, self.transport.aborted_reason), req.Cancel, not_passive

    def _sub_backend(self, sub_world, members, path):
        return MPINativeCommunicator(sub_world, self._sub_topology(members), timeout=self.timeout, context=path)
