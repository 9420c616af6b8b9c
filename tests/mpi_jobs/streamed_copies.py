"""Collectives whose copies are streamed (core/_copy.h), in separate processes: the streaming
length is set to its least (1 MiB) on every rank, so the own-block copies of the direct
all_gather, all_to_all, gather and scatter and the copies out of ringcomm.empty blocks of a few
MiB all go around the cache, and each result must be exact, every iteration, on every rank: a
streamed store that a peer could see after the flag that follows it would show as stale bytes
of the previous iteration.

    mpirun -n 3 python streamed_copies.py

Prints "rank R ok CHECKS streamed from N" per rank; an assertion names the first wrong case.
"""
import numpy as np

import ringcomm
from ringcomm.core import copying

streamed = copying.stream_from(0)
comm = ringcomm.init()
rank, n = comm.rank, comm.size
count = (3 << 20) // 4 + 7   # per rank: 3 MiB and a tail, above the streaming length
checks = 0


def part(r, it, salt=0):
    return ((np.arange(count, dtype=np.int64) * 7 + r * 1009 + it * 131 + salt) % 65521).astype(np.float32)


everyone = lambda it: np.concatenate([part(r, it) for r in range(n)])
out = np.empty(count * n, np.float32)
mapped_in, mapped_out = ringcomm.empty(count, np.float32), ringcomm.empty(count * n, np.float32)
for it in range(4):
    x = part(rank, it)
    comm.all_gather(out, x, algorithm="direct")
    assert np.array_equal(out, everyone(it)), f"all_gather, iteration {it}"
    mapped_in[:] = x
    comm.all_gather(mapped_out, mapped_in, algorithm="direct")
    assert np.array_equal(np.asarray(mapped_out), everyone(it)), f"all_gather of ringcomm.empty blocks, iteration {it}"
    src = np.concatenate([part(rank, it, salt=j) for j in range(n)])
    comm.all_to_all(out, src, algorithm="direct")
    assert np.array_equal(out, np.concatenate([part(j, it, salt=rank) for j in range(n)])), f"all_to_all, iteration {it}"
    got = np.empty(count * n, np.float32) if rank == 0 else None
    comm.gather(got, x, 0, algorithm="direct")
    assert rank != 0 or np.array_equal(got, everyone(it)), f"gather, iteration {it}"
    mine = np.empty(count, np.float32)
    comm.scatter(mine, everyone(it) if rank == 1 % n else None, 1 % n, algorithm="direct")
    assert np.array_equal(mine, x), f"scatter, iteration {it}"
    checks += 5
comm.close()
print(f"rank {rank} ok {checks} streamed from {streamed}", flush=True)
