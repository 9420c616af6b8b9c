"""Point-to-point over the shm transport itself: matching, queueing, fallback and errors.

    RINGCOMM_TRANSPORT=shm mpirun -n N python shm_p2p.py

Runs with direct reads of private memory (CMA) or, under RINGCOMM_SHM_CMA=0, the staging copy.
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import time

import numpy as np
from mpi4py import MPI

from ringcomm.errors import MismatchError, PeerAbortedError
from ringcomm.core.ops import ReduceOp, DTYPES, reducer
from ringcomm.topology import discover
from ringcomm.transport import factory
from ringcomm.transport.shm import GROW_QUANTUM, SLOTS, ShmTransport

world = MPI.COMM_WORLD.Dup()
routed = factory.build(world, discover(world), 60.0)
t = routed.node
assert isinstance(t, ShmTransport), type(t)
assert set(routed.describe().values()) == {"shm"}, routed.describe()
rank, size = t.rank, t.size
right, left = (rank + 1) % size, (rank - 1) % size
add = reducer(ReduceOp.SUM, DTYPES["float64"])

# 1. Streams under several tags interleave; each receive gets exactly its message, even when
#    waited in another order than posted, and more messages than slots are in flight.
n_msgs = SLOTS + 40
buf = t.allocate(8 * n_msgs * 2, np.float64)
buf[:n_msgs] = rank * 1000 + np.arange(n_msgs)
recv = np.zeros(n_msgs)
recvs = [t.irecv(recv[i:i + 1], left, tag=i % 3) for i in range(n_msgs)]
sends = [t.isend(buf[i:i + 1], right, tag=i % 3) for i in range(n_msgs)]
for r in reversed(recvs):
    assert r.wait(30)
for s in sends:
    assert s.wait(30)
assert np.array_equal(recv, left * 1000 + np.arange(n_msgs)), recv[:8]

# 2. irecv_reduce reduces straight out of the sender's segment.
with t.stage((buf,)):   # lives in shared memory already: no copy
    acc = np.full(n_msgs, 0.5)
    r = t.irecv_reduce(acc, left, 7, add, np.empty(n_msgs))
    s = t.isend(buf[:n_msgs], right, 7)
    assert r.wait(30) and s.wait(30)
assert np.array_equal(acc, 0.5 + left * 1000 + np.arange(n_msgs))

# 3. A staged ordinary array: peers read its sent ranges out of this process (CMA) or out of
#    the staging shadow; receives land in it directly. 2.4 MiB halves: CMA reduces in chunks.
half = 300_001
plain = np.arange(2 * half, dtype=np.float64) + rank
with t.stage((plain,)):
    w = plain
    r = t.irecv_reduce(w[half:], left, 8, add, np.empty(half))
    s = t.isend(w[:half], right, 8)
    assert r.wait(30) and s.wait(30)
    strided = np.zeros(2 * half)   # a receive buffer CMA cannot write in one go
    r, s = t.irecv(strided[::2], left, 13), t.isend(w[half:], right, 13)
    assert r.wait(30) and s.wait(30)
    left_of_left = (left - 1) % size
    assert np.array_equal(strided[::2], np.arange(half, 2 * half) + left + np.arange(half) + left_of_left)
    assert not strided[1::2].any()
assert np.array_equal(plain[half:], np.arange(half, 2 * half) + rank + np.arange(half) + left)
if t.direct_reads == "cma":   # peers read the array itself: the staging segment never grows
    assert t._staging.nbytes == GROW_QUANTUM, t._staging.nbytes
else:
    assert t._staging.nbytes >= plain.nbytes, t._staging.nbytes

# 3b. Below the CMA floor a collective stages even where CMA works (a cache-sized copy beats
#     pinning pages): the staging segment grows to shadow it. Every rank sets the same floor.
if t.direct_reads == "cma":
    t.cma_min_bytes = plain.nbytes + 8
    got = np.zeros(half)
    with t.stage((plain,)):
        w = plain
        r, s = t.irecv(got, left, 14), t.isend(w[:half], right, 14)
        assert r.wait(30) and s.wait(30)
    assert t._staging.nbytes >= plain.nbytes, t._staging.nbytes
    assert np.array_equal(got, plain[:half] - rank + left)
    t.cma_min_bytes = 0

# 4. A buffer outside shared memory falls back to MPI, reduce included.
outside, into = np.full(1000, float(rank)), np.ones(1000)
r, s = t.irecv_reduce(into, left, 9, add, np.empty(1000)), t.isend(outside, right, 9)
assert r.wait(30) and s.wait(30)
assert np.array_equal(into, np.full(1000, 1.0 + left))

# 5. A size mismatch is an error on the receiver, not corruption.
r, s = t.irecv(np.zeros(3), left, 10), t.isend(buf[:4], right, 10)
try:
    r.wait(30)
    raise AssertionError("mismatch not detected")
except MismatchError as err:
    assert "4" in str(err) or "32" in str(err), err
with t.stage((plain,)):   # from a staged array too: the peer's memory is not even read
    w = plain
    into = np.zeros(3)
    r, s = t.irecv(into, left, 14), t.isend(w[:4], right, 14)
    try:
        r.wait(30)
        raise AssertionError("mismatch not detected")
    except MismatchError as err:
        assert "32" in str(err), err
    assert s.wait(30) and not into.any()
world.Barrier()

# 6. A receive nobody sends times out when asked to (False), and promptly.
start = time.monotonic()
assert t.irecv(np.zeros(1), left, 11).wait(0.3) is False
assert time.monotonic() - start < 10
world.Barrier()

# 7. Abort on one rank releases a peer waiting on it.
if rank == 1:
    t.abort(RuntimeError("test abort"))
    world.Barrier()
elif rank == 0:
    world.Barrier()
    try:
        t.irecv(np.zeros(1), 1, 12).wait(30)
        raise AssertionError("abort not seen")
    except PeerAbortedError as err:
        assert "rank 1" in str(err), err
else:
    world.Barrier()
print(f"rank {rank} direct_reads={t.direct_reads!r}", flush=True)
t.close()
print(f"rank {rank} ok")
