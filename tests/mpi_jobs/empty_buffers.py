"""Collectives on ``ringcomm.empty`` buffers, which the node's ranks map into each other
(memory.py): every direct algorithm reads and writes them with plain loads and stores instead of
CMA. Results are checked exactly against the same calls on ordinary arrays, bitwise across
ranks, with every rank's buffers from ``empty``, with only some ranks' (the others reached by
CMA), and out of place; and the blocks are shown to be mapped, so the new road is the one that ran.

    mpirun -n 3 python empty_buffers.py      (prints "empty-buffers ok" on rank 0)
"""
import numpy as np
import torch

import ringcomm

comm = ringcomm.init()
rank, n = comm.rank, comm.size
rng = np.random.default_rng(rank)


def same_everywhere(a) -> None:
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    every = np.empty(flat.size * n, np.uint8)
    comm.all_gather(every, flat)
    assert all(np.array_equal(every[:flat.size], every[r * flat.size:(r + 1) * flat.size]) for r in range(n)), rank


def shared_here(count: int) -> bool:
    """Whether this rank takes its buffers from ``empty`` in the mixed case (rank 0 does not)."""
    return rank != 0 or count % 2 == 0


for count in ((1 << 20) + 3, 3 << 20, 65536 * n):
    for mixed in (False, True):
        use_empty = shared_here(count) if mixed else True
        make = (lambda c, d: ringcomm.empty(c, d)) if use_empty else (lambda c, d: np.empty(c, d))
        for op in ("sum", "max", "prod"):
            base = rng.standard_normal(count).astype(np.float32)
            for algorithm in ("direct", None):
                x, plain = make(count, np.float32), base.copy()
                x[:] = base
                comm.all_reduce(x, op, algorithm=algorithm)
                comm.all_reduce(plain, op, algorithm=algorithm)   # ordinary arrays: CMA
                assert np.array_equal(x.view(np.uint32), plain.view(np.uint32)), (rank, count, op, algorithm)
                same_everywhere(x)
                y, out = make(count, np.float32), make(count, np.float32)
                y[:] = base
                comm.all_reduce(y, op, out=out, algorithm=algorithm)
                assert np.array_equal(out.view(np.uint32), plain.view(np.uint32)) and np.array_equal(y, base)
        # The other direct collectives: gather into, scatter out of, broadcast over blocks.
        whole = make(count * n, np.float64)
        comm.all_gather(whole, np.full(count, rank, np.float64), algorithm="direct")
        assert np.array_equal(whole, np.repeat(np.arange(n, dtype=np.float64), count)), rank
        parts = make(count * n, np.int64)
        parts[:] = np.arange(count * n) % 977 + rank
        mine = make(count, np.int64)
        comm.reduce_scatter(mine, parts, algorithm="direct")
        assert np.array_equal(mine, n * (np.arange(count * n)[rank * count:(rank + 1) * count] % 977) + n * (n - 1) // 2)
        b = make(count, np.int32)
        b[:] = rank
        comm.broadcast(b, root=n - 1, algorithm="direct")
        assert np.all(b == n - 1), rank
        # all_to_all, gather and scatter: a peer's block is mapped and copied, not read by CMA
        # (the compiled calls hand such calls back to the Python road, which maps it).
        x = make(count * n, np.int32)
        x[:] = np.arange(count * n) % 1013 + 7 * rank
        got = make(count * n, np.int32)
        comm.all_to_all(got, x, algorithm="direct")
        expected = np.concatenate([(np.arange(count * n) % 1013 + 7 * j)[rank * count:(rank + 1) * count]
                                   for j in range(n)])
        assert np.array_equal(got, expected), rank
        whole = make(count * n, np.float32) if rank == 0 else None
        comm.gather(whole, np.full(count, rank + 0.25, np.float32), root=0, algorithm="direct")
        if rank == 0:
            assert np.array_equal(whole, np.repeat(np.arange(n, dtype=np.float32) + 0.25, count))
        part = make(count, np.int64)
        comm.scatter(part, (np.arange(count * n) * 3).astype(np.int64) if rank == n - 1 else None, root=n - 1,
                     algorithm="direct")
        assert np.array_equal(part, np.arange(rank * count, (rank + 1) * count) * 3), rank

# Torch tensors from empty: DDP's kind of buffer.
t = ringcomm.empty((1 << 20) + 5, torch.float32)
t.fill_(rank + 0.5)
comm.all_reduce(t, algorithm="direct")
assert torch.all(t == sum(r + 0.5 for r in range(n))), rank

# Sends of blocks (comm.send): the receiver maps the sender's block and copies (no CMA), from
# any offset in it, into blocks and ordinary arrays; on 3 ranks rank 1 sends ordinary arrays (its
# receiver reads them by CMA); a receive of another length (MismatchError, nothing written).
node = comm.transport.node
right, left = (rank + 1) % n, (rank - 1) % n


def sends_blocks(r: int) -> bool:
    return n == 2 or r != 1


floor = np.array([node.cma_p2p_min_bytes], np.int64)   # each rank's own (its probe of the host: cma.py)
comm.all_reduce(floor, "max")
for count in (int(floor[0]) // 4, (1 << 20) + 7, 3 << 20):
    for offset in (0, 5):
        for target in ("block", "array"):
            make = ringcomm.empty if sends_blocks(rank) else np.empty
            message = make(count + offset, np.float32)[offset:]
            message[:] = np.arange(count, dtype=np.float32) * (rank + 1) + offset
            got = ringcomm.empty(count, np.float32) if target == "block" else np.empty(count, np.float32)
            got[...] = -1
            work = comm.send(message, right, tag=3, async_op=True)
            comm.recv(got, left, tag=3)
            work.wait()
            assert np.array_equal(got, np.arange(count, dtype=np.float32) * (left + 1) + offset), (rank, count, target)
mapped = node._blocks._sent   # (node rank, descriptor) -> mapping: the blocks this rank copied from
assert all(view is not None for view in mapped.values()), (rank, mapped)
assert sorted({node.ranks[r] for r, _ in mapped}) == ([left] if sends_blocks(left) else []), (rank, mapped)

# The blocks were mapped, so the plain-copy road ran: every peer's block is known to this rank's window.
window = comm.transport.window
assert window is not None and window.memory is not None, rank
mapped_peers = [r for r in range(n) if window._mapped[r]]
assert sorted(mapped_peers) == [r for r in range(n) if r != rank], (rank, mapped_peers)
# Last, on a dup (a failed receive leaves its communicator unusable): a block's message of
# another length than the receive's is refused, and nothing is written.
dup = comm.dup()
work = dup.send(ringcomm.empty(3 << 20, np.float32), right, tag=4, async_op=True)
short = ringcomm.empty((3 << 20) - 1, np.float32)
short[...] = 9
try:
    dup.recv(short, left, tag=4)
    raise AssertionError("a message of another length was received")
except ringcomm.MismatchError as err:
    assert "bytes" in str(err) and np.all(short == 9), (rank, err)
comm.barrier()
dup.close()
if rank == 0:
    print("empty-buffers ok", flush=True)
