"""A collective that a peer never joins raises CommTimeoutError within the timeout (no hang).

    mpirun -n 2 python shm_timeout.py
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import time

from mpi4py import MPI

import numpy as np

import ringcomm
from ringcomm.transport import factory

comm = ringcomm.init(timeout=1.0)
assert set(factory.describe(comm.transport).values()) == {"shm"}, factory.describe(comm.transport)
comm.all_reduce(np.ones(1 << 16, np.float32), algorithm="ring")   # both ranks: segments set up
if comm.rank == 0:
    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(1 << 16, np.float32), algorithm="ring")
        raise AssertionError("all_reduce completed without its peer")
    except ringcomm.CommTimeoutError as err:
        elapsed = time.monotonic() - start
        assert elapsed < 15, elapsed
        assert "timed out" in str(err) and "from rank" in str(err), err
MPI.COMM_WORLD.Barrier()
comm.transport.close()
print(f"rank {comm.rank} ok")
