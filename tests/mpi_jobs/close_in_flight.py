"""close() from one thread while another thread's collective is in flight on the communicator
(an erroneous program, which the library must still answer in bounded time and without tearing
the transport down under a running call).

Each rank's worker thread loops over 4 MiB all_reduces; rank 0's main thread closes the world
0.3 s in, rank 1's 0.6 s in. close() waits for the call in flight (before round forty-one it
tore the shm transport down under it: rank 1's worker, still waiting for rank 0 when rank 1
closed, raised a bare IndexError from the emptied peer headers), so rank 0's worker gets "the
communicator is closed" at its next call. Rank 1's worker must raise well within the timeout,
naming the call and rank 0's close: on backend ringcomm a PeerAbortedError (rank 0's shm
transport marks itself closed, which a wait for that peer reads; before, it waited out the
timeout), on mpi and gloo a MismatchError (rank 0's close exchange pairs with the call's
pre-flight). Every sum before that is checked.

    mpirun -n 2 python close_in_flight.py BACKEND...

Prints "close-in-flight ok" on rank 0; exits 1 otherwise.
"""
import re
import sys
import threading
import time

import numpy as np

import ringcomm
from verdict import report

TIMEOUT = 30
EXPECTED = {"ringcomm": (ringcomm.PeerAbortedError, r"all_reduce #\d+ on rank 1: rank 0 has closed its communicator"),
            "mpi": (ringcomm.MismatchError, r"all_reduce #\d+ on rank 1: .*ranks \[0\] have close\(\)"),
            "gloo": (ringcomm.MismatchError, r"all_reduce #\d+ on rank 1: .*ranks \[0\] have close\(\)")}
problems = []
for backend in sys.argv[1:]:
    comm = ringcomm.init(backend=backend, timeout=TIMEOUT)
    rank = comm.rank
    outcome = {}

    def worker():
        x = np.empty(1 << 20, np.float32)
        try:
            for i in range(100000):
                x[:] = i % 7 + rank
                comm.all_reduce(x)
                if not (x == 2 * (i % 7) + 1).all():
                    outcome["wrong"] = f"call {i}: {x[:4]}"
            outcome["error"] = None
        except Exception as err:   # what the test is about
            outcome["error"], outcome["at"] = err, time.monotonic()
    thread = threading.Thread(target=worker)
    begun = time.monotonic()
    thread.start()
    if rank == 0:
        time.sleep(0.3)
        comm.close()
        thread.join(TIMEOUT)
        err = outcome.get("error")
        if not (isinstance(err, ringcomm.CommError) and "the communicator is closed" in str(err)):
            problems.append(f"{backend}: rank 0's worker: {err!r}")
    else:   # closes too, while its worker may still wait for rank 0
        time.sleep(0.6)
        start = time.monotonic()
        comm.close()
        thread.join(TIMEOUT)
        err, (kind, pattern) = outcome.get("error"), EXPECTED[backend]
        if thread.is_alive() or not isinstance(err, kind) or not re.search(pattern, str(err)):
            problems.append(f"{backend}: rank 1's worker: {err!r}")
        if time.monotonic() - start > 5:
            problems.append(f"{backend}: rank 1's close took {time.monotonic() - start:.1f} s")
    if "wrong" in outcome:
        problems.append(f"{backend}: rank {rank}: wrong sum at {outcome['wrong']}")
    # Rank 0 closes 0.3 s in: rank 1's worker must fail soon after, not at the timeout.
    if rank == 1 and "at" in outcome and outcome["at"] - begun > 10:
        problems.append(f"{backend}: rank 1's worker failed {outcome['at'] - begun:.1f} s in (timeout {TIMEOUT} s)")
report(problems, "close-in-flight ok")
