"""What an init made goes when the world and every sub-communicator sharing it have closed.

A dup that outlives the world's close() shares the world's transports: they must stay until it
closes too. Until round thirty-seven a world's close() kept its transports' segments mapped
until Python's collector ran (in a 64 MiB /dev/shm the fifth init of this job found no room:
test_split.py runs it there) and gloo's group and store (fifteen descriptors an init) until the
process ended. MPI's own communicators go back once every rank has closed its world cleanly
(mpi_jobs/many_inits.py checks that); with every one of them taken, init raises
CommunicatorLimitError on every rank.

    mpirun -n N python world_release.py [pretend-nodes]

Prints "world-release ok" on rank 0; exits 1 otherwise.
"""
import gc
import os
import sys

if sys.argv[1:] == ["pretend-nodes"]:
    os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{int(os.environ.get('PMI_RANK', 0)) % 2}"

import numpy as np
from mpi4py import MPI

import ringcomm
import retiring

problems: list = []


def summed(comm) -> bool:
    x = np.full(1000, comm.rank + 1.0, np.float32)
    comm.all_reduce(x)
    return bool((x == comm.size * (comm.size + 1) / 2).all())


world = ringcomm.init(timeout=30)
rank = world.rank
dup = world.dup()
world.close()
if not summed(dup):
    problems.append("a dup outliving the world's close summed wrong")
dup.close()

for backend in ("ringcomm", "mpi", "gloo"):
    ringcomm.init(backend, timeout=30).close()
    gc.collect()   # a mapping's descriptor (Python's mmap keeps one) goes with a cycle, at a collection
    descriptors = len(os.listdir("/proc/self/fd"))
    for _ in range(8):
        comm = ringcomm.init(backend, timeout=30)
        if not summed(comm):
            problems.append(f"a sum on backend {backend} is wrong")
        comm.close()
        comm.close()   # twice: nothing more to give back
    gc.collect()
    grown = len(os.listdir("/proc/self/fd")) - descriptors
    if grown > 8:   # gloo's group and store kept fifteen an init
        problems.append(f"{grown} more open descriptors after 8 inits of backend {backend}, each closed")

# Every MPI communicator taken (by the program itself): init says so, on every rank. The closed
# inits' communicators first go back, or the next init would find them free.
MPI.COMM_WORLD.Barrier()
retiring.collect(lambda: False)
taken = []
try:
    while True:
        taken.append(MPI.COMM_WORLD.Dup())
except MPI.Exception:
    pass
try:
    ringcomm.init(timeout=30)
    problems.append(f"init succeeded with all {len(taken)} of MPI's communicators taken")
except ringcomm.CommunicatorLimitError as err:
    if not str(err).startswith(f"init on rank {rank}: MPI could not make another communicator"):
        problems.append(f"init's refusal reads: {err}")
taken.pop().Free()   # one left: init's duplicate of the world takes it, and its node split finds none
try:
    ringcomm.init(timeout=30)
    problems.append("init succeeded with one of MPI's communicators left")
except ringcomm.CommunicatorLimitError as err:
    if not str(err).startswith(f"init on rank {rank}: the node split: MPI could not make another communicator"):
        problems.append(f"init's refusal with one left reads: {err}")
for comm in taken:
    comm.Free()
comm = ringcomm.init(timeout=30)   # given back, they serve again
if not summed(comm):
    problems.append("a sum after MPI's communicators came back is wrong")
comm.close()
if problems:
    print(f"rank {rank}: {problems}", flush=True)
    sys.exit(1)
MPI.COMM_WORLD.Barrier()
if rank == 0:
    print("world-release ok", flush=True)
