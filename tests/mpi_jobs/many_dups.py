"""Closed dups give back what they can, and running out of MPI's communicators is an error that
says so.

Every split or dup holds an MPI communicator (a context id, 2,048 per process in MPICH): on the
ringcomm backend within a node only the node's CUDA IPC seed, which close() gives back unless
CUDA IPC ran over it; on the reference backends and across nodes one that carries messages,
which close() gives back once every member has closed it and nothing sent on it is left
unreceived (transport/mpi.py retire_communicator). Until round thirty-seven the 2,045th dup on
the ringcomm backend died of a raw mpi4py exception, closed or not, and gloo's groups kept
their sockets and threads after close(), five descriptors a dup; until round thirty-nine the
2,045th on the mpi and gloo backends and across nodes was refused, closed or not.

    mpirun -n 2 python many_dups.py BACKEND closed|open|unreceived N [across-nodes]

closed: N dup-all_reduce-close rounds, every sum checked (and the process's open descriptors
no more at the end than after the first; on the reference backends and across nodes, every
dup's MPI communicator freed; across-nodes: each rank claims a node of its own). open: dups
kept until one fails, which must be a CommunicatorLimitError naming the dup, on every rank,
after which every kept dup and the world still work (and on ringcomm, once the kept dups
closed, a new dup). unreceived: N rounds of a dup that rank 0 sends a message to that rank 1
never receives, closed, then a dup where rank 1 receives rank 0's message with the same tag: it
must get that one, never the stale one (a dup freed with it unreceived handed its context id on
to the next, and rank 1 got the stale message in half the rounds). Prints "many-dups ok" on
rank 0; exits 1 otherwise.
"""
import os
import re
import sys

import numpy as np

import ringcomm
from ringcomm import CommunicatorLimitError
from ringcomm.transport import mpi as mpi_transport
import retiring

backend, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
across = sys.argv[4:] == ["across-nodes"]
if across:   # every rank its own pretend node: the ringcomm backend's dups carry MPI communicators
    os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{os.environ.get('PMI_RANK', 0)}"
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
    freed = []
    free = mpi_transport.free_communicator
    mpi_transport.free_communicator = lambda comm: (freed.append(1), free(comm))
    for _ in range(rounds):
        one_round().close()
    grown = len(os.listdir("/proc/self/fd")) - descriptors
    if grown > 8:
        problems.append(f"{grown} more open descriptors after {rounds} dups, each closed")
    if backend != "ringcomm" or across:   # each dup made an MPI communicator
        world.barrier()   # every member has closed the last dup and posted its exchange
        retiring.collect(lambda: len(freed) >= rounds)
        if len(freed) < rounds:
            problems.append(f"{len(freed)} of {rounds} closed dups' MPI communicators freed")
elif mode == "unreceived":
    for i in range(rounds):
        stale = world.dup()
        if world.rank == 0:
            stale.send(np.full(4, -1.0, np.float32), 1, tag=5)   # small: MPI sends it eagerly
        stale.close()
        fresh = world.dup()
        if world.rank == 0:
            fresh.send(np.full(4, float(i), np.float32), 1, tag=5)
        elif world.rank == 1:
            got = np.zeros(4, np.float32)
            fresh.recv(got, 0, tag=5)
            if not (got == i).all():
                problems.append(f"round {i}: rank 1 received {got[0]} from a fresh dup, not {i}")
        fresh.close()
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
