"""A rank killed mid-job whose peers live on (mpirun -disable-auto-cleanup): rank 1 SIGKILLs
itself in the middle of a loop of sends and receives around the ring, or of all-reduces; every
other rank writes what it raised, and when, to OUT_DIR/rank<R>.txt, then ends with os._exit
(MPICH's MPI_Finalize would wait for the dead rank forever: docs/reliability.md). Files, not
stdout: the launcher forwards the ranks' lines in pieces, and two of them once shared a line.

    mpirun -disable-auto-cleanup -n N setsid -w python peer_killed.py p2p|all_reduce COUNT OUT_DIR

Rank 1 writes the moment it dies (wall clock) to OUT_DIR/died.txt first.
"""
import os
import signal
import sys
import time

import numpy as np

import ringcomm

mode, count, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
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
            with open(os.path.join(out_dir, "died.txt"), "w") as f:
                f.write(f"{time.time():.3f}\n")
            os.kill(os.getpid(), signal.SIGKILL)
except ringcomm.CommError as err:
    with open(os.path.join(out_dir, f"rank{r}.txt"), "w") as f:
        f.write(f"rank {r} at {time.time():.3f}: {type(err).__name__}: {err}\n")
os._exit(0)
