"""A rank that does not reach ringcomm.init in time: the others raise within the timeout.

    mpirun -n 3 python late_init.py OUT_DIR SCENARIO

SCENARIO "late": rank 1 calls ``ringcomm.init`` 4.5 s after the others, who call ``init(timeout=2)``.
"stopped": rank 1 enters init with the others but stops for 4.5 s before its first exchange
(bootstrap.Bootstrap.allgather); "last": before its last one (settings), after which it finds the
others' messages there and goes on alone into the node split (its watchdog ends the job);
"backend": rank 1 stops for 4.5 s where backend gloo's set-up begins (c10d.rendezvous), after all
of init's exchanges. Each rank writes "rank R after T s: OUTCOME" to
OUT_DIR/rank<R>.txt, T counted from its call of init. Before bootstrap.py both cases waited for
rank 1 however long it took (MPI's blocking Comm_dup and allgather), and forever for a rank
that never came.

A rank whose init gave up still has MPI's idup posted; MPI_Finalize lets it be (MPICH says that
the built-in communicator "has pending 1 references").
"""
import os
import sys
import time

from mpi4py import MPI

import ringcomm
from ringcomm import bootstrap

out_dir, scenario = sys.argv[1:3]
rank = MPI.COMM_WORLD.Get_rank()
backend = None
if scenario == "backend":
    # Rank 1 stops for 4.5 s where the gloo backend's set-up begins, after every exchange of init.
    from ringcomm.backends import c10d
    backend, rendezvous = "gloo", c10d.rendezvous

    def late_rendezvous(world, timeout, name):
        if rank == 1:
            time.sleep(4.5)
        return rendezvous(world, timeout, name)
    c10d.rendezvous = late_rendezvous
elif rank == 1:
    if scenario == "late":
        time.sleep(4.5)
    else:
        original = bootstrap.Bootstrap.allgather

        def stalled(self, value, what):
            if scenario == "stopped" or what == "settings":
                time.sleep(4.5)
                bootstrap.Bootstrap.allgather = original
            return original(self, value, what)
        bootstrap.Bootstrap.allgather = stalled
started = time.monotonic()
try:
    comm = ringcomm.init(backend, timeout=2)
    outcome = "ok"
except ringcomm.CommError as err:
    outcome = f"{type(err).__name__}: {err}"
with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
    f.write(f"rank {rank} after {time.monotonic() - started:.2f} s: {outcome}\n")
