"""``dist.init_process_group`` under mpirun (env:// without MASTER_ADDR: rank 0's store, its
address sent over MPI) with a rank that never calls it: the others fail at torch's timeout.

    mpirun -n 3 python late_process_group.py BACKEND SCENARIO

SCENARIO "never_mpi": rank 1 sleeps 600 s before anything, so MPI_Init waits for it; the others'
deadline ends the job with the reason on stderr (bootstrap.mpi_init_deadline; the test sets
RINGCOMM_MPI_INIT_TIMEOUT=2).
"no_group": rank 1 starts MPI but never calls init_process_group; the others raise at 2 s in the
exchange that needs it, and print "rank R: ERRORTYPE: MESSAGE". Before, they waited forever in
MPI's blocking allgather. (Rank 1 then leaves; mpirun ends the job.)
"""
import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist

import ringcomm  # noqa: F401  - registers the backend and the env:// rendezvous under mpirun

backend, scenario = sys.argv[1:3]
rank = int(os.environ["PMI_RANK"])
if rank == 1:
    if scenario == "never_mpi":
        time.sleep(600)
    from mpi4py import MPI
    MPI.COMM_WORLD.Get_rank()
    time.sleep(6)   # past the others' 2 s and their report (the test allows them 6 s)
    sys.exit(0)
started = time.monotonic()
try:
    dist.init_process_group(backend, timeout=timedelta(seconds=2))
    outcome = "init_process_group returned without rank 1"
except Exception as err:  # noqa: BLE001 - the job reports whatever it raised
    outcome = f"{type(err).__name__}: {err}"
print(f"rank {rank} after {time.monotonic() - started:.1f} s: {outcome}", flush=True)
