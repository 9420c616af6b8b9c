"""A pipe whose sender stops mid-message (SIGSTOP: the cells stop coming) is an error on both
ranks within the timeout, never a hang or a partial buffer passed off as received.

    RINGCOMM_SHM_CMA=0 mpirun -n 2 python shm_pipe_stalled.py
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import os
import signal
import time

import numpy as np
from mpi4py import MPI

import ringcomm
from ringcomm.transport.shm import pipe
from ringcomm.transport.shm.rings import PIPE

world = MPI.COMM_WORLD
comm = ringcomm.init(timeout=2.0)
shm = comm.transport.node
assert shm._pipe_ok, (shm.direct_reads, pipe.enabled())
pids = world.allgather(os.getpid())
n = 16 << 20   # 64 MiB of float32: 128 rings' worth, so the receiver stalls long before the end
if comm.rank == 1:
    x = np.arange(n, dtype=np.float32)
    work = comm.send(x, 0, async_op=True)
    assert shm._inflight[shm.local[0]][-1].seg == PIPE
    world.Barrier()
    os.kill(os.getpid(), signal.SIGSTOP)   # rank 0 continues us once its receive has failed
    try:
        work.wait()
        raise AssertionError("the send completed though its receiver gave up")
    except ringcomm.CommTimeoutError as err:
        assert "send p2p#1 to rank 0" in str(err), err
else:
    world.Barrier()
    time.sleep(0.2)   # rank 1 is stopped by now, its ring full
    out = np.zeros(n, np.float32)
    start = time.monotonic()
    try:
        comm.recv(out, 1)
        raise AssertionError("the receive completed without its sender")
    except ringcomm.CommTimeoutError as err:
        assert time.monotonic() - start < 10, time.monotonic() - start
        assert "recv p2p#1 from rank 1" in str(err) and "timed out" in str(err), err
    finally:
        os.kill(pids[1], signal.SIGCONT)
    assert not out.view(np.uint8)[pipe.CELLS * pipe.CELL:].any()   # what the full ring held, nothing beyond
world.Barrier()
print(f"rank {comm.rank} ok", flush=True)
