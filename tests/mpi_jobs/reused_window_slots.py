"""Sub-communicators made and closed over and over keep their shared window, and a reused
slot never hands a new communicator the rounds of the one before.

Each rank of a node has WINDOW_SLOTS - 1 window regions for sub-communicators; a slot was never
given out again, so the eighth communicator made and closed on a rank had no window (its
1 KiB all-reduce ran recursive doubling instead of one_shot). Now a closed communicator's slot is
offered again once every peer of its window has closed it, and the new window counts its rounds
from past the last round any member's region shows: started at round 1 instead, its first
one-shot round would find every peer's stale flag already past it, and could read the old
communicator's payload of the same stamp (each communicator's sequence numbers start at 1).

    mpirun -n 3 python reused_window_slots.py

Prints "reused-window-slots ok" on rank 0; an assertion names the first wrong case.
"""
import time

import numpy as np

import ringcomm

world = ringcomm.init(timeout=20)
rank, size = world.rank, world.size
node = world.transport.node
assert node is not None and world.transport.window is not None, "run on one node over shm"


def slot_of(comm):
    return node._slot_of[comm.transport.local.context]


def check_all_reduce(comm, base: int, count: int = 256) -> None:
    x = np.full(count, base + comm.rank, np.float32)
    comm.all_reduce(x)
    expected = sum(base + r for r in range(comm.size))
    assert np.all(x == expected), f"rank {rank}: all_reduce base {base}: {x[:4]} != {expected}"


# 1. Twenty dups made, used and closed in turn: each has a window, and each first call (the same
#    stamp in every dup: sequence 1, the same count) sees this dup's values, never the last one's.
for i in range(20):
    dup = world.dup()
    assert dup.transport.window is not None, f"rank {rank}: dup {i} has no window"
    for j in range(3 + i % 4):   # dups end at different rounds
        check_all_reduce(dup, 1000 * i + j)
    assert dup.recorder.entries[-1].algorithm == "one_shot", dup.recorder.entries[-1]
    dup.close()

# 2. A rank slow to close: its peers' next split must not take the slot it still has open (it
#    may still read their last round there), and every result stays right.
dup = world.dup()
check_all_reduce(dup, 7)
if rank == 1:
    time.sleep(0.2)
dup.close()
again = world.dup()
check_all_reduce(again, 8)
assert again.transport.window is not None
again.close()

# 3. Rank 1 keeps a communicator of ranks 0 and 1 open; ranks 0 and 2 make theirs meanwhile: rank 0
#    must not give it the slot rank 1 still reads rank 0's region in.
if size >= 3:
    pair = world.split(0 if rank in (0, 1) else None)
    if pair is not None:
        check_all_reduce(pair, 11)
        kept = slot_of(pair)
        if rank == 0:
            pair.close()
    other = world.split(0 if rank in (0, 2) else None)
    if other is not None:
        check_all_reduce(other, 12)
        if rank == 0:
            assert slot_of(other) != kept, f"slot {kept} given again while rank 1 still has it open"
        other.close()
    if rank == 1:
        pair.close()

world.barrier()
if rank == 0:
    print("reused-window-slots ok", flush=True)
world.close()
