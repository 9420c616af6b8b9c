"""send/recv keep one contract on every CPU backend: a receive that does not fit its message is a
MismatchError on the receiver with its buffer untouched (never a short or garbage buffer, never a
signal; the mpi backend's buffer is MPI's to write, the error is still raised), an empty message from any rank arrives and names its sender, and many messages of one
tag, received from any rank with their waits taken out of order, land where they were sent.

    mpirun -n N python p2p_contract.py BACKEND      (N >= 2)

gloo checks none of this itself (backends/framed.py); the ringcomm and mpi backends run the same
cases so that swapping the backend keeps the behaviour. Every failing case runs on its own dup,
which the mismatch leaves broken. Prints "p2p contract: BACKEND ok" on rank 0.
"""
import sys

import numpy as np

import ringcomm
from ringcomm import MismatchError

BACKEND = sys.argv[1]
world = ringcomm.init(backend=BACKEND)
RANK, SIZE = world.rank, world.size


def mismatch(sent, mine, words):
    """Rank 0 sends ``sent``; rank 1 receives into ``mine``: MismatchError naming ``words``."""
    comm = world.dup()
    if RANK == 0:
        comm.send(sent, 1, tag=3)   # the receiver takes it (into scratch): the send completes
    elif RANK == 1:
        keep = mine.copy()
        try:
            comm.recv(mine, 0, tag=3)
        except MismatchError as err:
            assert all(w in str(err) for w in words), (words, str(err))
            # MPI receives into the caller's buffer and reports the length after (MPI_Recv's
            # own rule): the error is what the mpi backend promises, not an untouched buffer.
            assert BACKEND == "mpi" or np.array_equal(mine, keep), f"the receive buffer was written: {mine}"
        else:
            raise AssertionError(f"receiving {sent.dtype} x {sent.size} into {mine.dtype} x {mine.size} passed")
    world.barrier()


mismatch(np.ones(2, np.float32), np.full(3, 7, np.float32), ["8", "12"])      # shorter
mismatch(np.ones(3, np.float32), np.full(2, 7, np.float32),                  # longer: MPI says only
         ["12", "8"] if BACKEND != "mpi" else ["8", "truncated"])             # that it did not fit
mismatch(np.zeros(0, np.float32), np.full(3, 7, np.float32), ["0", "12"])     # empty
if BACKEND != "mpi":   # MPI matches bytes, not types
    mismatch(np.ones(4, np.float32), np.full(4, 7, np.int32), ["float32", "int32"])

# An empty message from any rank.
if RANK == 1:
    world.send(np.zeros(0, np.float32), 0, tag=5)
elif RANK == 0:
    out, src = world.recv(np.zeros(0, np.float32), None, tag=5)
    assert src == 1 and out.size == 0, (src, out)

# Every other rank sends 12 messages under one tag; rank 0 posts a receive from any rank for each
# before waiting on any, then waits them in reverse. Each message says who sent it and its number:
# taken in the order the receives were posted, each sender's must come in order, each whole.
COUNT = 12
if RANK:
    works = [world.send(np.full(5, RANK * 1000 + k, np.int64), 0, tag=9, async_op=True) for k in range(COUNT)]
    for w in works:
        w.wait()
else:
    pending = []
    for _ in range(COUNT * (SIZE - 1)):
        buf = np.full(5, -1, np.int64)
        pending.append((buf, world.recv(buf, None, tag=9, async_op=True)))
    for buf, work in reversed(pending):
        work.wait()
    seen = {r: [] for r in range(1, SIZE)}
    for buf, work in pending:
        assert (buf == buf[0]).all() and buf[0] // 1000 == work.source, (buf, work.source)
        seen[work.source].append(int(buf[0]) % 1000)
    assert all(got == list(range(COUNT)) for got in seen.values()), seen

# MPI's matching: rank 1's first message under a tag goes to a receive from any rank posted
# before a receive from rank 1, its second to the latter, whichever is waited first.
if RANK == 1:
    for k in range(2):
        world.send(np.full(2, k, np.int64), 0, tag=11)
elif RANK == 0:
    first, second = np.full(2, -1, np.int64), np.full(2, -1, np.int64)
    any_rank = world.recv(first, None, tag=11, async_op=True)
    from_one = world.recv(second, 1, tag=11, async_op=True)
    from_one.wait()
    any_rank.wait()
    assert (first[0], second[0], any_rank.source) == (0, 1, 1), (first, second, any_rank.source)
world.barrier()
if RANK == 0:
    print(f"p2p contract: {BACKEND} ok", flush=True)
world.close()
