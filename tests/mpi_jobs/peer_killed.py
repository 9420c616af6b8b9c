"""A rank killed mid-job whose peers live on (mpirun -disable-auto-cleanup): rank 1 SIGKILLs
itself in the middle of a loop of sends and receives around the ring, or of all-reduces; every
other rank prints what it raised and how long after the death, then ends with os._exit (MPICH's
MPI_Finalize would wait for the dead rank forever: docs/reliability.md).

    mpirun -disable-auto-cleanup -n N setsid -w python peer_killed.py p2p|all_reduce COUNT

Rank 1 prints the moment it dies (wall clock) to stderr first.
"""
import os
import signal
import sys
import time

import numpy as np

import ringcomm

mode, count = sys.argv[1], int(sys.argv[2])
comm = ringcomm.init()
r, n = comm.rank, comm.size
x, y = np.ones(count, np.float32), np.empty(count, np.float32)
comm.barrier()
start = time.time()
i = 0
try:
    while True:
        if mode == "p2p":
            sent = comm.send(x, (r + 1) % n, async_op=True)
            comm.recv(y, (r - 1) % n)
            sent.wait()
        else:
            comm.all_reduce(x)
            x[:] = 1
        i += 1
        if r == 1 and time.time() - start > 0.5:
            print(f"rank 1 dies at {time.time():.3f}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
except ringcomm.CommError as err:
    print(f"rank {r} at {time.time():.3f}: {type(err).__name__}: {err}", flush=True)
os._exit(0)
