"""Sub-communicators give their MPI communicators back at close(), and running out is an error
that says so.

Every split or dup holds an MPI communicator (a context id, 2,048 per process in MPICH) on the
reference backends, and on ringcomm's for the node's CUDA IPC seed and the ranks on other
nodes. Until round thirty-seven none was ever freed, closed or not: the 2,045th dup died of a
raw mpi4py exception. gloo's groups also kept their sockets and threads after close(), five
descriptors a dup.

    mpirun -n 2 python many_dups.py BACKEND closed|open N

closed: N dup-all_reduce-close rounds, every sum checked (and the process's open descriptors
no more at the end than after the first). open: dups kept until one fails, which must be a
CommunicatorLimitError naming the dup and close(), on every rank, after which every kept dup
and the world still work. Prints "many-dups ok" on rank 0; exits 1 otherwise.
"""
import os
import re
import sys

import numpy as np

import ringcomm
from ringcomm import CommunicatorLimitError

backend, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
world = ringcomm.init(backend, timeout=30)
problems: list = []


def one_round() -> ringcomm.Communicator:
    sub = world.dup()
    x = np.full(64, world.rank + 1.0, np.float32)
    sub.all_reduce(x)
    if not (x == world.size * (world.size + 1) / 2).all():
        problems.append(f"a dup's sum is {x[0]}")
    return sub


if mode == "closed":
    one_round().close()
    descriptors = len(os.listdir("/proc/self/fd"))
    for _ in range(rounds):
        one_round().close()
    grown = len(os.listdir("/proc/self/fd")) - descriptors
    if grown > 8:
        problems.append(f"{grown} more open descriptors after {rounds} dups, each closed")
else:
    kept = []
    try:
        for _ in range(rounds):
            kept.append(one_round())
        problems.append(f"{rounds} dups kept open, and none was refused")
    except CommunicatorLimitError as err:
        text = str(err)
        if not (re.match(rf"dup #\d+ on rank {world.rank}: MPI could not make another communicator", text)
                and "close the communicators you no longer use" in text):
            problems.append(f"the refusal reads: {text}")
    for sub in kept:   # each still works, and closes
        x = np.ones(4, np.float32)
        sub.all_reduce(x)
        if not (x == world.size).all():
            problems.append(f"a kept dup's sum is {x[0]}")
        sub.close()
    one_round().close()   # the world was left usable, and closed dups are given back
if problems:
    print(f"rank {world.rank}: {problems}", flush=True)
    sys.exit(1)
world.barrier()
if world.rank == 0:
    print("many-dups ok", flush=True)
