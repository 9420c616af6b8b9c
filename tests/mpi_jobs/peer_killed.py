"""A rank killed mid-job whose peers live on (mpirun -disable-auto-cleanup): rank 1 SIGKILLs
itself in the middle of a loop of sends and receives around the ring, or of all-reduces; every
other rank writes what it raised, and when, to OUT_DIR/rank<R>.txt, then ends with os._exit
(MPICH's MPI_Finalize would wait for the dead rank forever: docs/reliability.md). Files, not
stdout: the launcher forwards the ranks' lines in pieces, and two of them once shared a line.

    mpirun -disable-auto-cleanup -n N setsid -w python peer_killed.py MODE COUNT OUT_DIR

MODE: p2p (around the ring), all_reduce, pairs (4 ranks: each sends to and receives from its
partner r ^ 1 alone), split (4 ranks: the odd and the even ranks each all-reduce and exchange on
a sub-communicator of their own, where rank 1 is rank 0), split_ring (split, the all-reduce
forced to the ring: a schedule's waits, not the window's). In pairs and split, the ranks that
never meet rank 1 (2 and 3; 0 and 2) stop after 3 s and write "untouched". Rank 1 writes the
moment it dies (wall clock) to OUT_DIR/died.txt first.
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
split = mode.startswith("split")
sub = comm.split(r % 2) if split else comm
apart = (mode == "pairs" and r // 2 != 0) or (split and r % 2 == 0)
algorithm = "ring" if mode == "split_ring" else None


def exchange(c, right, left):
    sent = c.send(x, right, async_op=True)
    c.recv(y, left)
    sent.wait()


def report(line):
    with open(os.path.join(out_dir, f"rank{r}.txt"), "w") as f:
        f.write(f"rank {r} at {time.time():.3f}: {line}\n")


comm.barrier()
start = time.time()
try:
    while True:
        # Ranks apart stop together, at the first call where either says it is time (2.0): one
        # that stopped alone would leave its partner waiting for a process that ended.
        x[0] = 2.0 if apart and time.time() - start > 3.0 else 1.0
        if mode == "p2p":
            exchange(comm, (r + 1) % n, (r - 1) % n)
        elif mode == "pairs":
            exchange(comm, r ^ 1, r ^ 1)
        else:
            sub.all_reduce(x, algorithm=algorithm)
            stop = x[0] > sub.size
            x[:] = 1
            if split:
                exchange(sub, (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size)
        if apart and (x[0] == 2.0 or y[0] == 2.0 if mode == "pairs" else stop):
            report("untouched")
            break
        if r == 1 and time.time() - start > 0.5:
            with open(os.path.join(out_dir, "died.txt"), "w") as f:
                f.write(f"{time.time():.3f}\n")
            os.kill(os.getpid(), signal.SIGKILL)
except ringcomm.CommError as err:
    report(f"{type(err).__name__}: {err}")
os._exit(0)
