"""What a closed sub-communicator never received must not hold the rings its ranks share.

Over shared memory every communicator of a pair of ranks shares one descriptor ring per
direction (256 slots); a message takes a slot until its receiver acknowledges it. A message
that a dup refused (a receive of another dtype, a collective whose ranks disagree on the count)
or that nobody received once held its slot for good: 255 messages later every send of that
pair, the world's included, waited for the slot until its deadline. Each case fails on a dup,
closes it, then runs 600 world sends and 300 world ring all-reduces, checking every value.

    mpirun -n 2 python closed_sub_messages.py

Prints "closed-sub-messages ok" on rank 0; exits 1 otherwise.
"""
import sys

import numpy as np

import ringcomm

world = ringcomm.init(timeout=10)
RANK = world.rank
problems: list = []


def refused_receive(sub):
    if RANK == 0:
        sub.send(np.ones(4, np.float32), 1)
    elif RANK == 1:
        sub.recv(np.zeros(4, np.int32), 0)   # another dtype: MismatchError, the message stays


def disagreeing_collective(sub):
    sub.all_reduce(np.ones(1000 + 64 * (RANK == 0)), algorithm="ring")


def never_received(sub):
    if RANK == 0:
        sub.send(np.ones(3), 1, tag=7)   # small: done once staged, never received
    sub.barrier()


for case in (refused_receive, disagreeing_collective, never_received):
    sub = world.dup()
    try:
        case(sub)
    except ringcomm.RingcommError:
        pass
    sub.close()
    world.barrier()
    try:
        for i in range(600):
            if RANK == 0:
                world.send(np.full(4, float(i)), 1)
            elif RANK == 1:
                got = np.zeros(4)
                world.recv(got, 0)
                if got[0] != i:
                    problems.append(f"{case.__name__}: world recv #{i} got {got[0]}")
        for i in range(300):
            x = np.full(100, float(i + RANK))
            world.all_reduce(x, algorithm="ring")
            if x[0] != sum(i + r for r in range(world.size)):
                problems.append(f"{case.__name__}: world all_reduce #{i} got {x[0]}")
    except ringcomm.RingcommError as err:
        problems.append(f"{case.__name__}: {type(err).__name__}: {err}")
        break

for line in problems[:5]:
    print(f"rank {RANK}: {line}", flush=True)
if not problems and RANK == 0:
    print("closed-sub-messages ok", flush=True)
sys.exit(1 if problems else 0)
