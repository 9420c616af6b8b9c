"""A send nobody receives and a receive nobody sends to, both async, then close() and exit (an
erroneous program, as MPI_Finalize with pending operations is): each Work raises CommError
"cancelled", every rank exits 0. On gloo a thread of ringcomm's waits in torch's Work for each,
and until round forty-one that thread, still waiting when the process ended, made torch abort
rank 0 ("terminate called without an active exception", SIGABRT) in 5 of 6 runs; close now
aborts the group under it, and (round forty-six) waits for that thread to end: one that had
said it was done but was still dropping its torch Work as the interpreter exited aborted the
process in about 1 run in 20.

    mpirun -n 2 python unreceived_at_close.py BACKEND...

Prints "unreceived-at-close ok" on rank 0; exits 1 otherwise.
"""
import sys
import threading

import numpy as np

import ringcomm
from verdict import report

problems = []
for backend in sys.argv[1:]:
    comm = ringcomm.init(backend=backend, timeout=20)
    rank = comm.rank
    works = []
    if rank == 0:
        works.append(comm.send(np.ones(1 << 20, np.float32), 1, tag=3, async_op=True))
        works.append(comm.recv(np.empty(10, np.float32), 1, tag=4, async_op=True))
    comm.all_reduce(np.ones(4))   # both ranks past the posts before either closes
    comm.close()
    # Closed means no send/recv thread left: one still dropping its torch Work when the
    # interpreter exited aborted the process (c10d.py, join_waiters).
    left = [t.name for t in threading.enumerate() if t.name.endswith("-p2p")]
    if left:
        problems.append(f"{backend}: threads still running after close: {left}")
    for work in works:
        try:
            work.wait()
            problems.append(f"{backend}: a Work nobody matched returned")
        except ringcomm.CommError as err:
            if "cancelled" not in str(err):
                problems.append(f"{backend}: {err!r}")
report(problems, "unreceived-at-close ok")
