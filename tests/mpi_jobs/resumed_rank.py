"""A rank stopped (SIGSTOP: a debugger, a host swapping) inside a large direct collective, resumed
after its peers timed out and went on with their buffers. The peers raise CommTimeoutError at
their deadline; the resumed rank must raise too, and must not write into the peers' buffers,
which are theirs again. It once returned normally with values read out of the reused buffers
(all_reduce: -12 and 6 where 6 was due), and kept writing reduced chunks into them.

    mpirun -n 3 python resumed_rank.py all_reduce|all_reduce_empty|reduce_scatter|all_gather
    (prints "resumed-rank ok" on rank 0)
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import ringcomm

case = sys.argv[1]
pids = MPI.COMM_WORLD.allgather(os.getpid())
# Rank 1 stops as it starts reading its peers' buffers: they read its input and write its output
# meanwhile, post the call's last round and wait for its in vain. (Stopped before the reads,
# at "one_shot", it found their poison where the round it waits for was posted, and raised.)
os.environ["RINGCOMM_FAULT"] = "direct:1:STOP"
comm = ringcomm.init(timeout=2)
rank, n = comm.rank, comm.size
count = 8_000_000
make = ringcomm.empty if case.endswith("_empty") else np.empty
x = make(count, np.float32)
x[...] = rank + 1
out = make(count * n if case == "all_gather" else count // n, np.float32)
out[...] = 0
comm.barrier()
try:
    if case.startswith("all_reduce"):
        comm.all_reduce(x, algorithm="direct")
    elif case == "reduce_scatter":
        comm.reduce_scatter(out, x[:count // n * n], algorithm="direct")
    else:
        comm.all_gather(out, x, algorithm="direct")
    raised = None
except ringcomm.CommError as err:
    raised = err
if rank != 1:
    assert isinstance(raised, ringcomm.CommTimeoutError), (rank, raised)
    x[...] = -7   # the caller has its buffers back and uses them
    out[...] = -7
    if rank == 0:
        time.sleep(0.5)
        os.kill(pids[1], signal.SIGCONT)
    time.sleep(3)   # the resumed rank runs on meanwhile: it must not write here any more
    assert np.all(x == -7) and np.all(out == -7), (rank, np.unique(x), np.unique(out))
else:
    assert isinstance(raised, ringcomm.PeerAbortedError) and "gave up" in str(raised), (rank, raised)
MPI.COMM_WORLD.Barrier()
if rank == 0:
    print("resumed-rank ok", flush=True)
# Nobody leaves before the verdict is out: a rank leaving without MPI_Finalize (the communicator
# is broken; nothing more to close) has the launcher kill the ranks still running.
MPI.COMM_WORLD.Barrier()
sys.stdout.flush()
os._exit(0)
