"""A process that never reaches ``ringcomm.init``, where init is the one to start MPI: the others
end the job at the init timeout instead of waiting in MPI_Init forever.

    mpirun -n 3 python late_mpi_init.py OUT_DIR SCENARIO

SCENARIO "never": rank 1 sleeps 600 s before init; ranks 0 and 2 call ``init(timeout=2)``, whose
MPI_Init waits for every process of the job while holding the GIL (bootstrap.py). Its deadline
(RINGCOMM_MPI_INIT_TIMEOUT, which the test sets to 2 s) ends them with the reason on stderr, and
the launcher ends rank 1.
"on_time": every rank calls ``init(timeout=1)``, works on for 2 s, all-reduces, and writes
"rank R: ok SUM" to OUT_DIR/rank<R>.txt: a deadline (RINGCOMM_MPI_INIT_TIMEOUT=1 in the test)
disarmed when MPI_Init returned never fires.

Nothing here imports mpi4py.MPI before init (that would start MPI outside ringcomm's deadline):
the rank comes from the launcher's variable.
"""
import os
import sys
import time

import numpy as np

import ringcomm

out_dir, scenario = sys.argv[1:3]
rank = int(os.environ["PMI_RANK"])
if scenario == "never":
    if rank == 1:
        time.sleep(600)
    ringcomm.init(timeout=2)
    sys.exit(f"rank {rank}: init returned, but rank 1 never called it")
comm = ringcomm.init(timeout=1)
time.sleep(2)
x = np.full(4, rank + 1.0, np.float32)
comm.all_reduce(x)
with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
    f.write(f"rank {rank}: ok {x[0]:g}\n")
comm.close()
