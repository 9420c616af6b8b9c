"""Fault injection: the rank RINGCOMM_FAULT=phase:rank:signal names gets the signal when it
reaches the phase; every other rank reports what it raised, and when.

    RINGCOMM_FAULT=ring:1:KILL mpirun -n N python shm_faults.py OUT_DIR [names] [survive]

With "names" the node shares segments by name (segments.py), as where /proc/<pid>/fd is closed
to peers: the mode with a window in which a killed job leaves files for the next one to sweep.
With "survive" (the job runs under ``mpirun -disable-auto-cleanup``, so a killed rank leaves its
peers alive) each rank ends with ``os._exit`` once it has reported: MPICH's MPI_Finalize would
wait for the dead rank forever (docs/reliability.md, known limits).

Every rank runs the same sequence, one step per phase (ringcomm/diagnostics/faults.py):
init (setup), allocate (segment), an 8 MiB ring all-reduce through the staging pool (ring, and
pool_full: the test sets RINGCOMM_SHM_POOL=1M so the ring's 1 MiB segments wait for room),
one-shot all-reduces (one_shot), a 16 MiB ring all-reduce at RINGCOMM_SHM_CMA_MIN=16M (cma), a
4 MiB direct all-reduce (direct), and DDP steps whose bucket hook fires the ddp_bucket phase itself.

Each rank writes OUT_DIR/pid<R> first, then OUT_DIR/rank<R>.txt: "rank R at T: OUTCOME", T its
wall-clock time (time.time(): the victim's fault line on stderr has the same clock).
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import ringcomm
from ringcomm.diagnostics import faults
from ringcomm.transport.shm import ShmTransport

out_dir = sys.argv[1]
rank = MPI.COMM_WORLD.Get_rank()
with open(os.path.join(out_dir, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
modes = set(sys.argv[2:])
if "names" in modes:
    ShmTransport._by_fd = False


def ddp_steps(comm) -> None:
    import torch
    from torch import nn

    import ddp
    from ddp import comm_hooks

    def launch(state, bucket):   # the moment a bucket's all-reduce starts
        faults.fire("ddp_bucket", comm.rank)
        return comm_hooks.allreduce_hook(state, bucket)
    torch.manual_seed(0)
    model = ddp.DistributedDataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8)), comm,
                                        bucket_cap_mb=0.25, first_bucket_mb=0.25)
    model.register_comm_hook(None, launch)
    for _ in range(2):
        model(torch.randn(4, 256)).square().mean().backward()


try:
    comm = ringcomm.init()                                                    # setup
    comm.barrier()
    bucket = comm.transport.allocate(1 << 20, np.float32)                     # segment
    x = np.ones(2 << 20, np.float32)
    comm.all_reduce(x, algorithm="ring")                                      # ring, pool_full
    assert np.all(x == comm.size), x[:4]
    for _ in range(3):
        comm.all_reduce(np.ones(64, np.float32), algorithm="one_shot")        # one_shot
    big = np.ones(4 << 20, np.float32)
    comm.all_reduce(big, algorithm="ring")                                    # cma
    comm.all_reduce(np.ones(1 << 20, np.float32), algorithm="direct")          # direct
    ddp_steps(comm)                                                           # ddp_bucket
    comm.barrier()
    outcome = "ok"
except ringcomm.CommError as err:
    outcome = f"{type(err).__name__}: {err}"
with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
    f.write(f"rank {rank} at {time.time():.3f}: {outcome}\n")
if "survive" in modes:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
