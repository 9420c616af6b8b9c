"""A group made again of the same ranks under the same name (torch re-creating a destroyed group,
``split_group`` reusing a name), five times in a row, each running a 1 KiB all_reduce (the
window's one-shot road) and closing; rank 1 is slow to open each group's window, as a rank
descheduled on a busy machine is. Every sum must be exact on every rank. Before round
forty-three every group but the first reused its predecessor's context id, whose closed window
regions still said "closed": rank 0 raised PeerAbortedError "rank 1 ... has closed it" while
rank 1's call returned the sum.

    mpirun -n 2 python regroup.py

Rank 0 prints "regroup ok"; every rank exits 1 otherwise.
"""
import time

import numpy as np

import ringcomm
from ringcomm.transport.shm import transport as shm
from verdict import report

opened = shm.ShmTransport.window_of


def slow_window_of(self, members, slot, context):
    if self.rank == 1:
        time.sleep(0.2)   # between the group's agreement and its window: descheduled
    return opened(self, members, slot, context)


shm.ShmTransport.window_of = slow_window_of
comm = ringcomm.init(backend="ringcomm", timeout=30)
problems = []
for i in range(5):
    group = comm._group([0, 1], "again")
    x = np.full(256, float(i + 1) * (comm.rank + 1), np.float32)
    try:
        group.all_reduce(x)
        if not (x == 3.0 * (i + 1)).all():
            problems.append(f"rank {comm.rank}, group {i}: sum {x[0]}, expected {3.0 * (i + 1)}")
    except ringcomm.CommError as err:
        problems.append(f"rank {comm.rank}, group {i}: {err!r}")
    group.close()
    comm.barrier()
comm.close()
report(problems, "regroup ok")
