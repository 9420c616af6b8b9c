"""Ranks that disagree about a collective, at every size: each rank reports what it raised and
how long it took, one line per case, in OUT_DIR/rank<R>.txt.

    mpirun -n N python shm_mismatch.py OUT_DIR SIZE [SIZE ...]      (SIZE in bytes, like 64M)

Rank 1 is the odd one. Kinds: "collective" (it broadcasts while the others all-reduce), "dtype"
(int32 instead of float32, the same bytes), "op" (it takes the maximum where the others sum:
each rank would return another result), "count+1" (one element more) and "count+1024" (1024
more: the same count mod 32, which is all a message tag carries). Each case runs on a fresh
communicator (the failed one refuses further calls) after a world barrier, so every case starts
together. Line format: "case KIND SIZE: ERROR_TYPE after SECONDS s: MESSAGE".
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import ringcomm
from ringcomm.env import parse_size

out_dir, sizes = sys.argv[1], [parse_size(s) for s in sys.argv[2:]]
world = MPI.COMM_WORLD
me = world.Get_rank()
odd = me == 1
KINDS = ("collective", "dtype", "op", "count+1", "count+1024")
lines = []
for nbytes in sizes:
    for kind in KINDS:
        count = nbytes // 4 + (odd and {"count+1": 1, "count+1024": 1024}.get(kind, 0))
        x = np.ones(count, np.int32 if odd and kind == "dtype" else np.float32)
        world.Barrier()
        comm = ringcomm.init()
        comm.barrier()
        start = time.monotonic()
        try:
            if kind == "collective" and odd:
                comm.broadcast(x, root=0)
            else:
                comm.all_reduce(x, "max" if odd and kind == "op" else "sum")
            outcome = "ok: no error"
        except ringcomm.CommError as err:
            outcome = f"{type(err).__name__}: {err}"
        except Exception as err:   # the defect this job looks for: anything raw
            outcome = f"RAW {type(err).__name__}: {err}"
        took = time.monotonic() - start
        lines.append(f"case {kind} {nbytes}: {outcome.split(':')[0]} after {took:.2f} s:{outcome.partition(':')[2]}\n")
        comm.close()
        comm.transport.close()
with open(os.path.join(out_dir, f"rank{me}.txt"), "w") as f:
    f.writelines(lines)
world.Barrier()
print(f"rank {me} done", flush=True)
