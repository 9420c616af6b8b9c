"""RINGCOMM_TRANSPORT=shm with every rank on its own pretend node: init must refuse, on each rank.

Each rank writes what init raised to OUT_DIR/rank<r>.txt (stdout may be lost when mpirun ends).
"""
import os
import sys

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
os.environ["RINGCOMM_NODE_ID"] = f"pretend-{rank}"
import ringcomm  # noqa: E402

try:
    ringcomm.init()
    outcome = "init succeeded"
except ringcomm.UsageError as err:
    outcome = f"UsageError: {err}"
with open(os.path.join(sys.argv[1], f"rank{rank}.txt"), "w") as f:
    f.write(outcome + "\n")
