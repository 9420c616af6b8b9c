"""Point-to-point over the shm transport itself: matching, the staging pool, CMA, payloads over
MPI, big tags, threads, window regions, mismatches, timeouts and aborts.

    RINGCOMM_TRANSPORT=shm mpirun -n N python shm_p2p.py

Runs with direct reads of private memory (CMA) or, under RINGCOMM_SHM_CMA=0, without.
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import gc
import threading
import time
import weakref

import numpy as np
from mpi4py import MPI

from ringcomm.core.ops import DTYPES, ReduceOp, reducer
from ringcomm.errors import MismatchError, PeerAbortedError
from ringcomm.topology import discover
from ringcomm.transport import factory
from ringcomm.transport.shm import WINDOW_SLOTS, ShmTransport
from ringcomm.transport.shm import pipe
from ringcomm.transport.shm.rings import CMA, PIPE, SLOTS, VIA_MPI
from ringcomm.transport.window import CAPACITY, JOB_CAPACITY, region_bytes

world = MPI.COMM_WORLD.Dup()
routed = factory.build(world, discover(world), 60.0)
t = routed.node
assert isinstance(t, ShmTransport), type(t)
assert set(routed.describe().values()) == {"shm"}, routed.describe()
rank, size = t.rank, t.size
right, left = (rank + 1) % size, (rank - 1) % size
add = reducer(ReduceOp.SUM, DTYPES["float64"])
POOL = t._pool_seg.seg_id   # the segment staged sends are read from
# where a large send goes: CMA where the node reads by CMA, else a pipe where built, else the pool
LARGE = CMA if t.direct_reads == "cma" else PIPE if t._pipe_ok else POOL
assert t._pipe_ok == (t.direct_reads != "cma" and pipe.enabled()), (t._pipe_ok, t.direct_reads)


def both(r, s):
    assert r.wait(30) and s.wait(30)


def barrier_progressing():
    """A barrier that keeps this rank's transport going meanwhile (the communicator's progress
    thread does that for its users): the sends of a rank that dropped them still finish."""
    done = world.Ibarrier()
    while not done.Test():
        t.progress()


# 1. Streams under several tags interleave; each receive gets exactly its message, even when
#    waited in another order than posted, and more messages than slots are in flight.
n_msgs = SLOTS + 40
buf = t.allocate(8 * n_msgs * 2, np.float64)
buf[:n_msgs] = rank * 1000 + np.arange(n_msgs)
recv = np.zeros(n_msgs)
recvs = [t.irecv(recv[i:i + 1], left, tag=i % 3) for i in range(n_msgs)]
sends = [t.isend(buf[i:i + 1], right, tag=i % 3) for i in range(n_msgs)]
assert all(s.seg not in (POOL, VIA_MPI, CMA) for s in sends)   # read in place
for r in reversed(recvs):
    assert r.wait(30)
for s in sends:
    assert s.wait(30)
assert np.array_equal(recv, left * 1000 + np.arange(n_msgs)), recv[:8]

# 2. irecv_reduce reduces straight out of the sender's segment, "own OP msg" when own is given.
with t.stage((buf,)):   # lives in shared memory already: no copy
    acc = np.full(n_msgs, 0.5)
    both(t.irecv_reduce(acc, left, 7, add, np.empty(n_msgs)), t.isend(buf[:n_msgs], right, 7))
    own = np.full(n_msgs, 2.0)
    both(t.irecv_reduce(acc, left, 7, add, None, own=own), t.isend(buf[:n_msgs], right, 7))
assert np.array_equal(acc, 2.0 + left * 1000 + np.arange(n_msgs))

# 3. A staged ordinary array of a collective at least cma_min_bytes: peers read its sent ranges
#    out of this process (CMA) where the node allows it, else out of the staging pool. 2.4 MiB
#    halves: CMA reduces in chunks, the pool takes it in pieces as the receiver frees them.
half = 300_001
plain = np.arange(2 * half, dtype=np.float64) + rank
t.cma_min_bytes = 0
with t.stage((plain,)):
    w = plain
    r = t.irecv_reduce(w[half:], left, 8, add, None)
    s = t.isend(w[:half], right, 8)
    both(r, s)
    assert s.seg == (CMA if t.direct_reads == "cma" else VIA_MPI if half * 8 > t.pool_share else POOL), s.seg
    strided = np.zeros(2 * half)   # a receive buffer CMA cannot write in one go
    both(t.irecv(strided[::2], left, 13), t.isend(w[half:], right, 13))
    left_of_left = (left - 1) % size
    assert np.array_equal(strided[::2], np.arange(half, 2 * half) + left + np.arange(half) + left_of_left)
    assert not strided[1::2].any()
assert np.array_equal(plain[half:], np.arange(half, 2 * half) + rank + np.arange(half) + left)

# 3b. Below the CMA floor a collective goes through the pool even where CMA works, and each
#     rank decides that alone: here only even ranks lower their floor.
t.cma_min_bytes = 0 if rank % 2 == 0 else plain.nbytes + 8
small = plain[:1000]
with t.stage((plain,)):
    got = np.zeros(1000)
    s = t.isend(small, right, 14)
    both(t.irecv(got, left, 14), s)
    assert s.seg == (CMA if t.direct_reads == "cma" and rank % 2 == 0 else POOL), s.seg
assert np.array_equal(got, plain[:1000] - rank + left)
t.cma_min_bytes = 1 << 60

# 3c. A user's send (comm.send: isend_p2p) is read by CMA from cma_p2p_min_bytes, far below a
#     collective's floor: one copy instead of two, and no reduction to keep in cache. Below the
#     floor, and for a plain isend (a collective's, unstaged), it goes through the pool.
# Each rank's floor comes from its own probe of this host (cma.read_cost), which can land on either
# side of READ_FAST on a host near it: the ranks take one floor here, so that messages match.
floor = t.cma_p2p_min_bytes = max(world.allgather(t.cma_p2p_min_bytes))
assert floor < t.cma_min_bytes and t.reads_in_place(floor) == (LARGE != POOL)
assert not t.reads_in_place(floor - 1) and not t.stages(floor)
message = np.arange(floor // 8, dtype=np.float64) * (rank + 1)
got = np.zeros_like(message)
s = t.isend_p2p(message, right, 15)
both(t.irecv(got, left, 15), s)
assert s.seg == LARGE, s.seg
assert np.array_equal(got, np.arange(floor // 8) * (left + 1.0))
assert not t._staged
for send in (lambda: t.isend_p2p(message[:-1], right, 15), lambda: t.isend(message, right, 15)):
    s = send()
    got = np.zeros(s.buf.size)
    both(t.irecv(got, left, 15), s)
    assert s.seg == POOL and np.array_equal(got, np.arange(got.size) * (left + 1.0)), s.seg
# A send read by CMA whose request and array the caller dropped before the receiver came (a
# communicator closed with it unmatched): the transport holds the array until it is acknowledged,
# so the receiver never reads memory that was freed and reused.
message = np.full(floor // 8, 3.0 + rank)
held = weakref.ref(message)
t.isend_p2p(message, right, 16)
del message
gc.collect()
assert held() is not None or t.direct_reads != "cma"
world.Barrier()
got = np.zeros(floor // 8)
assert t.irecv(got, left, 16).wait(30) and np.array_equal(got, np.full(floor // 8, 3.0 + left))
barrier_progressing()   # a pipe's sender fills its cells as the receiver empties them
t.progress()   # the acknowledgement lets it go
gc.collect()
assert held() is None

# 3d. Pipes (a node without CMA): sizes that end mid-cell and span many rings' worth, sent both
#     ways at once (each receive fills this rank's own pipe while it waits), two in flight to one
#     peer received in the other order, a strided receive buffer, and a receiver emptying the
#     cells in Python (no compiled piece there) while its own sends still go by pipe.
if t._pipe_ok:
    for nbytes in (floor, floor + 12_345, 3 * floor + 7):
        message = (np.arange(nbytes) * (rank + 3) % 251).astype(np.uint8)
        got = np.zeros(nbytes, np.uint8)
        s = t.isend_p2p(message, right, 18)
        both(t.irecv(got, left, 18), s)
        assert s.seg == PIPE and np.array_equal(got, (np.arange(nbytes) * (left + 3) % 251).astype(np.uint8))
    first, second = np.full(floor // 8, 1.0 + rank), np.full(floor // 8 + 5, 2.0 + rank)
    got1, got2 = np.zeros_like(first), np.zeros_like(second)
    s1, s2 = t.isend_p2p(first, right, 19), t.isend_p2p(second, right, 20)
    assert s1.seg == s2.seg == PIPE, (s1.seg, s2.seg)
    r2 = t.irecv(got2, left, 20)
    assert r2.wait(30)
    r1 = t.irecv(got1, left, 19)
    assert r1.wait(30) and s1.wait(30) and s2.wait(30)
    assert np.all(got1 == 1.0 + left) and np.all(got2 == 2.0 + left)
    strided = np.zeros(2 * (floor // 8))
    message = np.arange(floor // 8, dtype=np.float64) + rank
    both(t.irecv(strided[::2], left, 21), t.isend_p2p(message, right, 21))
    assert np.array_equal(strided[::2], np.arange(floor // 8) + left) and not strided[1::2].any()
    compiled = pipe.enabled
    if rank % 2:
        pipe.enabled = lambda: False   # this rank's receives empty the cells in Python
    message = np.arange(floor // 4 + 3, dtype=np.float32) * (rank + 1)
    got = np.zeros_like(message)
    s = t.isend_p2p(message, right, 22)
    both(t.irecv(got, left, 22), s)
    pipe.enabled = compiled
    assert s.seg == PIPE and np.array_equal(got, np.arange(floor // 4 + 3, dtype=np.float32) * (left + 1))
    world.Barrier()
    t.progress()
    assert not t._pipes and t.pool.shares[t.local[right]].used() == 0   # every ring given back

# 4. A private array nobody staged goes through the pool; one larger than a share goes over MPI,
#    reduce included; the pool is empty again once the receives are done.
outside, into = np.full(1000, float(rank)), np.ones(1000)
s = t.isend(outside, right, 9)
both(t.irecv_reduce(into, left, 9, add, None), s)
assert s.seg == POOL and np.array_equal(into, np.full(1000, 1.0 + left))
big = t.pool_share // 8 + 3
outside, into = np.full(big, float(rank)), np.ones(big)
s = t.isend(outside, right, 9)
both(t.irecv_reduce(into, left, 9, add, None), s)
assert s.seg == VIA_MPI and np.array_equal(into, np.full(big, 1.0 + left))
world.Barrier()
t.progress()
assert t.pool.shares[t.local[right]].used() == 0

# 5. Pool full: a stream waits for its own earlier messages to be acknowledged (in order), while
#    another stream overflows over MPI instead of waiting behind it. Tags above 2**32 (context
#    ids of sub-communicators) travel whole, over the pool and over MPI.
quarter = t.pool_share // 4 // 8
tag_a, tag_b = (5 << 33) | 17, (6 << 40) | 3
parts = [np.full(quarter, float(100 * rank + k)) for k in range(12)]
sends = [t.isend(p, right, tag_a) for p in parts]
assert sum(s.num < 0 for s in sends) >= 4, "12 quarter-share messages must not all fit"
other = t.isend(np.full(10, -1.0 - rank), right, tag_b)
assert other.seg == VIA_MPI, other.seg
got_other = np.zeros(10)
assert t.irecv(got_other, left, tag_b).wait(30) and other.wait(30)
assert np.array_equal(got_other, np.full(10, -1.0 - left))
world.Barrier()   # every rank's stream is now waiting on its receiver
outs = [np.zeros(quarter) for _ in parts]
for k, o in enumerate(outs):
    assert t.irecv(o, left, tag_a).wait(30)
    assert np.all(o == 100 * left + k), (k, o[:2])
for s in sends:
    assert s.wait(30)
world.Barrier()
assert t.probe(left) is None   # nothing left over
world.Barrier()

# 6. Threads: four threads each run their own stream (pool, CMA-free) through the one transport.
errors = []


def stream(k):
    try:
        for i in range(200):
            x = np.full(257 + k, float(rank * 10_000 + k * 1000 + i))
            y = np.zeros(257 + k)
            s, r = t.isend(x, right, 1000 + k), t.irecv(y, left, 1000 + k)
            assert r.wait(30) and s.wait(30)
            assert np.all(y == left * 10_000 + k * 1000 + i), (k, i, y[:2])
    except BaseException as err:   # noqa: BLE001 (reported below)
        errors.append(err)


threads = [threading.Thread(target=stream, args=(k,)) for k in range(4)]
for th in threads:
    th.start()
for th in threads:
    th.join()
assert not errors, errors

# 7. Window regions: WINDOW_SLOTS per rank (slot 0 the job's, larger), distinct, shared.
for slot in range(WINDOW_SLOTS):
    regions = t.window_regions(slot)
    assert len(regions) == t.n and all(r.nbytes == region_bytes(JOB_CAPACITY if slot == 0 else CAPACITY) for r in regions)
    regions[t.me][100] = 1 + slot
world.Barrier()
for slot in range(WINDOW_SLOTS):
    assert t.window_regions(slot)[t.local[left]][100] == 1 + slot
assert t.window is not None   # slot 0, over the whole job

# 8. A size mismatch is an error on the receiver, not corruption, wherever the payload is: a
#    segment, the pool, MPI, or the sender's own array read by CMA (a send past cma_p2p_min_bytes).
for source in ("segment", "pool", "mpi", "cma"):
    payload = {"segment": buf[:4], "pool": np.ones(4), "mpi": np.ones(t.pool_share // 8 + 1),
               "cma": np.ones(t.cma_p2p_min_bytes // 8)}[source]
    into = np.zeros(3)
    r = t.irecv(into, left, 10)
    s = t.isend_p2p(payload, right, 10) if source == "cma" else t.isend(payload, right, 10)
    if source == "cma":
        assert s.seg == LARGE, s.seg
    try:
        r.wait(30)
        raise AssertionError(f"mismatch from the {source} not detected")
    except MismatchError as err:
        assert f"has {payload.nbytes} bytes, the receive expected 24" in str(err), err
        assert "tag" not in str(err), err   # the transport's tag carries dtype bits: comm.recv names the user's
    assert s.wait(30) and not into.any()
world.Barrier()

# 9. A receive nobody sends times out when asked to (False), and promptly.
start = time.monotonic()
assert t.irecv(np.zeros(1), left, 11).wait(0.3) is False
assert time.monotonic() - start < 10
world.Barrier()

# 10. A send read by CMA that nobody receives before close(): its array outlives the transport
#     (a peer may receive it later, out of this process), even with every reference dropped.
late = np.full(t.cma_p2p_min_bytes // 8, 1.0)
kept = weakref.ref(late)
t.isend_p2p(late, right, 17)
del late
world.Barrier()

# 11. Abort on one rank releases a peer waiting on it.
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
gc.collect()
assert kept() is not None or t.direct_reads != "cma"
print(f"rank {rank} ok")
