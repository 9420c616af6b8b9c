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
# The odd rank: rank 1, or for the rooted scenarios the last rank (a leaf far from root 0).
odd = comm.rank == (comm.size - 1 if scenario.startswith("rooted-") else 1)
# FAULTS_WARM=1: every rank first all-reduces one array a few times, and the faulty call passes that
# same array wherever it matches, so small calls fail on the fast road (persistent.py), not the first.
warm = os.environ.get("FAULTS_WARM") == "1"
x = np.ones(count, np.float32)
if warm:
    for _ in range(3):
        comm.all_reduce(x)
    x[:] = 1


def ones(n, dtype=np.float32):
    return x if warm and n == count and dtype is np.float32 else np.ones(n, dtype)


comm.barrier()
start = time.monotonic()
try:
    if scenario == "skip":
        if not odd:
            comm.all_reduce(ones(count))
        comm.broadcast(np.ones(count, np.float32))
    elif scenario == "extra":
        comm.all_reduce(ones(count + odd))
    elif scenario == "dtype":
        comm.all_reduce(ones(count, np.int32 if odd else np.float32))
    elif scenario.startswith("rooted-"):   # a small count mismatch on one leaf of a rooted collective
        n, mine = comm.size, count + (3 if odd else 0)
        kind = scenario.removeprefix("rooted-")
        if kind == "broadcast":
            comm.broadcast(np.ones(mine, np.float32), root=0)
        elif kind == "reduce":
            comm.reduce(np.ones(mine, np.float32), root=0)
        elif kind == "gather":
            comm.gather(np.zeros(n * mine, np.float32) if comm.rank == 0 else None, np.ones(mine, np.float32))
        elif kind == "scatter":
            comm.scatter(np.zeros(mine, np.float32), np.ones(n * mine, np.float32) if comm.rank == 0 else None)
    elif scenario == "root":   # rank 0 names root 1, the others root 0: every rank waits to send
        comm.reduce(np.ones(count, np.float32), root=1 if comm.rank == 0 else 0)
    elif scenario == "abort":   # the odd rank gives up with a reason of its own
        if odd:
            comm.abort("the data loader of rank 1 ran dry")
            raise ringcomm.CommError("aborted on purpose")
        comm.all_reduce(ones(count))
    elif scenario == "absent":
        if not odd:
            comm.all_reduce(ones(count))
    elif scenario == "recv-absent":   # a pipeline stage whose previous stage never sends
        if odd:
            comm.recv(np.zeros(count, np.float32), 0, tag=11)
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
