"""Every collective and algorithm over the transport the factory builds, checked on every rank.

    mpirun -n N python shm_collectives.py EXPECT [RANKS_PER_NODE]

With RANKS_PER_NODE, rank r pretends to be on node r // RANKS_PER_NODE (RINGCOMM_NODE_ID).

EXPECT is "shm" (every peer over shared memory), "mpi" (every peer over MPI) or "nodes" (peers
on this rank's RINGCOMM_NODE_ID over shm, the rest over MPI). Results are compared against a
float64 reference and, bitwise, across ranks. Prints "rank R direct_reads='...'" (how the node's
shared memory reads private arrays, see shm.py) and "rank R ok <routes>" at the end.
"""
import shm_guard  # noqa: F401  (first: a failure on one rank ends the job)
import os
import sys

import numpy as np
import torch

import ringcomm
from ringcomm.transport import factory

from mpi4py import MPI  # noqa: E402

expect = sys.argv[1]
if len(sys.argv) > 2:
    os.environ["RINGCOMM_NODE_ID"] = f"pretend-{MPI.COMM_WORLD.Get_rank() // int(sys.argv[2])}"
comm = ringcomm.init()
rank, size = comm.rank, comm.size
routes = factory.describe(comm.transport)
topo = comm.topology
for peer, how in routes.items():
    want = {"shm": "shm", "mpi": "mpi"}.get(expect) or ("shm" if topo.same_node(rank, peer) else "mpi")
    assert how == want, f"rank {rank}: peer {peer} goes over {how}, expected {want} ({routes})"

COUNTS = [1, 7, size * 3 + 1, 300_007]   # odd sizes; the last spans two 1 MiB segments
DTYPES = [np.float32, np.int32, np.float16]


def inputs(count, dtype, r):
    rng = np.random.default_rng(1000 * r + count)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(count).astype(dtype)
    return rng.integers(-1000, 1000, count).astype(dtype)


def same_everywhere(x, what):
    gathered = comm_mpi.allgather(x.tobytes())
    assert all(g == gathered[0] for g in gathered), f"{what}: results differ across ranks"


def close(got, want, dtype, what):
    tol = {np.float16: 2e-2, np.float32: 1e-4}.get(dtype, 1e-10)
    err = np.max(np.abs(got.astype(np.float64) - want)) if got.size else 0.0
    scale = max(1.0, np.max(np.abs(want))) if want.size else 1.0
    assert err <= tol * scale * size, f"{what}: max error {err} (scale {scale})"


comm_mpi = MPI.COMM_WORLD
checked = 0
for count in COUNTS:
    for dtype in DTYPES:
        all_in = [inputs(count, dtype, r) for r in range(size)]
        ref_sum = np.sum([a.astype(np.float64) for a in all_in], axis=0)
        for algorithm in ringcomm.algorithms.names("all_reduce", comm.transport):
            for op in ("sum", "max"):
                x = all_in[rank].copy()
                comm.all_reduce(x, op=op, algorithm=algorithm)
                want = ref_sum if op == "sum" else np.max([a.astype(np.float64) for a in all_in], axis=0)
                what = f"all_reduce {algorithm} {op} {count} x {np.dtype(dtype).name}"
                close(x, want, dtype, what)
                same_everywhere(x, what)
                checked += 1
        for algorithm in ringcomm.algorithms.names("broadcast", comm.transport):
            root = (count + 1) % size
            x = all_in[rank].copy()
            comm.broadcast(x, root=root, algorithm=algorithm)
            assert x.tobytes() == all_in[root].tobytes(), f"broadcast {algorithm} {count}"
            checked += 1
        root = count % size
        x = all_in[rank].copy()
        comm.reduce(x, root=root)
        if rank == root:
            close(x, ref_sum, dtype, f"reduce {count}")
        else:
            assert x.tobytes() == all_in[rank].tobytes(), "reduce changed a non-root input"
        out = np.empty(count * size, dtype)
        comm.all_gather(out, all_in[rank])
        assert out.tobytes() == np.concatenate(all_in).tobytes(), f"all_gather {count}"
        full = [inputs(count * size, dtype, r + 7) for r in range(size)]
        out = np.empty(count, dtype)
        comm.reduce_scatter(out, full[rank].copy())
        ref_rs = np.sum([f.astype(np.float64) for f in full], axis=0)[rank * count:(rank + 1) * count]
        close(out, ref_rs, dtype, f"reduce_scatter {count}")
        checked += 4

# torch tensors, bf16 included, and DDP-style buffers allocated inside the shared segment
t = torch.full((12345,), float(rank + 1), dtype=torch.bfloat16)
comm.all_reduce(t)
assert (t.float() == size * (size + 1) / 2).all(), t[:4]
if hasattr(comm.transport, "allocate"):
    bucket = comm.transport.allocate(4 * 300_000, np.float32)
    bucket[...] = rank + 1
    comm.all_reduce(bucket, op="avg")
    assert np.all(bucket == (size + 1) / 2), bucket[:4]
    checked += 1
# several async collectives in flight at once, over the same segments, completing in issue order
xs = [np.full(70_001 * (k + 1), float(rank + k), np.float32) for k in range(4)]
works = [comm.all_reduce(x, async_op=True) for x in xs]
works.append(comm.broadcast(xs[0], root=size - 1, async_op=True))
for w in works:
    w.wait(60)
for k, x in enumerate(xs[1:], 1):
    assert np.all(x == sum(r + k for r in range(size))), (k, x[:4])
assert np.all(xs[0] == sum(range(size))), xs[0][:4]
checked += len(works)
comm.barrier()
node = getattr(comm.transport, "node", None)
if node is not None:
    print(f"rank {rank} direct_reads={node.direct_reads!r}", flush=True)
comm.transport.close()
print(f"rank {rank} ok {checked} {sorted(routes.values())}")
