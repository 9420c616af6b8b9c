"""A closed init gives its MPI communicators back, unless something sent on them is unreceived.

Every init makes MPI communicators (a duplicate of the world, and on the ringcomm backend the
node's split when a node has several ranks). Until round forty they were held for the life of
the process, and the 1,024th init-close round of a loop (a test suite under mpirun, a sweep
over settings) raised CommunicatorLimitError. Now, once the world and every sub-communicator
closed cleanly, init's communicators go back to MPI if what every rank sent every other on them
was received (transport/mpi.py retire_communicator).

    mpirun -n 2 python many_inits.py BACKEND closed|overflow|unreceived|raced N [across-nodes]

closed: N init-all_reduce-close rounds, every sum checked, and every init's communicators
freed (counted). overflow (backend ringcomm within a node, RINGCOMM_SHM_CMA=0): as closed, with
24 sends from rank 0 under distinct tags before rank 1 receives them, in reverse, so that the
staging pool overflows and payloads travel over the node's MPI communicator, which must still
go back (its ledger counts them). unreceived: N rounds of an init on which rank 0 sends rank 1 a message rank 1
never receives, closed, then an init where rank 1 receives rank 0's message with the same tag:
it must get that one, never the stale one. raced (an erroneous program): rank 1 closes its
world while rank 0 calls all_reduce on it (backends mpi and gloo), whose pre-flight allgather
pairs with rank 1's close exchange, or allocates (backend ringcomm), whose handshake pairs with
the node split's: rank 0 must raise an error naming close(), and nothing it paired with is
freed. across-nodes: each rank claims a node of its own.
Prints "many-inits ok" on rank 0; exits 1 otherwise.
"""
import os
import re
import sys

import numpy as np
from mpi4py import MPI

import ringcomm
from ringcomm.transport import mpi as mpi_transport
import retiring

backend, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
across = sys.argv[4:] == ["across-nodes"]
if across:
    os.environ["RINGCOMM_NODE_ID"] = f"pretend-node-{os.environ.get('PMI_RANK', 0)}"
rank = MPI.COMM_WORLD.Get_rank()
problems: list = []
freed: list = []
free = mpi_transport.free_communicator
mpi_transport.free_communicator = lambda comm: (freed.append(1), free(comm))


def settle(expected: int) -> None:
    """Every rank has posted its close exchanges: let them finish and be collected, until
    ``expected`` communicators are freed and half a second more (for any that should not be).
    An exchange whose partner met something else never finishes: waiting for the list to empty
    cost a raced job its whole 10 s."""
    MPI.COMM_WORLD.Barrier()
    retiring.collect(lambda: len(freed) >= expected)
    retiring.collect(lambda: False, limit=0.5)


over_mpi: list = []
if mode == "overflow":
    from ringcomm.transport.shm.transport import ShmTransport
    send_outside = ShmTransport._send_outside
    ShmTransport._send_outside = lambda self, req: (over_mpi.append(1), send_outside(self, req))


def overflow(comm) -> None:
    n = 64 << 10
    if comm.rank == 0:
        sends = [comm.send(np.full(n, float(t), np.float32), 1, tag=100 + t, async_op=True) for t in range(24)]
        comm.barrier()
        for work in sends:
            work.wait()
    else:
        comm.barrier()
        for t in reversed(range(24)):
            got = np.zeros(n, np.float32)
            comm.recv(got, 0, tag=100 + t)
            if not (got == t).all():
                problems.append(f"rank 1 received {got[0]} under tag {100 + t}")


if mode in ("closed", "overflow"):
    for _ in range(rounds):
        comm = ringcomm.init(backend, timeout=30)
        if mode == "overflow":
            overflow(comm)
        x = np.full(64, comm.rank + 1.0, np.float32)
        comm.all_reduce(x)
        if not (x == comm.size * (comm.size + 1) / 2).all():
            problems.append(f"a sum is {x[0]}")
        comm.close()
    # the world's duplicate, and on backend ringcomm the node's split where the node has two ranks
    each = 2 if backend == "ringcomm" and not across else 1
    settle(each * rounds)
    if len(freed) != each * rounds:
        problems.append(f"{len(freed)} MPI communicators freed after {rounds} closed inits, not {each * rounds}")
    if mode == "overflow" and rank == 0 and not over_mpi:
        problems.append("no payload went over the node's MPI communicator")
elif mode == "raced":
    # What rank 0 calls meets rank 1's close exchange: on ringcomm an allocate's handshake over
    # the node's split, on the reference backends an all_reduce's pre-flight over the world's.
    if backend == "ringcomm":
        call, says = (lambda comm: comm.transport.allocate(1 << 20),
                      r"rank 1 has closed its communicator \(close\(\)\) while this rank is in #\d+ \(allocate\)")
    else:
        call, says = (lambda comm: comm.all_reduce(np.ones(4, np.float32)),
                      r"ranks disagree: collective: ranks \[0\] have all_reduce; ranks \[1\] have close\(\)$")
    for _ in range(rounds):
        comm = ringcomm.init(backend, timeout=30)
        if rank == 0:
            try:
                call(comm)
                problems.append("rank 0's call returned while rank 1 closed")
            except ringcomm.CommError as err:
                if not re.search(says, str(err)):
                    problems.append(f"rank 0's error reads: {err}")
        comm.close()
    # ringcomm: the world's duplicates go (their exchanges met), the node's splits stay
    expected = rounds if backend == "ringcomm" else 0
    settle(expected)
    if len(freed) != expected:
        problems.append(f"{len(freed)} MPI communicators freed after {rounds} raced closes, not {expected}")
else:
    for i in range(rounds):
        stale = ringcomm.init(backend, timeout=30)
        if rank == 0:
            stale.send(np.full(4, -1.0, np.float32), 1, tag=5)   # small: MPI sends it eagerly
        stale.close()
        fresh = ringcomm.init(backend, timeout=30)
        if rank == 0:
            fresh.send(np.full(4, float(i), np.float32), 1, tag=5)
        elif rank == 1:
            got = np.zeros(4, np.float32)
            fresh.recv(got, 0, tag=5)
            if not (got == i).all():
                problems.append(f"round {i}: rank 1 received {got[0]} from a fresh init, not {i}")
        fresh.close()
    settle(rounds)
    if len(freed) != rounds:   # each fresh init's duplicate; no stale one
        problems.append(f"{len(freed)} MPI communicators freed, not the {rounds} fresh inits' duplicates")
if problems:
    print(f"rank {rank}: {problems}", flush=True)
    sys.exit(1)
MPI.COMM_WORLD.Barrier()
if rank == 0:
    print("many-inits ok", flush=True)
