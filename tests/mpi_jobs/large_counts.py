"""Calls of 2**31 elements and more (int8: 2 GiB and 4 KiB) on the default road: a count that
large overflowed the int64 window stamp and stopped every window algorithm at its first round.

    mpirun -n 2 python large_counts.py
"""
import numpy as np

import ringcomm

comm = ringcomm.init()
rank, n = comm.rank, comm.size
count = (1 << 31) + 4099
x = np.ones(count, np.int8)
x[-1] = rank + 3
comm.all_reduce(x)
ran = [comm.recorder.entries[-1].algorithm]
assert x[0] == n and x[-1] == sum(r + 3 for r in range(n)) and np.count_nonzero(x != n) == 1, x[[0, -1]]
x[...] = 7 if rank == 0 else 0
x[count // 2] = 9 if rank == 0 else 0
comm.broadcast(x, 0)
ran.append(comm.recorder.entries[-1].algorithm)
assert x[count // 2] == 9 and np.count_nonzero(x != 7) == 1
print(f"rank {rank} ok: {' '.join(ran)}", flush=True)
