"""Fault scenarios for test_faults_mpi.py: every rank reports what it raised and how long it took.

    mpirun -n N python faults.py SCENARIO [COUNT]
"""
import os
import signal
import sys
import time

import numpy as np

import ringcomm

scenario = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
comm = ringcomm.init()
odd = comm.rank == 1
comm.barrier()
start = time.monotonic()
try:
    if scenario == "skip":
        if not odd:
            comm.all_reduce(np.ones(count, np.float32))
        comm.broadcast(np.ones(count, np.float32))
    elif scenario == "extra":
        comm.all_reduce(np.ones(count + odd, np.float32))
    elif scenario == "dtype":
        comm.all_reduce(np.ones(count, np.int32 if odd else np.float32))
    elif scenario == "absent":
        if not odd:
            comm.all_reduce(np.ones(count, np.float32))
    elif scenario == "kill":
        if odd:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.all_reduce(np.ones(count, np.float32))
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    outcome = "ok"
except ringcomm.CommError as err:
    outcome = f"{type(err).__name__}: {err}"
report = f"rank {comm.rank} after {time.monotonic() - start:.2f}s: {outcome}\n"
# One file per rank: hydra may splice lines of different ranks on the shared stdout.
with open(os.path.join(os.environ["FAULTS_OUT"], f"rank{comm.rank}.txt"), "w") as f:
    f.write(report)
print(report, end="", flush=True)
