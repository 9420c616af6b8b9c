"""A rank that a split leaves alone, under RINGCOMM_ALGO or algorithm= forcing a window
algorithm its one-rank communicator has no window for: a communicator of one rank moves nothing,
so every collective runs there with every algorithm (it once raised UsageError on the lone rank
only, while its peers went on). Prints "forced-alone ok" on rank 0.

    RINGCOMM_ALGO=one_shot mpirun -n 3 python forced_alone.py
"""
import numpy as np

import ringcomm
from ringcomm import algorithms

comm = ringcomm.init()
rank = comm.rank
half = comm.split(rank % 2)          # 3 ranks: {0, 2} and {1} alone
alone = comm.split(rank)             # everyone alone
assert alone.size == 1
total = half.all_reduce(np.full(5, rank + 1.0, np.float32))
assert total.tolist() == [float(sum(r + 1 for r in range(comm.size) if r % 2 == rank % 2))] * 5, total

x = np.arange(6, dtype=np.float32) + rank
for name in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
             "scatter", "barrier"):
    for algorithm in algorithms.names(name):
        out = np.zeros(6, np.float32)
        if name == "all_reduce":
            alone.all_reduce(x, out=out, algorithm=algorithm)
        elif name == "broadcast":
            out[:] = x
            alone.broadcast(out, algorithm=algorithm)
        elif name == "reduce":
            alone.reduce(x, out=out, algorithm=algorithm)
        elif name == "barrier":
            alone.barrier(algorithm=algorithm)
            out[:] = x
        else:
            getattr(alone, name)(out, x, algorithm=algorithm)
        assert out.tolist() == x.tolist(), (name, algorithm, out)
comm.barrier()
if rank == 0:
    print("forced-alone ok", flush=True)
