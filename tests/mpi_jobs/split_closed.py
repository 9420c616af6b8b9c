"""Rank 0 closes a split of both ranks; rank 1 then calls on it: a 1 KiB all_reduce (``window``:
the node window's one-shot road), a 1 MiB ring all_reduce (``ring``) or a recv from rank 0
(``recv``). Rank 1's call must raise naming rank 0's close within seconds, not wait out the
communicator's timeout (30 s here): on backend ringcomm PeerAbortedError, which before round
forty-two it did not (a closed window region read like one never opened) and before round
forty-three only on the window's road; on the reference backends MismatchError from their close
exchange (all_reduce only: their recv waits for its timeout, as MPI's and gloo's own do). Both
worlds then close cleanly.

    mpirun -n 2 python split_closed.py [ringcomm|mpi|gloo] [window|ring|recv]

Rank 0 prints "split-closed ok: <rank 1's error>"; every rank exits 1 otherwise.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import ringcomm
from verdict import report

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "ringcomm"
CALL = sys.argv[2] if len(sys.argv) > 2 else "window"
EXPECTED = {"ringcomm": (ringcomm.PeerAbortedError, "rank 0 of this communicator (rank 0 of the job) has closed it (close())")}
ERROR, TEXT = EXPECTED.get(BACKEND, (ringcomm.MismatchError, "ranks [0] have close(); ranks [1] have all_reduce"))
comm = ringcomm.init(backend=BACKEND, timeout=30)
sub = comm.split(0)
problems = []
got = ""
if comm.rank == 0:
    sub.close()
else:
    time.sleep(0.3)
    start = time.monotonic()
    try:
        if CALL == "window":
            sub.all_reduce(np.ones(256, np.float32))
        elif CALL == "ring":
            sub.all_reduce(np.ones(1 << 18, np.float32), algorithm="ring")
        else:
            sub.recv(np.ones(256, np.float32), 0)
        problems.append(f"rank 1's {CALL} call on the closed split returned")
    except ERROR as err:
        got = str(err)
        if TEXT not in got:
            problems.append(f"rank 1 raised {err!r}")
    except BaseException as err:
        problems.append(f"rank 1 raised {err!r}")
    if time.monotonic() - start > 5:
        problems.append(f"rank 1 took {time.monotonic() - start:.1f} s to learn of the close")
    sub.close()
got = MPI.COMM_WORLD.bcast(got, root=1)
comm.close()
report(problems, f"split-closed ok: {got}")
