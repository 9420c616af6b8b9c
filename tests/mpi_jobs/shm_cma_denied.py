"""Direct reads or writes (CMA) denied on one rank, as seccomp or ptrace rules deny them in
containers: the whole node falls back to the staging pool, silently, and collectives stay right.

    mpirun -n N python shm_cma_denied.py DENIED_RANK read|write

Prints "rank R direct_reads='...'" and "rank R ok".
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import ctypes
import errno
import sys

import numpy as np
from mpi4py import MPI

from ringcomm.transport.shm import cma

if MPI.COMM_WORLD.Get_rank() == int(sys.argv[1]):
    def denied(*args):
        ctypes.set_errno(errno.EPERM)
        return -1
    setattr(cma, f"_process_vm_{sys.argv[2]}v", denied)
    cma.compiled_transfer = None   # the ctypes road, whose call is replaced (a denial refuses both)

import ringcomm  # noqa: E402

comm = ringcomm.init()
rank, size = comm.rank, comm.size
node = comm.transport.node
node.cma_min_bytes = 0   # every collective would be read by CMA, were it allowed
count = 3_000_001        # several times a pool share: sends wait for room as receivers free it
x = np.arange(count, dtype=np.float32) + rank
comm.all_reduce(x, algorithm="ring")
assert np.array_equal(x, size * np.arange(count, dtype=np.float32) + sum(range(size))), x[:4]
y = np.full(count, float(rank))
comm.broadcast(y, root=size - 1)
assert np.all(y == size - 1), y[:4]
z = np.full(count, float(rank), np.float32)
gathered = np.empty(size * count, np.float32) if rank == 0 else None
comm.gather(gathered, z, root=0)
assert rank or np.array_equal(gathered, np.repeat(np.arange(size, dtype=np.float32), count)), gathered[::count]
print(f"rank {rank} direct_reads={node.direct_reads!r}", flush=True)
comm.transport.close()
print(f"rank {rank} ok")
