"""The communicator's timeout bounds the shared-memory handshakes too (init and allocate).

    mpirun -n N python shm_setup_timeout.py OUT_DIR SCENARIO HOW

SCENARIO "late": node rank 0 arrives 5 s late to the shm transport's setup (inside
ringcomm.init); "allocate": every rank but rank 1 calls ``comm.transport.allocate``. HOW "arg"
passes ``init(timeout=2)``, "env" relies on RINGCOMM_TIMEOUT=2 set by the test. Each rank writes
"rank R after T s: OUTCOME" to OUT_DIR/rank<R>.txt, T counted from when it entered the wait it
could not finish (for the late rank: from the end of its delay).
"""
import os
import sys
import time

from mpi4py import MPI

import ringcomm
from ringcomm.transport.shm import ShmTransport

out_dir, scenario, how = sys.argv[1:4]
rank = MPI.COMM_WORLD.Get_rank()
started = [time.monotonic()]
if scenario == "late":
    original = ShmTransport.__init__

    def late_init(self, node_comm, *args, **kwargs):
        if node_comm.Get_rank() == 0:
            time.sleep(5)   # the others give up at 2 s, long before
            started[0] = time.monotonic()
        original(self, node_comm, *args, **kwargs)
    ShmTransport.__init__ = late_init
try:
    comm = ringcomm.init(timeout=2) if how == "arg" else ringcomm.init()
    if scenario == "allocate":
        started[0] = time.monotonic()
        if rank != 1:
            comm.transport.allocate(1 << 20)
        else:
            time.sleep(4.5)   # past the others' 2 s, with room for a slow start
    outcome = "ok"
except ringcomm.CommError as err:
    outcome = f"{type(err).__name__}: {err}"
with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
    f.write(f"rank {rank} after {time.monotonic() - started[0]:.2f} s: {outcome}\n")
