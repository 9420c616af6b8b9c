"""One rank may not open its peers' descriptors through /proc/<pid>/fd (a hidepid /proc, say):
the whole node shares segments by name instead, says so once at RINGCOMM_DEBUG=info, and
collectives and allocate work as before.

    mpirun -n N python shm_fd_denied.py DENIED_RANK        (prints "rank R by_fd=... ok")
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import sys

import numpy as np
from mpi4py import MPI

from ringcomm.transport.shm import segments

if MPI.COMM_WORLD.Get_rank() == int(sys.argv[1]):
    def denied(pid, fd, nbytes, identity):
        raise PermissionError(f"/proc/{pid}/fd/{fd}: Permission denied (test)")
    segments.open_by_fd = denied

import ringcomm  # noqa: E402

comm = ringcomm.init()
rank, size = comm.rank, comm.size
bucket = comm.transport.allocate(1 << 20, np.float32)
assert comm.transport.node.owns(bucket)
bucket[...] = rank + 1
comm.all_reduce(bucket)
x = np.full(3 << 20, rank + 1.0, np.float32)
comm.all_reduce(x, algorithm="ring")
assert np.all(bucket == size * (size + 1) / 2) and np.all(x == size * (size + 1) / 2)
print(f"rank {rank} by_fd={comm.transport.node._by_fd} ok", flush=True)
