"""Closed dups give back what they can, and running out of MPI's communicators is an error that
says so.

Every split or dup holds an MPI communicator (a context id, 2,048 per process in MPICH): on the
ringcomm backend within a node only the node's CUDA IPC seed, which close() gives back unless
CUDA IPC ran over it; on the reference backends and across nodes one that carries messages,
kept for good (transport/mpi.py new_communicator). Until round thirty-seven the 2,045th dup on
the ringcomm backend died of a raw mpi4py exception, closed or not, and gloo's groups kept their
sockets and threads after close(), five descriptors a dup.

    mpirun -n 2 python many_dups.py BACKEND closed|open N

closed: N dup-all_reduce-close rounds, every sum checked (and the process's open descriptors
no more at the end than after the first). open: dups kept until one fails, which must be a
CommunicatorLimitError naming the dup, on every rank, after which every kept dup and the world
still work (and on ringcomm, once the kept dups closed, a new dup). Prints "many-dups ok" on rank 0; exits 1 otherwise.
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
                and "make fewer, reusing communicators" in text):
            problems.append(f"the refusal reads: {text}")
    for sub in kept:   # each still works, and closes
        x = np.ones(4, np.float32)
        sub.all_reduce(x)
        if not (x == world.size).all():
            problems.append(f"a kept dup's sum is {x[0]}")
        sub.close()
    x = np.ones(4, np.float32)
    world.all_reduce(x)   # the refusal left the world usable
    if not (x == world.size).all():
        problems.append(f"the world's sum after the refusal is {x[0]}")
    if backend == "ringcomm":
        one_round().close()   # closed dups within a node gave their seeds back
if problems:
    print(f"rank {world.rank}: {problems}", flush=True)
    sys.exit(1)
world.barrier()
if world.rank == 0:
    print("many-dups ok", flush=True)
